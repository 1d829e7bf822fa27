package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
)

// loraSim is a simulated vLLM engine of model llama serving the adapter
// sql-lora and flag-lora (vLLM's --enable-lora --lora-modules).
func loraSim(t *testing.T) *sim.Server {
	t.Helper()
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		LoRA:   sim.LoRAConfig{Enable: true, Modules: map[string]string{"sql-lora": "/adapters/sql", "flag-lora": "/adapters/flag"}, MaxLoRAs: 2}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	return sm
}

// adapterMembership lists one engine of llama whose sidecar gossips the
// adapters it serves (as the sidecar reads them from the engine's
// /v1/models; TestLoRADiscovered runs that path through gossip).
type adapterMembership struct {
	url   string
	loras []string
}

func (m adapterMembership) Engines(dst []EngineInfo) []EngineInfo {
	return append(dst, EngineInfo{Engine: scheduler.Engine{ID: "e", Model: "llama", Healthy: true, LoRAs: m.loras}, URL: m.url})
}

// promptOf is a completions body for model with a prompt of n token ids
// (charged as n input tokens: no tokenizer).
func promptOf(model string, n int) string {
	ids := make([]string, n)
	for i := range ids {
		ids[i] = "7"
	}
	return `{"model":"` + model + `","max_tokens":1,"prompt":[` + strings.Join(ids, ",") + `]}`
}

// TestAdapterChargesBaseModelBudget: a LoRA adapter runs on its base
// model's engines, so its requests count against the base model's token
// budget however the ingress learned the adapter: --lora-adapter, a model
// route's loraAdapters, or the engines' lists (gossip). Under a model
// budget of 10 input tokens a minute, 6 tokens for the adapter leave 4 to
// the base model and to the adapter alike, and the 429 names the base
// model's budget. (The adapters named by flag or discovered used to have a
// budget of their own under the adapter's name: every adapter added a whole
// budget on the same engines.)
func TestAdapterChargesBaseModelBudget(t *testing.T) {
	sm := loraSim(t)
	for _, tc := range []struct {
		name string
		deps func(cfg *Config, d *Deps)
	}{
		{"--lora-adapter", func(cfg *Config, _ *Deps) { cfg.LoRAAdapters = map[string]string{"sql-lora": "llama"} }},
		{"route loraAdapters", func(_ *Config, d *Deps) {
			d.Routes = routeTable(t, "routes:\n  - name: r\n    match: {model: coder}\n    backends: [{model: llama}]\n    loraAdapters: [sql-lora]\n")
		}},
		{"listed by the engines", func(_ *Config, d *Deps) {
			d.Membership = adapterMembership{url: sm.URL(), loras: []string{"sql-lora"}}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			now := time.Unix(1_800_000_000, 0).Truncate(time.Minute) // a clock that stands still
			lim, err := ratelimit.New(ratelimit.Config{PerModel: ratelimit.Limits{InputTokens: 10}, Now: func() time.Time { return now }})
			if err != nil {
				t.Fatal(err)
			}
			cfg := testConfig(StaticEngine{ID: "e", Model: "llama", URL: sm.URL()})
			deps := Deps{Limiter: lim}
			tc.deps(&cfg, &deps)
			s := startIngress(t, cfg, deps)
			url := "http://" + s.Addr() + "/v1/completions"
			client := &http.Client{Timeout: 10 * time.Second}

			if st, _, b := post(t, client, url, promptOf("sql-lora", 6)); st != http.StatusOK {
				t.Fatalf("adapter, 6 of 10 tokens: %d %s", st, b)
			}
			for _, model := range []string{"llama", "sql-lora"} {
				st, hdr, b := post(t, client, url, promptOf(model, 6))
				var e openAIError
				if st != http.StatusTooManyRequests || hdr.Get("Retry-After") == "" || json.Unmarshal(b, &e) != nil || e.Error.Type != "rate_limit_error" {
					t.Fatalf("%s after the adapter's 6 of 10 tokens: %d Retry-After %q %s; want 429 with Retry-After (the adapter charged its own budget?)",
						model, st, hdr.Get("Retry-After"), b)
				}
				if !strings.Contains(e.Error.Message, `input token budget of model "llama"`) {
					t.Errorf("%s refused with %q: want the base model llama's budget named", model, e.Error.Message)
				}
			}
			if d := lim.ReserveAt("", "llama", ratelimit.Ask{InputTokens: 4}, now); !d.Allowed {
				t.Fatalf("llama's last 4 tokens refused: %+v (charged more than the adapter's 6)", d)
			}
			if d := lim.ReserveAt("", "sql-lora", ratelimit.Ask{InputTokens: 10}, now); !d.Allowed {
				t.Fatalf("a budget under the adapter's name was charged: %+v", d)
			}
		})
	}
}

