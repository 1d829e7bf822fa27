package ingress

import (
	"net/http"
	"testing"
	"time"
)

// TestRecentLatencyWindows: the means cover the requests finished in the
// window that closed last with any; an empty window keeps them; one-token
// answers (no TPOT) are not counted.
func TestRecentLatencyWindows(t *testing.T) {
	var l recentLatency
	t0 := time.Unix(1000, 0)
	if a, b := l.get(t0); a != 0 || b != 0 {
		t.Fatalf("no requests yet: %v %v", a, b)
	}
	l.observe(100*time.Millisecond, 20*time.Millisecond)
	l.observe(300*time.Millisecond, 40*time.Millisecond)
	l.observe(time.Second, 0) // one output token: no TPOT
	if a, b := l.get(t0.Add(latencyWindow / 2)); a != 0 || b != 0 {
		t.Fatalf("window still open: %v %v", a, b)
	}
	at := t0.Add(latencyWindow)
	if a, b := l.get(at); a != 200*time.Millisecond || b != 30*time.Millisecond {
		t.Fatalf("closed window: ttft %v tpot %v, want 200ms 30ms", a, b)
	}
	l.observe(50*time.Millisecond, 80*time.Millisecond)
	if _, b := l.get(at.Add(latencyWindow - 1)); b != 30*time.Millisecond {
		t.Fatalf("before the next window closes: tpot %v, want 30ms", b)
	}
	at = at.Add(latencyWindow)
	if a, b := l.get(at); a != 50*time.Millisecond || b != 80*time.Millisecond {
		t.Fatalf("next window: ttft %v tpot %v, want 50ms 80ms", a, b)
	}
	at = at.Add(5 * latencyWindow)
	if a, b := l.get(at); a != 50*time.Millisecond || b != 80*time.Millisecond {
		t.Fatalf("an empty window keeps the last means: %v %v", a, b)
	}
}

// TestCandidatesCarryRecentLatency: over real HTTP to the simulator, the
// engine a replica streamed answers from shows their TTFT and TPOT to the
// scheduler (scheduler.Engine.TTFT/TPOT, what the P/D step and the Kthena
// emulation read; gossip carries none); non-streamed answers, whose first
// token the ingress cannot see, leave them at zero.
func TestCandidatesCarryRecentLatency(t *testing.T) {
	s := startIngress(t, testConfig(simEngines(startSims(t, 1, "m"), "m")...), Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	c := &http.Client{Timeout: 30 * time.Second}
	engine := func() (ttft, tpot time.Duration) {
		p, err := s.Pick(PickInput{Body: []byte(`{"model":"m","prompt":"probe","max_tokens":2}`)})
		if err != nil {
			t.Fatal(err)
		}
		defer p.Done(200)
		es := p.Engines()
		if len(es) != 1 {
			t.Fatalf("%d candidates", len(es))
		}
		return es[0].TTFT, es[0].TPOT
	}
	for range 20 {
		if code, _, b := post(t, c, url, `{"model":"m","prompt":"a non-streamed request","max_tokens":16}`); code != 200 {
			t.Fatalf("%d %s", code, b)
		}
	}
	engine() // closes the window the requests fell in
	if code, _, b := post(t, c, url, `{"model":"m","prompt":"one more","max_tokens":16}`); code != 200 {
		t.Fatalf("%d %s", code, b)
	}
	if a, b := engine(); a != 0 || b != 0 {
		t.Fatalf("non-streamed answers only: ttft %v tpot %v, want none", a, b)
	}
	// Stream until a window closes with finished requests in it (bounded:
	// each request takes the simulator's time, windows close on reads).
	var ttft, tpot time.Duration
	deadline := time.Now().Add(20 * time.Second)
	for n := 0; tpot == 0 && n < 20000 && time.Now().Before(deadline); n++ {
		code, _, b := post(t, c, url, `{"model":"m","prompt":"a streamed request","max_tokens":16,"stream":true}`)
		if code != 200 {
			t.Fatalf("%d %s", code, b)
		}
		ttft, tpot = engine()
	}
	if tpot <= 0 || ttft <= 0 {
		t.Fatalf("streamed answers: ttft %v tpot %v, want both > 0", ttft, tpot)
	}
	if tpot > 20*time.Second || ttft > 20*time.Second {
		t.Fatalf("ttft %v tpot %v longer than the whole test", ttft, tpot)
	}
}
