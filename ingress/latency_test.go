package ingress

import (
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
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

// TestRecentLatencyWindowAcrossWallStep: the window closes after
// latencyWindow of real time however the wall clock moves. Timed on the
// wall clock, a step back of 60 s kept the window open for 60 s: the
// scheduler kept seeing the engine's TTFT and TPOT from before the step
// while it got 50 times slower (tester h-clock).
func TestRecentLatencyWindowAcrossWallStep(t *testing.T) {
	var l recentLatency
	now := time.Now()
	l.observe(100*time.Millisecond, 10*time.Millisecond)
	l.get(now) // opens the first window
	if a, b := l.get(now.Add(latencyWindow)); a != 100*time.Millisecond || b != 10*time.Millisecond {
		t.Fatalf("before the step: ttft %v tpot %v, want 100ms 10ms", a, b)
	}
	// The wall clock steps back a minute; the engine slows down.
	l.observe(5*time.Second, 500*time.Millisecond)
	at := testutil.WallStepped(now.Add(2*latencyWindow), -time.Minute)
	if a, b := l.get(at); a != 5*time.Second || b != 500*time.Millisecond {
		t.Fatalf("a window after a 1-minute step back: ttft %v tpot %v, want 5s 500ms", a, b)
	}
	// A step forward does not close a window early.
	l.observe(time.Second, 100*time.Millisecond)
	at = testutil.WallStepped(now.Add(2*latencyWindow+latencyWindow/2), time.Hour)
	if a, _ := l.get(at); a != 5*time.Second {
		t.Fatalf("half a window after a 1-hour step forward: ttft %v, want the last window's 5s", a)
	}
}