// TestBudgetRefusalNamesTheBudget: a 429 says whose budget refused the
// request. The key's own budget (20 input tokens) names the key; the
// model's (30, shared by every key), spent by another key, names the model
// and not the key that asked, which had spent little of its own.
func TestBudgetRefusalNamesTheBudget(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	lim, err := ratelimit.New(ratelimit.Config{PerKey: ratelimit.Limits{InputTokens: 20}, PerModel: ratelimit.Limits{InputTokens: 30},
		Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	keys := keyFileStore(t, "team-a sk-team-a-0123456789\nteam-d sk-team-d-0123456789\n")
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{Auth: keys, Limiter: lim})
	url := "http://" + s.Addr() + "/v1/completions"
	client := &http.Client{Timeout: 10 * time.Second}
	for i, step := range []struct {
		key    string
		tokens int
		status int
		says   string // in the 429's message
		notSay string
	}{
		{"team-a", 15, 200, "", ""},
		{"team-a", 10, 429, `input token budget of key "team-a" is spent`, `model "m"`}, // key 25 > 20, model 25 ≤ 30
		{"team-d", 10, 200, "", ""},
		{"team-d", 8, 429, `input token budget of model "m", shared by every key, is spent`, `key "team-d"`}, // key 18 ≤ 20, model 33 > 30
	} {
		st, hdr, b := post(t, client, url, promptOf("m", step.tokens), "Authorization", "Bearer sk-"+step.key+"-0123456789")
		if st != step.status {
			t.Fatalf("step %d (%s, %d tokens): %d %s, want %d", i, step.key, step.tokens, st, b, step.status)
		}
		if st != 429 {
			continue
		}
		var e openAIError
		if err := json.Unmarshal(b, &e); err != nil || e.Error.Type != "rate_limit_error" || e.Error.Code != "rate_limit_exceeded" || hdr.Get("Retry-After") == "" {
			t.Fatalf("step %d: 429 body %s Retry-After %q", i, b, hdr.Get("Retry-After"))
		}
		if !strings.Contains(e.Error.Message, step.says) || strings.Contains(e.Error.Message, step.notSay) {
			t.Errorf("step %d (%s): %q, want it to say %q and not %q", i, step.key, e.Error.Message, step.says, step.notSay)
		}
	}
}

// TestTooLargeNamesTheParamSent: a request whose output limit alone is over
// the whole output budget (2000) is refused naming the parameter the client
// sent: chat's max_completion_tokens, the Responses API's
// max_output_tokens, max_tokens otherwise.
func TestTooLargeNamesTheParamSent(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	lim, _ := budgetLimiter(t, ratelimit.Limits{OutputTokens: 2000})
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{Limiter: lim})
	client := &http.Client{Timeout: 10 * time.Second}
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, tc := range []struct{ path, body, param string }{
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_completion_tokens":2500}`, "max_completion_tokens"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_tokens":10,"max_completion_tokens":2500}`, "max_completion_tokens"},
		{"/v1/chat/completions", `{"model":"m",` + msgs + `,"max_tokens":2500}`, "max_tokens"},
		{"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1000,"n":3}`, "max_tokens"},
		{"/v1/responses", `{"model":"m","input":"hi","max_output_tokens":2500}`, "max_output_tokens"},
	} {
		st, hdr, b := post(t, client, "http://"+s.Addr()+tc.path, tc.body)
		var e openAIError
		if st != 429 || hdr.Get("Retry-After") != "" || json.Unmarshal(b, &e) != nil {
			t.Fatalf("%s %s: %d Retry-After %q %s; want 429 too large, no Retry-After", tc.path, tc.body, st, hdr.Get("Retry-After"), b)
		}
		if e.Error.Param == nil || *e.Error.Param != tc.param || !strings.Contains(e.Error.Message, "Reduce "+tc.param+" or n") {
			t.Errorf("%s %s: param %v, %q; want param %s, named in the message", tc.path, tc.body, e.Error.Param, e.Error.Message, tc.param)
		}
	}
}
