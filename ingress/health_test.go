package ingress

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"net/http/httptest"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// A dead engine is ejected on its first failed attempt: no later request is
// sent to it (so no client waits on it again), every request still succeeds
// on the other engine, and once the engine is back on the same address the
// probe returns it to routing without a client request paying for it.
func TestEjectedEngineGetsNoRequestsAndReturns(t *testing.T) {
	sims := startSims(t, 2, "m")
	victim := sims[0]
	addr := victim.HTTPAddr()
	cfg := testConfig(simEngines(sims, "m")...)
	cfg.Scheduler.Policy = "round-robin"
	var logs testutil.SyncBuffer
	s := startIngress(t, cfg, Deps{Logger: slog.New(slog.NewTextHandler(&logs, nil))})
	url := "http://" + s.Addr() + "/v1/completions"
	body := func(i int) string { return `{"model":"m","prompt":[` + strconv.Itoa(i+1) + `,2,3,4],"max_tokens":2}` }

	for i := 0; i < 4; i++ { // both serve while healthy
		if st, _, b := post(t, http.DefaultClient, url, body(i)); st != 200 {
			t.Fatalf("healthy request %d: %d %s", i, st, b)
		}
	}
	if victim.Load(0).Finished == 0 {
		t.Fatal("round-robin never used sim0")
	}
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	failedBefore := failedAttempts(s)
	for i := 0; i < 20; i++ {
		st, hdr, b := post(t, http.DefaultClient, url, body(100+i))
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "sim1" {
			t.Fatalf("request %d with sim0 dead: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	if n := failedAttempts(s) - failedBefore; n != 1 {
		t.Fatalf("%v failed attempts on the dead engine, want exactly 1 (then ejected)", n)
	}
	if ej := s.health.ejected(); !slices.Equal(ej, []string{"sim0"}) {
		t.Fatalf("ejected %v, want [sim0]", ej)
	}

	// Back on the same address: the probe (not a request) restores it.
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	back, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 200, HTTPAddr: addr, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { back.Close() })
	testutil.WaitFor(t, 20*time.Second, "the probe to restore sim0", func() bool { return len(s.health.ejected()) == 0 })
	for i := 0; i < 4; i++ {
		if st, _, b := post(t, http.DefaultClient, url, body(200+i)); st != 200 {
			t.Fatalf("request %d after recovery: %d %s", i, st, b)
		}
	}
	if back.Load(0).Finished == 0 {
		t.Fatal("the recovered engine got no requests")
	}
	if n := failedAttempts(s) - failedBefore; n != 1 {
		t.Fatalf("%v failed attempts in all, want 1", n)
	}
	// Each transition is logged once, naming the engine and why.
	out := logs.String()
	if strings.Count(out, "engine ejected") != 1 || !strings.Contains(out, `level=WARN msg="engine ejected from routing" component=ingress ingress=`) ||
		!strings.Contains(out, "engine=sim0 reason=connect_error") ||
		strings.Count(out, "engine restored") != 1 || !strings.Contains(out, "engine=sim0 ejected_for=") {
		t.Fatalf("the ejection and the restore, once each:\n%s", out)
	}
}

// TestProbeLoopTinyEjectionTime: an ejectionTime of 3 ns is valid and
// makes the probe tick 0; the loop runs (no NewTicker panic) and stops.
func TestProbeLoopTinyEjectionTime(t *testing.T) {
	cfg := DefaultHealthConfig()
	cfg.EjectionTime, cfg.MaxEjectionTime = 3, 3
	var probs []string
	cfg.problems(func(f string, a ...any) { probs = append(probs, fmt.Sprintf(f, a...)) })
	if len(probs) > 0 {
		t.Fatalf("3 ns is a valid ejection time: %v", probs)
	}
	e := newEjector(cfg, prometheus.NewRegistry(), "t")
	quit := make(chan struct{})
	close(quit)
	e.probeLoop(quit, cfg.EjectionTime/4)
}

// Answers of 5xx eject after ConsecutiveFailures in a row; 429 never ejects.
func TestEjectorCountsOutcomes(t *testing.T) {
	cfg := DefaultHealthConfig()
	e := newEjector(cfg, prometheus.NewRegistry(), "t")
	up := &upstream{id: "e", url: "http://127.0.0.1:1"}
	for i := 0; i < 10; i++ {
		e.observe(up, "status_429")
	}
	e.observe(up, "status_5xx")
	e.observe(up, "status_5xx")
	e.ok(up, monoNow()) // resets the run
	e.observe(up, "status_5xx")
	e.observe(up, "status_5xx")
	if !e.allowed("e") {
		t.Fatal("ejected before 3 consecutive 5xx")
	}
	e.observe(up, "status_5xx")
	if e.allowed("e") {
		t.Fatal("not ejected after 3 consecutive 5xx")
	}
	if !e.allowed("other") {
		t.Fatal("an unknown engine must be allowed")
	}
}

func failedAttempts(s *Server) float64 {
	n := 0.0
	for _, r := range []string{"connect_error", "timeout", "status_5xx", "empty_response"} {
		n += val(s.m.attempts.WithLabelValues(r))
	}
	return n
}

// With every engine dead, the first request pays one failed attempt per
// engine and both are ejected; every later request is shed at once with 503
// and Retry-After, without another attempt on a dead engine, and told why:
// the model's engines are all ejected, named by id (not by address).
func TestAllEnginesEjectedShedsAtOnce(t *testing.T) {
	sims := startSims(t, 2, "m")
	cfg := testConfig(simEngines(sims, "m")...)
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	for _, sm := range sims {
		if err := sm.Close(); err != nil {
			t.Fatal(err)
		}
	}
	if st, _, b := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3],"max_tokens":1}`); st != http.StatusServiceUnavailable {
		t.Fatalf("first request with both engines dead: %d %s", st, b)
	}
	attempts := failedAttempts(s)
	if attempts != 2 {
		t.Fatalf("%v failed attempts, want one per engine", attempts)
	}
	for i := 0; i < 10; i++ {
		st, hdr, b := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3],"max_tokens":1}`)
		var e openAIError
		if err := json.Unmarshal(b, &e); err != nil || st != http.StatusServiceUnavailable || hdr.Get("Retry-After") != "1" || e.Error.Code != "service_unavailable" {
			t.Fatalf("request %d: %d Retry-After=%q %s", i, st, hdr.Get("Retry-After"), b)
		}
		const want = `no live engine serves the model "m" right now: all 2 of its engines are out of routing: sim0 ejected after failing (probed until it answers again), sim1 ejected after failing`
		if !strings.Contains(e.Error.Message, want) || strings.Contains(e.Error.Message, "127.0.0.1") {
			t.Fatalf("request %d: message %q, want it to say %q", i, e.Error.Message, want)
		}
	}
	if n := failedAttempts(s); n != attempts {
		t.Fatalf("%v more attempts on dead engines after their ejection", n-attempts)
	}
}

