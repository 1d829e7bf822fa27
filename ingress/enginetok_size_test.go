package ingress

import (
	"context"
	"net"
	"net/http"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestEngineTokenizeHugePromptKeepsTheModel: a /tokenize call that goes
// unanswered for a prompt past the ordinary size (its own allowance,
// tokenizePerKiB, over EngineTokenizeTimeout) is the prompt's time, not the
// engines': the request goes unkeyed without asking another engine, no
// engine is put in its backoff and the model's engines are still asked
// for ordinary prompts (the huge prompts that follow are not:
// TestEngineTokenizeLargePromptsPause).
// An ordinary prompt that goes unanswered on both engines still pauses the
// model. Before, one 2 MB prompt (refused afterwards as too long) timed out
// on two engines and turned the fallback off for the whole model, for
// every client, for 5 s: sent every 5 s, it kept prefix-aware routing off
// (tester h-limits 1). Both engines' /tokenize hang, whatever the prompt.
func TestEngineTokenizeHugePromptKeepsTheModel(t *testing.T) {
	fa, fb := startFaultEngine(t, faultOK), startFaultEngine(t, faultOK)
	pa, askedA := hungTokenizeProxy(t, fa.url())
	pb, askedB := hungTokenizeProxy(t, fb.url())
	cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: pa.URL}, StaticEngine{ID: "b", Model: "m", URL: pb.URL})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.EngineTokenizeTimeout = 50 * time.Millisecond
	s := startIngress(t, cfg, Deps{Logger: quietLog(), Registry: prometheus.NewRegistry()})
	client := &http.Client{Timeout: time.Minute}
	asked := func() int64 { return askedA.Load() + askedB.Load() }
	tm := s.etok.model("m")
	inBackoff := func() (n int) {
		for _, id := range []string{"a", "b"} {
			if tm.slowEngine(id, time.Now()) {
				n++
			}
		}
		return n
	}

	huge := strings.Repeat("the quick brown fox ", 10_000) // 200 kB: an allowance of ~195 ms over a 50 ms timeout
	if d, ordinary := tokenizeTimeout(cfg.EngineTokenizeTimeout, len(huge)); ordinary || d <= cfg.EngineTokenizeTimeout {
		t.Fatalf("a %d-byte prompt: timeout %v, ordinary %v; want a longer timeout, not ordinary", len(huge), d, ordinary)
	}
	for i := range 3 {
		if st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":"`+huge+`"}`); st != http.StatusOK {
			t.Fatalf("huge prompt %d: status %d: %.200s", i, st, b)
		}
		if n := asked(); n != 1 {
			t.Fatalf("after %d huge prompts /tokenize was asked %d times, want 1: a huge prompt's timeout asked another engine, or the next huge prompt asked again", i+1, n)
		}
		if !s.etok.asking("m") || inBackoff() != 0 {
			t.Fatalf("after huge prompt %d: model asked %v, %d engines in backoff; want asked, none", i, s.etok.asking("m"), inBackoff())
		}
	}
	if d, ordinary := tokenizeTimeout(cfg.EngineTokenizeTimeout, 200); !ordinary || d > cfg.EngineTokenizeTimeout+time.Millisecond {
		t.Fatalf("a 200-byte prompt: timeout %v, ordinary %v; want about %v, ordinary", d, ordinary, cfg.EngineTokenizeTimeout)
	}
	// The engines are slow: an ordinary prompt goes unanswered on both.
	if st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":"an ordinary prompt"}`); st != http.StatusOK {
		t.Fatalf("ordinary prompt: status %d: %.200s", st, b)
	}
	if n := asked(); n != 3 || s.etok.asking("m") {
		t.Fatalf("an ordinary prompt unanswered: /tokenize asked %d times in all, model asked %v; want 3 (both engines), paused", n, s.etok.asking("m"))
	}
}

