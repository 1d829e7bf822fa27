package routes

import (
	"math/rand/v2"
	"testing"
	"time"
)

func mustTable(t testing.TB, y string) *Table {
	t.Helper()
	c, err := Parse([]byte(y))
	if err != nil {
		t.Fatal(err)
	}
	return NewTable(c, nil)
}

func headers(h map[string]string) func(string) []byte {
	return func(name string) []byte {
		if v, ok := h[name]; ok {
			return []byte(v)
		}
		return nil
	}
}

func TestMatch(t *testing.T) {
	tb := mustTable(t, exampleYAML)
	beta := headers(map[string]string{"X-Tenant": "beta"})
	cases := []struct {
		model, path string
		h           func(string) []byte
		want        string // route name, "" for none
	}{
		{"chat", "/v1/chat/completions", beta, "chat-canary"},
		{"chat", "/v1/completions", beta, ""},                                                // path prefix
		{"chat", "/v1/chat/completions", headers(nil), ""},                                   // header missing
		{"chat", "/v1/chat/completions", headers(map[string]string{"X-Tenant": "Beta"}), ""}, // value is exact
		{"sql-lora", "/v1/chat/completions", beta, "chat-canary"},                            // adapter
		{"llama-70b", "/v1/completions", headers(nil), "llamas"},                             // prefix
		{"llama", "/v1/completions", headers(nil), ""},
		{"other", "/v1/completions", headers(nil), ""},
	}
	for _, tc := range cases {
		r, ok := tb.Match(tc.model, tc.path, tc.h)
		got := ""
		if ok {
			got = r.Name()
		}
		if got != tc.want {
			t.Errorf("Match(%q, %q) = %q, want %q", tc.model, tc.path, got, tc.want)
		}
	}
	r, _ := tb.Match("sql-lora", "/v1/chat/x", beta)
	if !r.IsAdapter("sql-lora") || r.IsAdapter("chat") {
		t.Error("IsAdapter")
	}
}

// TestPickFollowsWeights checks the pick's exact proportions: over a full
// cycle of rnd values every backend gets exactly its weight.
func TestPickFollowsWeights(t *testing.T) {
	tb := mustTable(t, exampleYAML)
	r := &tb.routes[0]
	n := map[string]int{}
	for x := uint64(0); x < 100; x++ {
		n[r.Pick(x)]++
	}
	if n["llama-8b"] != 80 || n["llama-8b-next"] != 20 {
		t.Fatalf("picks %v, want 80/20", n)
	}
}

func TestRateLimitBucket(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	b := newBucket(RateLimit{RequestsPerMinute: 2, InputTokensPerMinute: 100}, now)
	if _, ok := b.admit(now, 10); !ok {
		t.Fatal("first refused")
	}
	if _, ok := b.admit(now, 10); !ok {
		t.Fatal("second refused")
	}
	wait, ok := b.admit(now, 10)
	if ok || wait != 30*time.Second {
		t.Fatalf("third: ok=%v wait=%v, want refused for 30s", ok, wait)
	}
	now = now.Add(30 * time.Second) // +1 request, +50 tokens (80+50 capped at 100)
	if _, ok := b.admit(now, 90); !ok {
		t.Fatal("refused after refill")
	}
	if wait, ok := b.admit(now, 10); ok || wait != 30*time.Second {
		t.Fatalf("no request left: ok=%v wait=%v, want 30s", ok, wait)
	}
	// A request larger than a minute's budget passes on a full bucket.
	big := newBucket(RateLimit{InputTokensPerMinute: 100}, now)
	if _, ok := big.admit(now, 150); !ok {
		t.Fatal("oversized request refused on a full bucket")
	}
	if wait, ok := big.admit(now, 10); ok || wait != 36*time.Second {
		t.Fatalf("after debt: ok=%v wait=%v, want 36s (60 tokens at 100/min)", ok, wait)
	}
}

func TestRateLimitCarriesOverReload(t *testing.T) {
	y := "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: [{name: a, backends: [{model: m}], rateLimit: {requestsPerMinute: 1}}]"
	t1 := mustTable(t, y)
	now := time.Now()
	if _, ok := t1.routes[0].Admit(now, 1); !ok {
		t.Fatal("first refused")
	}
	c, _ := Parse([]byte(y))
	t2 := NewTable(c, t1)
	if _, ok := t2.routes[0].Admit(now, 1); ok {
		t.Fatal("reload refilled an unchanged route's budget")
	}
}

func TestMatchAndPickAllocateNothing(t *testing.T) {
	tb := mustTable(t, exampleYAML)
	h := headers(map[string]string{"X-Tenant": "beta"})
	allocs := testing.AllocsPerRun(1000, func() {
		r, ok := tb.Match("llama-70b", "/v1/chat/completions", h)
		if !ok {
			t.Fatal("no match")
		}
		_ = r.Pick(rand.Uint64())
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per match+pick", allocs)
	}
}

func BenchmarkMatchPick(b *testing.B) {
	tb := mustTable(b, exampleYAML)
	val := []byte("beta")
	h := func(name string) []byte {
		if name == "X-Tenant" {
			return val
		}
		return nil
	}
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		r, _ := tb.Match("chat", "/v1/chat/completions", h)
		_ = r.Pick(rand.Uint64())
	}
}