// engineSeries returns the value of metric name's series per engine label
// in reg.
func engineSeries(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			engine := "<none>"
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" {
					engine = l.GetValue()
				}
			}
			out[engine] += m.GetCounter().GetValue()
		}
	}
	return out
}

// TestEjectionMetricsPerEngine: ejections, restores and stall ejections
// are counted per engine (label engine), and an engine's series go when
// the engine is forgotten (forget.go), not to come back from a probe still
// out for its old record.
func TestEjectionMetricsPerEngine(t *testing.T) {
	reg := prometheus.NewRegistry()
	e := newEjector(DefaultHealthConfig(), reg, "i")
	e.ups = &upstreams{} // the stall watch cuts nothing here
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	t.Cleanup(srv.Close)
	x := &upstream{id: "x", url: srv.URL}              // fails once, then its probe answers
	y := &upstream{id: "y", url: "http://127.0.0.1:1"} // fails
	z := &upstream{id: "z", url: "http://127.0.0.1:1"} // stalls: its probes fail
	e.observe(x, "connect_error")
	e.observe(y, "connect_error")
	hx, hz := e.get("x", x.url), e.get("z", z.url)
	e.probe(context.Background(), hx, x.url)
	e.stallProbe(context.Background(), hz, z)
	want := map[string]map[string]float64{
		"kvmesh_ingress_engine_ejections_total": {"x": 1, "y": 1, "z": 1},
		"kvmesh_ingress_engine_restores_total":  {"x": 1, "y": 0, "z": 0}, // each engine's series from its first request
		"kvmesh_ingress_engine_stalls_total":    {"x": 0, "y": 0, "z": 1},
	}
	for name, w := range want {
		if got := engineSeries(t, reg, name); !maps.Equal(got, w) {
			t.Fatalf("%s: %v, want %v", name, got, w)
		}
	}
	e.observe(x, "connect_error") // ejected again, then forgotten
	e.forget("x")
	e.forget("z")
	hx.mu.Lock()
	e.ejectLocked(hx, time.Now(), "stalled") // a failed probe landing on the forgotten record
	hx.mu.Unlock()
	e.probe(context.Background(), hx, x.url)
	for name, w := range want {
		delete(w, "x")
		delete(w, "z")
		if got := engineSeries(t, reg, name); !maps.Equal(got, w) {
			t.Fatalf("after x and z were forgotten, %s: %v, want %v", name, got, w)
		}
	}
}

// TestProbeLoopQuitCancelsProbesInFlight: stopping the probe loop cancels
// a probe waiting on a hung engine instead of waiting out its timeout
// (Server.Close waits for the loop: with an hour's probe timeout it would
// hang for the hour).
func TestProbeLoopQuitCancelsProbesInFlight(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0") // accepts (the backlog) and never answers: a hung engine
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	cfg := DefaultHealthConfig()
	cfg.ProbeTimeout = time.Hour
	cfg.EjectionTime = time.Millisecond
	e := newEjector(cfg, prometheus.NewRegistry(), "i")
	h := e.get("e1", "http://"+ln.Addr().String())
	h.mu.Lock()
	e.ejectLocked(h, time.Now().Add(-time.Second), "connect_error: test")
	h.until = time.Now().Add(-time.Second)
	h.mu.Unlock()
	quit := make(chan struct{})
	done := make(chan struct{})
	go func() { defer close(done); e.probeLoop(quit, time.Millisecond) }()
	testutil.WaitFor(t, 30*time.Second, "a probe in flight", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.probing
	})
	close(quit)
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a hang guard, not a timing assertion
		t.Fatal("the probe loop still waits for its probe 30 s after quit (probe timeout 1 h)")
	}
}
