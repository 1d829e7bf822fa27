package ingress

import (
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A live engine whose /health answers only after ProbeTimeout (vLLM's, on
// an event loop busy with its streams) leaves routing while its probes are
// out, and is back once one answers; its request in flight is not cut. It
// ends with its own answer, once, from that engine. Before, two probes
// unanswered within ProbeTimeout cut the request, which ran again on the
// other engine (or failed with 503 where there was none).
func TestStallWatchSlowProbeKeepsRequests(t *testing.T) {
	probeGo, answerGo := make(chan struct{}), make(chan struct{})
	var probes, completions atomic.Int64
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		wait := answerGo
		if r.URL.Path == "/health" {
			probes.Add(1)
			wait = probeGo
		} else {
			completions.Add(1)
		}
		select {
		case <-wait:
		case <-r.Context().Done():
			return
		}
		if r.URL.Path != "/health" {
			w.Header().Set("Content-Type", "application/json")
			io.WriteString(w, `{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"slow","finish_reason":"length"}],"usage":{"prompt_tokens":2,"completion_tokens":1,"total_tokens":3}}`)
		}
	}))
	t.Cleanup(slow.Close)
	t.Cleanup(func() { // runs before slow.Close, which waits for the handlers
		select {
		case <-probeGo:
		default:
			close(probeGo)
		}
		select {
		case <-answerGo:
		default:
			close(answerGo)
		}
	})
	good := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "slow", Model: "m", URL: slow.URL}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.MaxAttempts = 2
	cfg.Health.StallAfter = 100 * time.Millisecond
	cfg.Health.ProbeTimeout = 200 * time.Millisecond
	cfg.Health.ProbeGrace = 5 * time.Minute // the test, not a clock, says when the probes answer
	s := startIngress(t, cfg, Deps{})

	type answer struct {
		st   int
		eng  string
		body string
	}
	done := make(chan answer, 2)
	client := &http.Client{Timeout: 5 * time.Minute} // a deadlock guard only
	for range 2 {                                    // round-robin: one request to each engine
		go func() {
			st, hdr, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"max_tokens":1}`)
			done <- answer{st, hdr.Get("X-Kvmesh-Engine"), string(b)}
		}()
	}
	first := <-done // the good engine's
	if first.st != 200 || first.eng != "good" {
		t.Fatalf("first answer %d via %q: %s", first.st, first.eng, first.body)
	}
	testutil.WaitFor(t, time.Minute, "the slow engine out of routing while its probes are out", func() bool {
		ej := s.health.ejected()
		return len(ej) == 1 && ej[0] == "slow"
	})
	close(probeGo) // the probes answer: slow, not hung
	testutil.WaitFor(t, time.Minute, "the slow engine back in routing", func() bool { return len(s.health.ejected()) == 0 })
	close(answerGo)
	second := <-done
	if second.st != 200 || second.eng != "slow" || !strings.Contains(second.body, `"text":"slow"`) {
		t.Fatalf("the slow engine's request: %d via %q: %s (want its own answer, not cut and run again)", second.st, second.eng, second.body)
	}
	if n := completions.Load(); n != 1 {
		t.Fatalf("the slow engine got %d completions, want 1", n)
	}
	if got, back := seriesSum(s.health.stalls), seriesSum(s.health.restores); got != 1 || back != 1 {
		t.Fatalf("%v stall ejections and %v restores, want 1 and 1", got, back)
	}
	if probes.Load() < 2 {
		t.Fatalf("%d probes, want both of the stall's", probes.Load())
	}
}

// ProbeGrace is 0 (5 × ProbeTimeout) or at least ProbeTimeout: a grace
// shorter than the probes' own timeout would cut requests of an engine
// whose probes were never judged.
func TestValidateProbeGrace(t *testing.T) {
	for grace, ok := range map[time.Duration]bool{0: true, time.Second: true, time.Minute: true, -time.Second: false, 500 * time.Millisecond: false} {
		cfg := DefaultConfig()
		cfg.Health.ProbeTimeout, cfg.Health.ProbeGrace = time.Second, grace
		err := cfg.Validate()
		if ok != (err == nil) || (err != nil && (!errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "probe grace"))) {
			t.Errorf("probe grace %v: %v", grace, err)
		}
	}
	if got := (&HealthConfig{ProbeTimeout: time.Second}).probeGrace(); got != 5*time.Second {
		t.Errorf("default probe grace %v, want 5 × the probe timeout", got)
	}
}
