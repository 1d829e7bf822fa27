package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim"
)

// boundRig: a sim and an ingress with the bert tokenizer loaded from its
// file (LoadTokenizers, the command's path), cfg adjusted by tune.
func boundRig(t *testing.T, tune func(*Config)) (*Server, *hfTokenizer) {
	t.Helper()
	nt, _ := llama(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	// A minute for a request's headers: a sim connection goroutine starved past the
	// 10 s default on a loaded machine is closed unanswered (one engine: a 503).
	sm, err := sim.Start(context.Background(), sim.Config{Model: "bert", TimeScale: 500, Tokenizer: nt, Logger: quiet, ReadHeaderTimeout: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg := testConfig(StaticEngine{ID: "s", Model: "bert", URL: sm.URL()})
	cfg.AdminListen = "127.0.0.1:0"
	cfg.Tokenizers = map[string]string{"bert": filepath.Join(llamaDir, "bert-base-uncased.json")}
	tune(&cfg)
	var deps Deps
	if err := LoadTokenizers(&cfg, &deps); err != nil {
		t.Fatal(err)
	}
	tk, _ := deps.Tokenizers.For("bert")
	return startIngress(t, cfg, deps), tk.(*hfTokenizer)
}

// longPrompt is a completions body of n distinct words (about 2n tokens).
func longPrompt(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"bert","max_tokens":2,"prompt":"`)
	for i := range n {
		b.WriteString("word")
		b.WriteString(strings.Repeat("x", i%7))
		b.WriteString(" ")
	}
	b.WriteString(`"}`)
	return b.String()
}

// TestPromptTooLongStopsTokenizing: a prompt over --max-prompt-tokens is
// refused as too long without being tokenized to its end: the prefix cache
// holds only the chunks before the limit.
func TestPromptTooLongStopsTokenizing(t *testing.T) {
	s, tk := boundRig(t, func(c *Config) { c.MaxPromptTokens = 200 })
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", longPrompt(20000))
	if st != 400 || !strings.Contains(string(b), "prompt too long") || !strings.Contains(string(b), "over 200") {
		t.Fatalf("%d %s", st, b)
	}
	if n := tk.enc.Stats().Tokens; n > 1000 {
		t.Fatalf("the prefix cache holds %d tokens of a prompt refused at 200", n)
	}
	if v := val(s.m.tokenizeStoppedTooLong); v != 1 {
		t.Fatalf("too_long stops %v", v)
	}
	// With truncate_prompt_tokens the engine keeps the last tokens: the
	// whole prompt is tokenized, and it is served.
	body := strings.Replace(longPrompt(20000), `"max_tokens":2`, `"max_tokens":2,"truncate_prompt_tokens":100`, 1)
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body); st != 200 {
		t.Fatalf("truncated: %d %s", st, b)
	}
}

// TestTokenizeBudgetRoutesUntokenized: a prompt that outlasts the tokenize
// budget (here one that has passed before the first check) is served,
// keyed on the engine's /tokenize as a prompt the ingress cannot tokenize,
// and counted; /metrics shows the stop reasons and the prefix cache's series.
func TestTokenizeBudgetRoutesUntokenized(t *testing.T) {
	s, _ := boundRig(t, func(c *Config) {
		c.TokenizeBudget = time.Nanosecond
		c.Scheduler.Policy = DefaultConfig().Scheduler.Policy // keys matter: the engine is asked
		c.EngineTokenizeTimeout = time.Minute                 // a slow machine's engine still answers
	})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", longPrompt(20000))
	var u usageBody
	if err := json.Unmarshal(b, &u); st != 200 || err != nil {
		t.Fatalf("%d %s %v", st, b, err)
	}
	if v := val(s.m.tokenizeStoppedBudget); v != 1 {
		t.Fatalf("budget stops %v", v)
	}
	if ok, failed := val(s.etok.ok), val(s.etok.failed); ok+failed != 1 {
		t.Fatalf("engine /tokenize asked %v times (%v answered)", ok+failed, ok)
	}
	// A short prompt never reaches a check: tokenized here.
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", longPrompt(10)); st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	if v := val(s.m.tokenizeStoppedBudget); v != 1 {
		t.Fatalf("budget stops %v after a short prompt", v)
	}
	st, body, err := get("http://" + s.AdminAddr() + "/metrics")
	if err != nil || st != 200 {
		t.Fatal(st, err)
	}
	for _, want := range []string{
		`kvmesh_ingress_tokenize_stopped_total{ingress="` + s.cfg.ID + `",reason="budget"} 1`,
		`kvmesh_ingress_tokenize_stopped_total{ingress="` + s.cfg.ID + `",reason="client_gone"} 0`,
		`kvmesh_ingress_tokenize_stopped_total{ingress="` + s.cfg.ID + `",reason="too_long"} 0`,
		`kvmesh_tokenizer_cache_hits_total{model="bert"}`,
		`kvmesh_tokenizer_cache_misses_total{model="bert"}`,
		`kvmesh_tokenizer_cache_tokens{model="bert"}`,
	} {
		if !strings.Contains(body, want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestTokenizingStopsForAClientThatLeft: a client that sent a large prompt
// and closed its connection does not keep the ingress tokenizing it: the
// encoding polls for the client (every 64 KiB of text) and stops, counted
// as client_gone, and nothing reaches the engine. Before, one such 30 KB
// gzipped upload kept the ingress busy for 40 CPU-seconds after its client
// had left.
func TestTokenizingStopsForAClientThatLeft(t *testing.T) {
	s, _ := boundRig(t, func(c *Config) { c.MaxPromptTokens, c.TokenizeBudget = 50_000_000, 0 })
	conn := dialRequest(t, s.Addr(), "/v1/completions", longPrompt(1_000_000))
	conn.Close() // the whole request is in the ingress's socket buffer: it reads it, then finds the client gone
	testutil.WaitFor(t, 2*time.Minute, "the tokenizing stopped for the client that left, the request ended as 499", func() bool {
		return val(s.m.tokenizeStoppedGone) == 1 && val(s.m.requests.WithLabelValues("completions", "499")) == 1
	})
	if n := val(s.m.attempts.WithLabelValues("ok")); n != 0 {
		t.Fatalf("%v attempts reached the engine for a client that had left", n)
	}
}

// TestBatchPromptLimitIsPerPrompt: vLLM checks each prompt of a batch on
// its own against the context length, after truncate_prompt_tokens, so the
// ingress's limit is per prompt too (before, it counted the batch's sum, and
// truncated no prompt of a batch): prompts each under the limit are served
// however many there are, a batch with one prompt over it is refused with
// context_length_exceeded naming that prompt, and truncate_prompt_tokens
// brings long prompts under it; for text prompts and token ids alike.
func TestBatchPromptLimitIsPerPrompt(t *testing.T) {
	const lim = 200
	s, tk := boundRig(t, func(c *Config) { c.MaxPromptTokens = lim })
	words := func(n int) string { // a text prompt of n distinct words
		var b strings.Builder
		for i := range n {
			b.WriteString("word")
			b.WriteString(strings.Repeat("x", i%7))
			b.WriteString(" ")
		}
		return b.String()
	}
	count := func(text string) int {
		ids, err := tk.Encode(nil, []byte(text))
		if err != nil {
			t.Fatal(err)
		}
		return len(ids)
	}
	short, long := words(60), words(200)
	if n, m := count(short), count(long); 3*n <= lim || n > lim || m <= lim {
		t.Fatalf("prompts of %d and %d tokens: want each short one under %d and three over it, the long one over it", n, m, lim)
	}
	ids := func(n int) string { return "[" + strings.TrimSuffix(strings.Repeat("7,", n), ",") + "]" }
	for _, tc := range []struct {
		name, prompt, extra string
		want                int
		param               string // in the refusal's message
	}{
		{"texts each under the limit", string(mustJSON(t, []string{short, short, short})), ``, 200, ""},
		{"one text over the limit", string(mustJSON(t, []string{short, long})), ``, 400, "over 200"},
		{"texts truncated under the limit", string(mustJSON(t, []string{long, long})), `,"truncate_prompt_tokens":100`, 200, ""},
		{"ids each under the limit", "[" + ids(150) + "," + ids(150) + "]", ``, 200, ""},
		{"ids, one over the limit", "[" + ids(150) + "," + ids(250) + "]", ``, 400, "maximum context length is 200 tokens, and prompt[1] has 250 prompt tokens"},
		{"ids truncated under the limit", "[" + ids(250) + "," + ids(250) + "]", `,"truncate_prompt_tokens":100`, 200, ""},
	} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"bert","max_tokens":2,"prompt":`+tc.prompt+tc.extra+`}`)
		if st != tc.want {
			t.Fatalf("%s: %d %s", tc.name, st, b)
		}
		if st != 200 && (!strings.Contains(string(b), `"code":"context_length_exceeded"`) || !strings.Contains(string(b), tc.param)) {
			t.Fatalf("%s: %s", tc.name, b)
		}
	}
}
