package ingress

import (
	"context"
	"encoding/json"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sim"
)

// checkEngine starts a simulator rendering chat with simTpl and an ingress
// keying with ingTpl (the same tokenizer for both), its warnings in log.
func checkEngine(t *testing.T, nt, ingTok *tokenizer.Native, simTpl, ingTpl *tokenizer.ChatTemplate, policy string) (*Server, *sim.Server, *keySpy, *testutil.SyncBuffer) {
	t.Helper()
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Chat: sim.TemplateChat{T: simTpl}, Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg := testConfig(StaticEngine{ID: "s", Model: "llama", URL: sm.URL()})
	cfg.SpeculativeTTL = time.Hour // the routed keys count as the engine's for the whole test
	cfg.Scheduler.Policy = policy
	tk, err := NewTokenizer(ingTok, ingTpl)
	if err != nil {
		t.Fatal(err)
	}
	log := &testutil.SyncBuffer{}
	deps := Deps{Tokenizers: TokenizerMap{"llama": tk}, Logger: slog.New(slog.NewTextHandler(log, &slog.HandlerOptions{Level: slog.LevelWarn})),
		Registry: prometheus.NewRegistry()}
	s, spy := spiedIngress(t, cfg, deps)
	// The model's engines send usage only when asked, known already: no
	// stream goes as the forced-usage probe (forcedusage.go), whose usage
	// the check would miss.
	knownUsage(s, "llama", usageAsked)
	return s, sm, spy, log
}

// The ingress compares its prompt token count with the engine's for chat
// requests the engine tokenized (chat, streamed chat, Responses, Messages):
// equal where both render with the same template, and the tokens it
// expected cached on the engine are the tokens the engine reports cached.
// With another template on the engine every answer differs, and one
// warning says so.
func TestTokenCheck(t *testing.T) {
	nt, tpl := llama(t)
	system := strings.Repeat("You answer questions about the weather in one short sentence. ", 12)
	chat := `{"model":"llama","max_tokens":2,"messages":[{"role":"system","content":` + string(mustJSON(t, system)) + `},{"role":"user","content":"Is it raining?"}]}`
	reqs := []struct{ path, body string }{
		{"/v1/chat/completions", chat},
		{"/v1/chat/completions", strings.Replace(chat, `"max_tokens":2`, `"max_tokens":2,"stream":true`, 1)},
		{"/v1/responses", `{"model":"llama","max_output_tokens":2,"instructions":` + string(mustJSON(t, system)) + `,"input":"Is it snowing?"}`},
		{"/v1/messages", `{"model":"llama","max_tokens":2,"system":` + string(mustJSON(t, system)) + `,"messages":[{"role":"user","content":"Is it windy?"}]}`},
	}
	send := func(s *Server) {
		t.Helper()
		for _, r := range reqs {
			if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+r.path, r.body); st != http.StatusOK {
				t.Fatalf("%s: status %d: %s", r.path, st, b)
			}
		}
	}

	s, _, _, log := checkEngine(t, nt, nt, tpl, tpl, "least-request")
	send(s)
	if eq, df := val(s.check.equal), val(s.check.differ); eq != float64(len(reqs)) || df != 0 {
		t.Fatalf("same template: %v equal and %v different counts, want %d and 0", eq, df, len(reqs))
	}
	// The first request found nothing cached; each later one the system
	// prompt's blocks (the streamed repeat the whole prompt but its last
	// token), exactly as the router predicted them.
	pred, eng := val(s.check.predicted), val(s.check.cached)
	if eng < float64(3*len(nt.Encode(system, false))-3*16) || pred != eng {
		t.Fatalf("same template: %v cached tokens predicted, %v reported by the engine", pred, eng)
	}
	if strings.Contains(log.String(), "tokenized a chat request differently") {
		t.Fatalf("warned with the same template:\n%s", log)
	}

	s, _, _, log = checkEngine(t, nt, nt, toolsTemplate(t), tpl, "least-request") // the engine's template adds a system header
	s.check.model("llama").verified.Store(monotime.Now())                         // no id-for-id comparison due: the counts alone
	send(s)
	send(s)
	if eq, df := val(s.check.equal), val(s.check.differ); eq != 0 || df != float64(2*len(reqs)) {
		t.Fatalf("another template: %v equal and %v different counts, want 0 and %d", eq, df, 2*len(reqs))
	}
	if n := strings.Count(log.String(), "tokenized a chat request differently"); n != 1 {
		t.Fatalf("%d warnings for one model within a minute, want 1:\n%s", n, log)
	}
	if !strings.Contains(log.String(), "ingress_tokens=") || !strings.Contains(log.String(), "engine_tokens=") {
		t.Fatalf("the warning does not give both counts:\n%s", log)
	}
}

