package ingress

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
)

// idsPrompt is a completions body whose prompt is n token ids.
func idsPrompt(n int) string {
	var b strings.Builder
	b.WriteString(`{"model":"m","max_tokens":1,"prompt":[`)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteByte('1')
	}
	b.WriteString(`]}`)
	return b.String()
}

// atEngine takes the completions requests the engine received since the
// last call (its health probes are not counted).
func atEngine(fe *faultEngine) (n int) {
	for {
		select {
		case b := <-fe.bodies:
			if bytes.Contains(b, []byte(`"prompt"`)) {
				n++
			}
		default:
			return n
		}
	}
}

// The prompt limit is the served model's context length as its engines
// report it (max_model_len), capped by maxPromptTokens only when that is
// set: a long-context model takes a prompt past 131072 tokens (the limit
// the ingress imposed by default before, refusing what the engine would
// serve), a prompt past the engines' context is refused with 400
// context_length_exceeded before any engine sees it, an operator's cap
// holds below the context, and a model whose engines report no context
// length has no limit but the body size.
func TestPromptLimitFollowsTheEnginesContext(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cases := []struct {
		name    string
		maxLen  int // the engines' max_model_len (0: not reported)
		limit   int // maxPromptTokens
		prompt  int
		refused bool
		says    string
	}{
		{"a long-context model, no cap", 200_000, 0, 150_000, false, ""},
		{"past the engines' context", 200_000, 0, 200_001, true, "maximum context length is 200000 tokens"},
		{"under the operator's cap", 200_000, 1000, 1000, false, ""},
		{"past the operator's cap", 200_000, 1000, 1001, true, "maximum context length is 1000 tokens"},
		{"a cap above the context", 500, 1000, 501, true, "maximum context length is 500 tokens"},
		{"no context reported, no cap", 0, 0, 250_000, false, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
			if tc.limit > 0 {
				cfg.MaxPromptTokens = tc.limit
			}
			s := startIngress(t, cfg, Deps{Membership: contextMembership{url: fe.url(), maxLen: tc.maxLen}})
			atEngine(fe) // what earlier cases left
			st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", idsPrompt(tc.prompt))
			reached := atEngine(fe)
			if !tc.refused {
				if st != 200 || reached != 1 {
					t.Fatalf("a prompt of %d tokens, context %d, cap %d: %d, %d requests at the engine, %.200s; want 200 from the engine",
						tc.prompt, tc.maxLen, tc.limit, st, reached, body)
				}
				return
			}
			if st != 400 || !strings.Contains(string(body), "context_length_exceeded") || !strings.Contains(string(body), tc.says) || reached != 0 {
				t.Fatalf("a prompt of %d tokens, context %d, cap %d: %d, %d requests at the engine, %s; want 400 context_length_exceeded (%s), none at the engine",
					tc.prompt, tc.maxLen, tc.limit, st, reached, body, tc.says)
			}
		})
	}
}

// A prompt past the limit is refused naming the member that holds it on
// its endpoint (OpenAI's param: "messages" on chat, "input" on the
// Responses API), not "prompt" everywhere: a client that points at
// err.param must find the field in its own request.
func TestPromptTooLongNamesTheEndpointsMember(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.MaxPromptTokens = 100
	s := startIngress(t, cfg, Deps{})
	long := strings.Repeat("x", 4000)
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/completions", `{"model":"m","prompt":"` + long + `"}`, `"param":"prompt"`},
		{"/v1/chat/completions", `{"model":"m","messages":[{"role":"user","content":"` + long + `"}]}`, `"param":"messages"`},
		{"/v1/responses", `{"model":"m","input":"` + long + `"}`, `"param":"input"`},
	} {
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, tc.body)
		if st != 400 || !strings.Contains(string(body), "context_length_exceeded") || !strings.Contains(string(body), tc.param) {
			t.Errorf("%s over the limit: %d %s; want 400 context_length_exceeded with %s", tc.path, st, body, tc.param)
		}
	}
}

// engineList is a FAKE membership: the engines as gossip would list them.
type engineList []EngineInfo

