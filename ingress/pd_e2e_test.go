package ingress

import (
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// startPDCluster starts a NIXL P/D cluster of real simulators (side
// channel on loopback) and an ingress disaggregating every request.
func startPDCluster(t *testing.T, base sim.Config, prefill, decode int) (*simtest.PD, *Server) {
	t.Helper()
	base.Model, base.Logger = "m", slog.New(slog.NewTextHandler(io.Discard, nil))
	cl := simtest.StartPDForTest(t, simtest.PDOptions{Base: base, Prefill: prefill, Decode: decode})
	var m roleMembership
	for i, s := range cl.Prefill {
		m = append(m, pdEngine("p"+string(rune('0'+i)), scheduler.RolePrefill, s.URL()))
	}
	for i, s := range cl.Decode {
		m = append(m, pdEngine("d"+string(rune('0'+i)), scheduler.RoleDecode, s.URL()))
	}
	c := testConfig()
	c.PD = PDConfig{Policy: "kvmesh-always"}
	return cl, startIngress(t, c, Deps{Membership: m})
}

// TestPDBlocksFreedAfterEachRead: after every disaggregated request the
// prefill engine holds no blocks: the decode engine's read over the side
// channel released them (not the 480 s abort timeout).
func TestPDBlocksFreedAfterEachRead(t *testing.T) {
	cl, s := startPDCluster(t, sim.Config{TimeScale: 100, Seed: 1}, 1, 1)
	p := cl.Prefill[0]
	for i := 0; i < 6; i++ {
		stream := i%2 == 1
		body := `{"model":"m","prompt":"request ` + strings.Repeat("word ", 40+i) + `","max_tokens":4,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
		if l := p.Load(0); l.Finished != uint64(i+1) || l.HeldBlocks != 0 || p.HeldRequests(0) != 0 {
			t.Fatalf("after request %d the prefill engine ran %d legs and holds %d blocks of %d requests", i, l.Finished, l.HeldBlocks, p.HeldRequests(0))
		}
	}
	if ok := val(s.pdInit().legs.WithLabelValues("prefill", "ok")); ok != 6 {
		t.Fatalf("%v prefill legs ok, want 6 (every request disaggregated)", ok)
	}
}

// TestPDPrefillKilledMidRun: a prefill engine killed while requests queue
// on it costs no request that had not started streaming: every one falls
// back to the decode engine (local prefill) and succeeds.
func TestPDPrefillKilledMidRun(t *testing.T) {
	// One sequence at a time, 20× slower than the model, so prefill legs queue.
	cl, s := startPDCluster(t, sim.Config{TimeScale: 0.05, Seed: 1, Engine: engine.Config{MaxRunning: 1}}, 1, 1)
	const n = 12
	type result struct {
		status int
		body   string
		done   bool
		stream bool
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := i%2 == 0
			body := `{"model":"m","prompt":"kill ` + strings.Repeat("token ", 200+i) + `","max_tokens":3,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
			st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
			r := result{status: st, body: string(b), stream: stream}
			if stream {
				evs := sseEvents(b)
				r.done = len(evs) > 0 && evs[len(evs)-1] == "[DONE]"
			}
			results[i] = r
		}(i)
	}
	p := cl.Prefill[0]
	okLegs := s.pdInit().legs.WithLabelValues("prefill", "ok")
	testutil.WaitFor(t, 30*time.Second, "a prefill leg done and others queued on the victim", func() bool {
		l := p.Load(0)
		return l.Running+l.Waiting > 0 && val(okLegs) > 0
	})
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	legs := s.pdInit().legs
	ok, fallback := val(legs.WithLabelValues("prefill", "ok")), val(legs.WithLabelValues("prefill", "fallback_connect_error"))+val(legs.WithLabelValues("prefill", "fallback_status_5xx"))
	if ok == 0 || fallback == 0 {
		t.Errorf("prefill legs: %v ok, %v fell back; want both (the kill must land mid-run)", ok, fallback)
	}
	for i, r := range results {
		if r.status != 200 || (r.stream && !r.done) {
			t.Errorf("request %d (stream %v): status %d body %.200s", i, r.stream, r.status, r.body)
		}
	}
}
