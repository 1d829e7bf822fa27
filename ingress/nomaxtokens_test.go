package ingress

import (
	"encoding/json"
	"net/http"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
)

// A request without max_tokens reserves the output it is expected to produce,
// not the key's whole budget: under a key budget of 1000 output tokens a
// minute, on an engine that reports no context length (static engines) and
// answers 300 tokens when no max_tokens is set, a second such request at the
// same instant is served (before, the first one's 300 tokens still in the
// window kept the next whole-budget reservation out for up to two minutes),
// and both are charged all they produced, beyond what they reserved.
func TestNoMaxTokensKeepsKeyUsable(t *testing.T) {
	sm := startSim(t, sim.Config{Model: "m", DefaultMaxTokens: 300})
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(20 * time.Second)
	lim, err := ratelimit.New(ratelimit.Config{PerKey: ratelimit.Limits{OutputTokens: 1000}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: sm.URL()}), Deps{Limiter: lim})
	url := "http://" + s.Addr() + "/v1/completions"
	for i := range 2 {
		st, hdr, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":[1,2,3]}`)
		if st != 200 {
			t.Fatalf("request %d without max_tokens, %d of 1000 output tokens used: %d Retry-After %q %s", i+1, 300*i, st, hdr.Get("Retry-After"), body)
		}
		var ans struct {
			Usage struct {
				CompletionTokens int `json:"completion_tokens"`
			}
		}
		if err := json.Unmarshal(body, &ans); err != nil || ans.Usage.CompletionTokens != 300 {
			t.Fatalf("answer %s (%v): want 300 completion tokens", body, err)
		}
	}
	waitSettled(t, s)
	if d := lim.ReserveAt("", "m", ratelimit.Ask{OutputTokens: 401}, now); d.Allowed {
		t.Fatal("401 more output tokens admitted under 1000 after two answers of 300: the output beyond the reservations was not charged")
	}
	if d := lim.ReserveAt("", "m", ratelimit.Ask{OutputTokens: 400}, now); !d.Allowed {
		t.Fatalf("400 output tokens refused after two answers of 300 under 1000: %+v", d)
	}
}

// contextMembership is one engine serving "m" whose sidecar reports a
// context length (max_model_len).
type contextMembership struct {
	url    string
	maxLen int
}

func (m contextMembership) Engines(dst []EngineInfo) []EngineInfo {
	return append(dst, EngineInfo{Engine: scheduler.Engine{ID: "e", Model: "m", Healthy: true}, URL: m.url, MaxModelLen: m.maxLen})
}

// A model-wide output budget holds as many requests without max_tokens as
// their expected output fits, not budget ÷ context: with 1000 output tokens a
// minute for the model, a context of 600 and no answer seen yet (128 tokens
// expected each), 7 of 10 parallel requests reach the engine and 3 get 429
// with Retry-After (before, each reserved the 597 tokens the context leaves:
// one at a time).
func TestNoMaxTokensModelBudgetNotContextBound(t *testing.T) {
	eng := startGateEngine(t)
	now := time.Unix(1_800_000_000, 0).Truncate(time.Minute)
	lim, err := ratelimit.New(ratelimit.Config{PerModel: ratelimit.Limits{OutputTokens: 1000}, Now: func() time.Time { return now }})
	if err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + eng.ln.Addr().String()})
	cfg.IdleTimeout = time.Minute
	s := startIngress(t, cfg, Deps{Limiter: lim, Membership: contextMembership{url: "http://" + eng.ln.Addr().String(), maxLen: 600}})
	url := "http://" + s.Addr() + "/v1/completions"

	b := parallelPosts(t, eng, url, `{"model":"m","prompt":[1,2,3],"max_tokens":null}`, 10) // null: up to the context (absent: 16)
	testutil.WaitFor(t, 10*time.Second, "every request at the engine or refused", func() bool { return len(eng.arrived())+b.refused() == 10 })
	if at, n := len(eng.arrived()), b.refused(); at != 7 || n != 3 {
		t.Fatalf("10 parallel requests without max_tokens under a model budget of 1000, context 600: %d at the engine, %d refused; want 7 and 3", at, n)
	}
	for range eng.arrived() {
		eng.gate <- struct{}{}
	}
	if got := b.answered(); got != 7 {
		t.Errorf("%d answered, want 7", got)
	}
}