// TestEngineTokenizeLargePromptsPause: when an engine's /tokenize hangs,
// prompts past the ordinary size pay its timeout (EngineTokenizeTimeout
// plus 1 ms a KiB) once per pause, not each of them: after one goes
// unanswered, large prompts do not ask the model's engines for
// slowBackoff, doubling while it recurs, while ordinary prompts are still
// asked; a large prompt tokenized ends the pause and resets its backoff,
// an ordinary one does not. Before, every large prompt waited the whole
// allowance (a 1.5 MB prompt 1.72 s, every time; tester h-reg6 F1). The
// ingress's clock for the fallback is the test's (et.now).
func TestEngineTokenizeLargePromptsPause(t *testing.T) {
	fa := startFaultEngine(t, faultOK)
	pa, asked := hungTokenizeProxy(t, fa.url())
	cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: pa.URL})
	cfg.Listen = "127.0.0.1:0"
	cfg.Scheduler.Policy = "kvmesh"
	cfg.EngineTokenizeTimeout = 50 * time.Millisecond
	s, err := New(cfg, Deps{Logger: quietLog(), AccessLog: quietLog(), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	base := time.Now()
	var advanced atomic.Int64
	s.etok.now = func() time.Time { return base.Add(time.Duration(advanced.Load())) } // before Start: no request races it
	advance := func(d time.Duration) { advanced.Add(int64(d)) }
	if err := s.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	client := &http.Client{Timeout: time.Minute}
	huge := `{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat("the quick brown fox ", 10_000) + `"}` // 200 kB: past the ordinary size at 50 ms
	send := func(what, body string, wantAsked int64) {
		t.Helper()
		if st, _, b := post(t, client, "http://"+s.Addr()+"/v1/completions", body); st != http.StatusOK {
			t.Fatalf("%s: status %d: %.200s", what, st, b)
		}
		if n := asked.Load(); n != wantAsked {
			t.Fatalf("%s: /tokenize asked %d times in all, want %d", what, n, wantAsked)
		}
	}
	send("the first large prompt", huge, 1)
	send("a large prompt in the pause", huge, 1)
	send("another large prompt in the pause", huge, 1)
	send("an ordinary prompt in the pause", `{"model":"m","max_tokens":1,"prompt":"an ordinary prompt"}`, 2)
	advance(slowBackoff) // the large prompts' pause and the engine's own (the ordinary prompt's timeout) are over
	send("a large prompt after the pause", huge, 3)
	advance(slowBackoff)
	send("a large prompt in the second pause (twice as long)", huge, 3)
	advance(slowBackoff)
	send("a large prompt after the second pause", huge, 4)
	tm := s.etok.model("m")
	if d := time.Duration(tm.largeBackoff.Load()); d != 4*slowBackoff {
		t.Fatalf("the third pause is %v, want %v", d, 4*slowBackoff)
	}
	if !s.etok.asking("m") {
		t.Fatal("the model's engines are not asked for ordinary prompts")
	}
	s.etok.succeeded("m", "a", false)
	if tm.askingLarge(s.etok.now()) || tm.largeBackoff.Load() == 0 {
		t.Fatal("an ordinary prompt tokenized ended the large prompts' pause")
	}
	s.etok.succeeded("m", "a", true)
	if !tm.askingLarge(s.etok.now()) || tm.largeBackoff.Load() != 0 {
		t.Fatal("a large prompt tokenized did not end the large prompts' pause and reset its backoff")
	}
}

// TestEngineTokenizeLocalDialErrorIsNotTheEngines: a /tokenize call that
// gets no connection for want of the ingress's own resources (a fake
// EMFILE from socket()) is not the engine's slowness: no engine is put in
// its backoff, no other engine is asked (it would fail the same way), and
// the model's engines are still asked once the descriptors come back.
// Before, it was counted as an unanswered call on both engines, which
// turned the fallback off for the model (tester h-limits 2), although the
// proxy holds such a dial error against no engine (local_error).
func TestEngineTokenizeLocalDialErrorIsNotTheEngines(t *testing.T) {
	fa, fb := startFaultEngine(t, faultOK), startFaultEngine(t, faultOK)
	var dials atomic.Int32
	fakeEMFILE := func(addr string) (net.Conn, error) {
		dials.Add(1)
		return nil, &net.OpError{Op: "dial", Net: "tcp", Err: os.NewSyscallError("socket", syscall.EMFILE)}
	}
	cfg := testConfig(StaticEngine{ID: "a", Model: "m", URL: fa.url()}, StaticEngine{ID: "b", Model: "m", URL: fb.url()})
	cfg.Scheduler.Policy = "kvmesh"
	s := startDialFaultIngress(t, cfg, Deps{Registry: prometheus.NewRegistry()}, fakeEMFILE)
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","max_tokens":1,"prompt":"a prompt the ingress cannot tokenize"}`)
	if st != http.StatusServiceUnavailable || !strings.Contains(string(b), "ingress_resource_exhausted") {
		t.Fatalf("status %d: %s; want 503 ingress_resource_exhausted", st, b)
	}
	tm := s.etok.model("m")
	for _, id := range []string{"a", "b"} {
		if tm.slowEngine(id, time.Now()) {
			t.Errorf("engine %s in its /tokenize backoff for the ingress's own resource error", id)
		}
	}
	if !s.etok.asking("m") {
		t.Error("the model's engines are not asked to tokenize after the ingress's own resource error")
	}
	if n, failed := dials.Load(), val(s.etok.failed); n != 2 || failed != 1 {
		t.Errorf("%d dials, %v failed /tokenize calls; want 2 (one /tokenize, one request), 1", n, failed)
	}
}

// A prompt refused as too long on the ingress's estimate (no tokenizer for
// the model and no engine's /tokenize answer: about 4 bytes a token) says
// that its count is an estimate; one refused on a count (token ids) states
// the count. Before, the estimate was stated as a count: "the request has
// 500002 prompt tokens" for a prompt the engine counted 2,000,107 tokens
// in (tester h-limits, unverified 1).
func TestPromptTooLongSaysWhenItsCountIsAnEstimate(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}) // least-request: no engine is asked to tokenize
	cfg.MaxPromptTokens = 100
	s := startIngress(t, cfg, Deps{})
	long := strings.Repeat("x", 4000)
	for _, tc := range []struct{ path, body, says string }{
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`,
			"the request has about 1004 prompt tokens (an estimate: the ingress did not get the engine's tokens for it)"},
		{"/v1/completions", `{"model":"m","prompt":"` + long + `"}`,
			"the request has about 1001 prompt tokens (an estimate"},
		{"/v1/completions", idsPrompt(150), "the request has 150 prompt tokens\""},
	} {
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, tc.body)
		if st != 400 || !strings.Contains(string(body), "context_length_exceeded") || !strings.Contains(string(body), tc.says) {
			t.Errorf("%s over the limit: %d %s; want 400 context_length_exceeded saying %q", tc.path, st, body, tc.says)
		}
	}
}
