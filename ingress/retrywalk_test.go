package ingress

import (
	"net/http"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// deadPrefixScheduler is the real prefix-aware scheduler over an index in
// which the dead engines hold every request's prefix, as engines that
// served one prefix group and were killed together do: the ranking puts
// them first. after runs once the ranking is made (nil: nothing).
type deadPrefixScheduler struct {
	Scheduler
	idx   *index.Index
	dead  []string
	after func(d *scheduler.Decision)
}

func (p *deadPrefixScheduler) Schedule(req *scheduler.Request, engines []scheduler.Engine, d *scheduler.Decision) error {
	for _, id := range p.dead {
		p.idx.AddSpeculative(id, req.Keys, time.Now())
	}
	err := p.Scheduler.Schedule(req, engines, d)
	if err == nil && p.after != nil {
		p.after(d)
	}
	return err
}

// deadPrefixIngress starts an ingress over three engines whose listeners
// are closed (connection refused) and two live ones, the dead ones holding
// the request's prefix.
func deadPrefixIngress(t *testing.T, after func(s *Server, d *scheduler.Decision)) (*Server, []string) {
	t.Helper()
	var engines []StaticEngine
	var dead []string
	for _, id := range []string{"d1", "d2", "d3"} {
		fe := startFaultEngine(t, faultOK)
		fe.close() // nothing listens there from now on
		engines = append(engines, StaticEngine{ID: id, Model: "m", URL: fe.url()})
		dead = append(dead, id)
	}
	for _, id := range []string{"g1", "g2"} {
		engines = append(engines, StaticEngine{ID: id, Model: "m", URL: startFaultEngine(t, faultOK).url()})
	}
	cfg := testConfig(engines...)
	cfg.MaxAttempts = 3
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	sch, err := scheduler.New(nil, policies.NewDynamo(), idx, scheduler.Options{})
	if err != nil {
		t.Fatal(err)
	}
	ps := &deadPrefixScheduler{Scheduler: sch, idx: idx, dead: dead}
	s := startIngress(t, cfg, Deps{Scheduler: ps, Index: idx})
	if after != nil {
		ps.after = func(d *scheduler.Decision) { after(s, d) }
	}
	return s, dead
}

// ranksFirst fails unless the dead engines head the ranking.
func ranksFirst(t *testing.T, d *scheduler.Decision, dead []string) {
	t.Helper()
	for i := range dead {
		if i >= len(d.Ranked) || !slices.Contains(dead, d.Ranked[i].Engine) {
			t.Errorf("ranking %v does not start with the dead engines %v", d.Ranked, dead)
			return
		}
	}
}

// TestRefusedConnectionsDoNotUseUpTheAttempts: three engines that share
// the request's prefix were killed together and rank first; each refuses
// the connection. Nothing was sent to them, so they do not use up the
// three attempts: the request is served by a live engine, each dead one
// dialed once (tester h-scale: 503 "connection refused" with 48 healthy
// engines left, every attempt spent on dead ones).
func TestRefusedConnectionsDoNotUseUpTheAttempts(t *testing.T) {
	var ranked []scheduler.EngineScore
	s, dead := deadPrefixIngress(t, func(s *Server, d *scheduler.Decision) {
		ranked = append(ranked[:0], d.Ranked...)
	})
	st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenPrompt(1))
	ranksFirst(t, &scheduler.Decision{Ranked: ranked}, dead)
	if st != 200 || !slices.Contains([]string{"g1", "g2"}, hdr.Get("X-Kvmesh-Engine")) {
		t.Fatalf("%d via %q: %s", st, hdr.Get("X-Kvmesh-Engine"), body)
	}
	if n := val(s.m.attempts.WithLabelValues("connect_error")); n != 3 {
		t.Fatalf("%v connect errors, want 3: each dead engine dialed once", n)
	}
}

// TestRetrySkipsEnginesEjectedSinceTheRanking: the dead engines that rank
// first are ejected after the request was ranked (other requests' connect
// errors, as when a prefix group's engines die under load); the request
// goes to a live engine without dialing any of them.
func TestRetrySkipsEnginesEjectedSinceTheRanking(t *testing.T) {
	var ranked []scheduler.EngineScore
	s, dead := deadPrefixIngress(t, func(s *Server, d *scheduler.Decision) {
		ranked = append(ranked[:0], d.Ranked...)
		for _, id := range []string{"d1", "d2", "d3"} {
			s.health.observe(&upstream{id: id, url: "http://127.0.0.1:1"}, "connect_error") // another request's failure
		}
	})
	st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenPrompt(2))
	ranksFirst(t, &scheduler.Decision{Ranked: ranked}, dead)
	if st != 200 || !slices.Contains([]string{"g1", "g2"}, hdr.Get("X-Kvmesh-Engine")) {
		t.Fatalf("%d via %q: %s", st, hdr.Get("X-Kvmesh-Engine"), body)
	}
	if n := val(s.m.attempts.WithLabelValues("connect_error")); n != 0 {
		t.Fatalf("%v connect errors, want 0: the engines ejected since the ranking were dialed", n)
	}
}