// Under a policy that keys, three different counts in a row switch the
// model's chat to the engine's /tokenize: from then on the counts agree and
// every key is a block the engine cached.
func TestTokenCheckKeysOnEngine(t *testing.T) {
	nt, tpl := llama(t)
	s, sm, spy, log := checkEngine(t, nt, nt, toolsTemplate(t), tpl, "kvmesh")
	s.check.model("llama").verified.Store(monotime.Now()) // no id-for-id comparison due: the counts alone
	system := strings.Repeat("You answer questions about the weather in one short sentence. ", 12)
	send := func(q string) []uint64 {
		t.Helper()
		body := `{"model":"llama","max_tokens":2,"messages":[{"role":"system","content":` + string(mustJSON(t, system)) + `},{"role":"user","content":` + string(mustJSON(t, q)) + `}]}`
		if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body); st != http.StatusOK {
			t.Fatalf("status %d: %s", st, b)
		}
		return spy.last()
	}
	for _, q := range []string{"Rain?", "Snow?", "Wind?"} {
		send(q)
	}
	if df, ok := val(s.check.differ), val(s.etok.ok); df != differStreak || ok != 0 {
		t.Fatalf("%v different counts and %v engine tokenizations before the switch, want %d and 0", df, ok, differStreak)
	}
	if !strings.Contains(log.String(), "keyed on its engines' /tokenize") {
		t.Fatalf("no warning of the switch:\n%s", log)
	}
	var keys []uint64
	for _, q := range []string{"Fog?", "Hail?"} {
		keys = send(q)
	}
	if eq, df, ok := val(s.check.equal), val(s.check.differ), val(s.etok.ok); eq != 2 || df != differStreak || ok != 2 {
		t.Fatalf("after the switch: %v equal, %v different counts, %v engine tokenizations; want 2, %d, 2", eq, df, ok, differStreak)
	}
	engineCachedAll(t, sm, keys)
	// /debug/tokenizers says so.
	var ctx fasthttp.RequestCtx
	s.handleDebugTokenizers(&ctx)
	var dbg struct {
		Models map[string]struct {
			EngineTokensUntil *time.Time `json:"engine_tokens_until"`
		}
	}
	if err := json.Unmarshal(ctx.Response.Body(), &dbg); err != nil || dbg.Models["llama"].EngineTokensUntil == nil {
		t.Fatalf("/debug/tokenizers (%v): %s", err, ctx.Response.Body())
	}
}

// A text prompt the ingress tokenized goes to the engine as token ids: with
// a tokenizer other than the engine's that would change what the model
// reads. The first request per model compares its ids with the engine's
// /tokenize; when they differ it and the model's next requests are keyed on
// the engine's tokens and sent as the client wrote them. With the engine's
// own tokenizer one comparison passes and nothing changes.
func TestVerifyTokens(t *testing.T) {
	engineTok, tpl := llama(t) // the engine's tokenizer
	otherTok, _ := llama3(t)   // another vocabulary: Llama 3's
	prompt := strings.Repeat("Disaggregated prefill/decode serving cuts inter-token latency; KV-cache-aware routing matters. ", 12)
	body := `{"model":"llama","max_tokens":2,"prompt":` + string(mustJSON(t, prompt)) + `}`
	want := len(engineTok.Encode(prompt, true))
	verifyTokensRuns(t, engineTok, otherTok, tpl, body, func(t *testing.T, b []byte) {
		var r struct{ Usage openai.Usage }
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if r.Usage.PromptTokens != want {
			t.Fatalf("the engine read %d prompt tokens, its own tokenizer makes %d of the text", r.Usage.PromptTokens, want)
		}
	})
}

