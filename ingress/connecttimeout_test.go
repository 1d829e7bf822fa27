package ingress

import (
	"net/http"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// A dial that times out is not by itself proof that the engine is dead: the
// ingress's own overload (thousands of dials at once) times dials out too.
// Where the stall watch sees a hanging dial (ConnectTimeout longer than
// StallAfter and the watch's tick) it asks the engine (probes) before
// ejecting, so a connect timeout is retried elsewhere and counted as
// connect_timeout but ejects nothing. Where it cannot (the watch off, or
// dials that give up before the watch looks), nothing else would ever eject
// a blackholed engine, and a connect timeout ejects as before. A nanosecond
// ConnectTimeout makes every dial time out at once, deterministically: no
// watch sees such a dial, whatever StallAfter.
func TestConnectTimeoutEjectsUnlessTheWatchSeesTheDial(t *testing.T) {
	for _, c := range []struct {
		name       string
		stallAfter time.Duration
	}{
		{"stall watch on, dials shorter than stallAfter", time.Hour},
		{"stall watch off", 0},
	} {
		t.Run(c.name, func(t *testing.T) {
			fe := startFaultEngine(t, faultOK)
			cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
			cfg.ConnectTimeout = time.Nanosecond
			cfg.Health.StallAfter = c.stallAfter
			s := startIngress(t, cfg, Deps{})
			st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
			if st == 200 {
				t.Fatalf("served with a 1 ns connect timeout: %s", body)
			}
			if s.health.allowed("e1") {
				t.Errorf("not ejected after a connect timeout the stall watch could not see (status %d %s)", st, body)
			}
			if n := val(s.m.attempts.WithLabelValues("connect_timeout")); n < 1 {
				t.Errorf("attempts{result=connect_timeout} = %v", n)
			}
		})
	}
}

// Where the watch sees dials, connect timeouts alone eject nothing, however
// many in a row (a burst times out thousands at once); a refused connection
// still ejects at once.
func TestConnectTimeoutLeftToTheWatchThatSeesTheDial(t *testing.T) {
	cfg := DefaultConfig()
	if !cfg.watchSeesDials() {
		t.Fatalf("defaults (connectTimeout %v, stallAfter %v, ejectionTime %v): the watch does not see a dial",
			cfg.ConnectTimeout, cfg.Health.StallAfter, cfg.Health.EjectionTime)
	}
	short := cfg
	short.ConnectTimeout = cfg.Health.StallAfter
	if short.watchSeesDials() {
		t.Errorf("connectTimeout %v = stallAfter: the watch cannot see a dial that gives up first", short.ConnectTimeout)
	}
	off := cfg
	off.Health.StallAfter = 0
	if off.watchSeesDials() {
		t.Error("the watch off sees dials")
	}
	e := newEjector(cfg.Health, prometheus.NewRegistry(), "i")
	e.dialsWatched = cfg.watchSeesDials()
	up := &upstream{id: "e1", url: "http://127.0.0.1:1"}
	for range 2 * cfg.Health.ConsecutiveFailures {
		e.observe(up, "connect_timeout")
	}
	if !e.allowed("e1") {
		t.Fatal("ejected by connect timeouts the stall watch sees")
	}
	e.observe(up, "connect_error")
	if e.allowed("e1") {
		t.Fatal("a refused connection did not eject")
	}
}
