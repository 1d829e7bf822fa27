package ingress

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// fakeProbeEMFILE makes the ejector's probes fail to get a socket (a fake
// EMFILE, as when the ingress is out of file descriptors); each dial is
// counted, and once dials reach n, reached is closed.
func fakeProbeEMFILE(e *ejector, n int64, dials *atomic.Int64, reached chan struct{}) {
	e.client.Transport = &http.Transport{DisableKeepAlives: true, DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		if dials.Add(1) == n {
			close(reached)
		}
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}}
}

// TestStallProbeLocalErrorIsNotTheEngines: when the stall watch's probes of
// an engine fail for want of the ingress's own resources (no socket:
// EMFILE), they were never sent and say nothing of the engine: it is not
// ejected and its request is not cut; the watch probes it again, and the
// request ends with the engine's answer. Before, both probes failed at
// once, which ejected the engine and cut its requests with 503 "the
// engine stalled ... its health probes unanswered" (tester h-reg6 F3).
// The engine answers its request once the watch has probed it twice (four
// probe dials), or when the ingress cuts it.
func TestStallProbeLocalErrorIsNotTheEngines(t *testing.T) {
	reached := make(chan struct{})
	var dials atomic.Int64
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-reached:
		case <-r.Context().Done(): // cut by the ingress
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"c","object":"text_completion","model":"m","choices":[{"index":0,"text":"ok","finish_reason":"stop"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`)
	}))
	t.Cleanup(eng.Close)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: eng.URL})
	cfg.Listen = "127.0.0.1:0"
	cfg.IdleTimeout = 10 * time.Minute
	cfg.Health.StallAfter = 50 * time.Millisecond
	cfg.Health.ProbeTimeout = 200 * time.Millisecond
	s, err := New(cfg, Deps{Logger: quietLog(), AccessLog: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	fakeProbeEMFILE(s.health, 4, &dials, reached)
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	client := &http.Client{Timeout: time.Minute} // far below the idle timeout: a stuck request fails the test
	st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"max_tokens":1}`)
	if st != 200 || hdr.Get(engineHeader) != "e1" {
		t.Fatalf("status %d via %q: %s; want the engine's 200 (its probes failed for the ingress's own resources)", st, hdr.Get(engineHeader), b)
	}
	if n := dials.Load(); n < 4 {
		t.Fatalf("%d probe dials, want at least 4 (two stall probes, twice)", n)
	}
	if got := seriesSum(s.health.stalls); got != 0 || len(s.health.ejected()) != 0 {
		t.Fatalf("%v stall ejections, ejected %v; want none for the ingress's own resource errors", got, s.health.ejected())
	}
}

// TestProbeLocalErrorIsNoVerdict: a probe of an ejected engine that failed
// for want of the ingress's own resources does not grow the engine's
// backoff (each failed probe doubles the wait for the next, up to
// MaxEjectionTime, which would keep a healthy engine out long after the
// descriptors came back): it is probed again after EjectionTime.
func TestProbeLocalErrorIsNoVerdict(t *testing.T) {
	cfg := DefaultHealthConfig()
	e := newEjector(cfg, prometheus.NewRegistry(), "i")
	var dials atomic.Int64
	fakeProbeEMFILE(e, 0, &dials, nil)
	h := e.get("e1", "http://127.0.0.1:1")
	h.mu.Lock()
	e.ejectLocked(h, time.Now(), "status_5xx: test")
	before := h.ejections
	h.mu.Unlock()
	for range 3 {
		e.probe(context.Background(), h, "http://127.0.0.1:1")
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if dials.Load() != 3 || h.ejections != before || h.dead || !h.ejected.Load() {
		t.Fatalf("after 3 probes that got no socket (%d dials): ejections %d (was %d), dead %v, ejected %v; want unchanged, not dead, still ejected (no verdict)",
			dials.Load(), h.ejections, before, h.dead, h.ejected.Load())
	}
	if d := time.Until(h.until); d > cfg.EjectionTime {
		t.Fatalf("next probe in %v, want within EjectionTime %v", d, cfg.EjectionTime)
	}
}