func (m engineList) Engines(dst []EngineInfo) []EngineInfo { return append(dst, m...) }

// Engines of one model with different context lengths (--max-model-len
// per GPU type): a prompt longer than one engine's context goes to an
// engine whose context holds it, even when the short one is the less
// loaded; a prompt both hold goes to the less loaded. Before, the short
// engine got it and answered 400. The same for a prompt whose max_tokens
// only the long context holds (fault tester: max_tokens 30000 went to a
// 16384-token engine, which refused it).
func TestPromptGoesToAnEngineWhoseContextHoldsIt(t *testing.T) {
	short, long := startFaultEngine(t, faultOK), startFaultEngine(t, faultOK)
	mem := engineList{
		{Engine: scheduler.Engine{ID: "short", Model: "m", Healthy: true}, URL: short.url(), MaxModelLen: 100},
		{Engine: scheduler.Engine{ID: "long", Model: "m", Healthy: true, InFlight: 50}, URL: long.url(), MaxModelLen: 1000},
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "short", Model: "m", URL: short.url()}), Deps{Membership: mem})
	// The prompt and its max_tokens must fit, as vLLM refuses a max_tokens
	// past the context after the prompt; when no context holds both, the
	// longest context's engine gets it: its refusal names the most the
	// model can give (the short one's told the client to shrink more).
	for _, tc := range []struct {
		prompt, maxTokens int
		at                string
	}{{500, 1, "long"}, {99, 1, "short"}, {100, 1, "long"}, {101, 1, "long"}, {50, 80, "long"}, {50, 50, "short"}, {50, 2000, "long"}} {
		for range 3 {
			body := strings.Replace(idsPrompt(tc.prompt), `"max_tokens":1,`, `"max_tokens":`+strconv.Itoa(tc.maxTokens)+`,`, 1)
			st, h, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
			if st != 200 || h.Get("X-Kvmesh-Engine") != tc.at {
				t.Fatalf("a prompt of %d tokens, max_tokens %d, contexts 100 (idle) and 1000 (busy): %d at %q, %.200s; want 200 from %s",
					tc.prompt, tc.maxTokens, st, h.Get("X-Kvmesh-Engine"), b, tc.at)
			}
		}
	}
}

// An estimated count (no tokenizer for the model, no engine's /tokenize
// answer: about 4 bytes a token) over the engines' context but within
// estimateSlack of it goes to the engine, which counts it: 1,000 bytes may be
// 125 tokens of a tokenizer that merges long runs, and the ingress does not
// refuse on a guess. The operator's maxPromptTokens has no slack: no engine
// enforces it, so an estimate past it is refused (tester h-reg6 F2: a cap of
// 1,000 let a prompt the engine counted 14,999 tokens through).
func TestEstimatedPromptLimit(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	mid := strings.Repeat("x", 1000) // about 250 tokens estimated
	bodies := map[string]string{
		`{"model":"m","prompt":"` + mid + `"}`:                               "/v1/completions",
		`{"model":"m","prompt":["` + mid + `","y"]}`:                         "/v1/completions",
		`{"model":"m","messages":[{"role":"user","content":"` + mid + `"}]}`: "/v1/chat/completions",
	}
	for _, tc := range []struct {
		name          string
		maxLen, limit int
		refused       bool
	}{
		{"the engines' context of 100: within the slack", 100, 0, false},
		{"the operator's cap of 100: no slack", 0, 100, true},
		{"a cap of 100 below a context of 1000", 1000, 100, true},
		{"the engines' context of 50: past the slack", 50, 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
			cfg.MaxPromptTokens = tc.limit
			s := startIngress(t, cfg, Deps{Membership: contextMembership{url: fe.url(), maxLen: tc.maxLen}})
			for body, path := range bodies {
				st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+path, body)
				if tc.refused && (st != 400 || !strings.Contains(string(b), "has about")) {
					t.Errorf("%s: %d %s; want 400 context_length_exceeded on the estimate", body[:40], st, b)
				}
				if !tc.refused && st != 200 {
					t.Errorf("%s: %d %s; want the engine's 200", body[:40], st, b)
				}
			}
		})
	}
}
