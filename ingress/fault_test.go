package ingress

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestEngineKilledMidRun kills one of two simulated engines while requests
// run and queue on it: every request that had not started streaming must
// succeed on the other engine; only one that was already streaming from the
// dead engine may end with an error event (never a hung or half stream).
func TestEngineKilledMidRun(t *testing.T) {
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// The victim runs one request at a time, slowly, so the others queue on it.
	victim, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 1, Seed: 1, Logger: quiet,
		Engine: engine.Config{MaxRunning: 1}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { victim.Close() })
	healthy := startSims(t, 1, "m")[0]
	cfg := testConfig(StaticEngine{ID: "victim", Model: "m", URL: victim.URL()}, StaticEngine{ID: "healthy", Model: "m", URL: healthy.URL()})
	cfg.Scheduler.Policy = "round-robin"
	s := startIngress(t, cfg, Deps{})

	type result struct {
		status   int
		engine   string
		stream   bool
		body     string
		errEvent bool
		done     bool
	}
	const n = 16
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			stream := i%2 == 0
			body := `{"model":"m","prompt":"request ` + strings.Repeat("x ", i+1) + `","max_tokens":24,"stream":` + map[bool]string{true: "true", false: "false"}[stream] + `}`
			st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
			r := result{status: st, engine: hdr.Get("X-Kvmesh-Engine"), stream: stream, body: string(b)}
			if stream {
				evs := sseEvents(b)
				for _, e := range evs {
					r.errEvent = r.errEvent || strings.HasPrefix(e, `{"error"`)
				}
				r.done = len(evs) > 0 && evs[len(evs)-1] == "[DONE]"
			}
			results[i] = r
		}(i)
	}
	// Kill the victim once several requests wait in its queue.
	testutil.WaitFor(t, 10*time.Second, "4 requests waiting on the victim engine", func() bool { return victim.Load(0).Waiting >= 4 })
	if err := victim.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()

	errEvents := 0
	for i, r := range results {
		if r.status != 200 {
			t.Errorf("request %d: status %d: %.200s", i, r.status, r.body)
			continue
		}
		if r.stream && !r.done {
			t.Errorf("request %d: stream did not end with [DONE]: %.300s", i, r.body)
		}
		if r.errEvent {
			errEvents++
			if r.engine != "victim" {
				t.Errorf("request %d: error event from %s", i, r.engine)
			}
			continue
		}
		if r.engine != "healthy" && r.engine != "victim" {
			t.Errorf("request %d: served by %q", i, r.engine)
		}
	}
	// MaxRunning 1: at most one request was past its first byte on the victim.
	if errEvents > 1 {
		t.Errorf("%d streams broke; only the one running on the victim may", errEvents)
	}
	retried := 0.0
	for _, r := range []string{"connect_error", "timeout", "status_5xx", "empty_response"} {
		retried += val(s.m.attempts.WithLabelValues(r))
	}
	if retried < 3 {
		t.Errorf("only %v failed attempts recorded; the queued requests should have been retried", retried)
	}
	waitSettled(t, s)
	t.Logf("error events %d, failed attempts %v", errEvents, retried)
}