// verifyTokensRuns posts body three times to an ingress in front of an
// engine with engineTok, once with the ingress on another tokenizer (the
// check finds them different) and once on the engine's (equal); check
// reads each answer. The engine caches every block the ingress keyed, and
// the tokens were compared once.
func verifyTokensRuns(t *testing.T, engineTok, otherTok *tokenizer.Native, tpl *tokenizer.ChatTemplate, body string, check func(t *testing.T, answer []byte)) {
	t.Helper()
	for _, c := range []struct {
		name    string
		ingress *tokenizer.Native
		differ  bool
	}{{"other tokenizer", otherTok, true}, {"the engine's tokenizer", engineTok, false}} {
		t.Run(c.name, func(t *testing.T) {
			s, sm, spy, log := checkEngine(t, engineTok, c.ingress, tpl, tpl, "kvmesh")
			var keys []uint64
			for range 3 {
				st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
				if st != http.StatusOK {
					t.Fatalf("status %d: %s", st, b)
				}
				check(t, b)
				keys = spy.last()
			}
			engineCachedAll(t, sm, keys)
			verifiedOnce(t, s, log.String(), c.differ)
		})
	}
}

// verifiedOnce checks that three requests made one comparison with the
// engine's /tokenize: different (warned once, the two later requests then
// tokenized on the engine) or equal (nothing asked of the engine again).
func verifiedOnce(t *testing.T, s *Server, log string, differ bool) {
	t.Helper()
	eq, df := val(s.check.vEqual), val(s.check.vDiffer)
	warned := strings.Contains(log, "first_difference_at=")
	if differ && (df != 1 || eq != 0 || val(s.etok.ok) != 2 || !warned) {
		t.Fatalf("%v equal, %v different verifications, %v engine tokenizations, warned %v; want 0, 1, 2, true", eq, df, val(s.etok.ok), warned)
	}
	if !differ && (eq != 1 || df != 0 || val(s.etok.ok) != 0 || warned) {
		t.Fatalf("%v equal, %v different verifications, %v engine tokenizations, warned %v; want 1, 0, 0, false", eq, df, val(s.etok.ok), warned)
	}
}

// A batch of text prompts obeys the same check as one prompt: the first
// request compares its first prompt's ids with the engine's /tokenize; when
// they differ, that batch and the model's next ones go as the client wrote
// them, so the engine reads its own tokens of every prompt (before, a batch
// always went as the ingress's ids, whatever the check had found), keyed on
// the engine's tokens of the first prompt. With the engine's tokenizer one
// comparison passes and the batch goes as the ingress's ids, which are the
// engine's.
func TestVerifyTokensBatch(t *testing.T) {
	engineTok, tpl := llama(t) // the engine's tokenizer
	otherTok, _ := llama3(t)   // another vocabulary: Llama 3's
	prompts := []string{
		strings.Repeat("Disaggregated prefill/decode serving cuts inter-token latency; KV-cache-aware routing matters. ", 8),
		"Speculative decoding drafts tokens with a small model; the large one checks them.",
		"Prefix caching keeps the blocks of a shared system prompt.",
	}
	body := `{"model":"llama","max_tokens":2,"prompt":` + string(mustJSON(t, prompts)) + `}`
	want := 0
	for _, p := range prompts {
		want += len(engineTok.Encode(p, true))
	}
	verifyTokensRuns(t, engineTok, otherTok, tpl, body, func(t *testing.T, b []byte) {
		var r struct {
			Choices []struct{ Index int }
			Usage   openai.Usage
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		if len(r.Choices) != len(prompts) || r.Usage.PromptTokens != want {
			t.Fatalf("%d choices; the engine read %d prompt tokens, its own tokenizer makes %d of the texts", len(r.Choices), r.Usage.PromptTokens, want)
		}
	})
}
