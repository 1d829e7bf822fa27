package ratelimit

import "testing"

// KeyLimits (a JWT's rate-limit claim) wins over Keys and PerKey; a key it
// does not know falls back to them.
func TestKeyLimitsFromTheCaller(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.PerKey = Limits{InputTokens: 1000}
	cfg.KeyLimits = func(key string) (Limits, bool) {
		if key == "tenant-a" {
			return Limits{InputTokens: 100}, true
		}
		return Limits{}, false
	}
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !l.AdmitAt("tenant-a", "m", 100, c.now()).Allowed {
		t.Fatal("tenant-a refused within its claim budget")
	}
	if l.AdmitAt("tenant-a", "m", 1, c.now()).Allowed {
		t.Fatal("tenant-a admitted beyond its claim budget of 100")
	}
	if !l.AdmitAt("tenant-b", "m", 500, c.now()).Allowed {
		t.Fatal("tenant-b (no claim) refused within PerKey")
	}
}

// A claim that sets one dimension leaves the operator's limit on the other:
// {"input_tpm": 1000} does not lift --key-output-tpm.
func TestPartialClaimKeepsOperatorLimits(t *testing.T) {
	c := newClock()
	cfg := DefaultConfig()
	cfg.PerKey = Limits{InputTokens: 50, OutputTokens: 100}
	cfg.Keys = map[string]Limits{"listed": {OutputTokens: 30}}
	cfg.KeyLimits = func(string) (Limits, bool) { return Limits{InputTokens: 1000}, true }
	l, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if d := l.ReserveAt("tenant", "m", Ask{InputTokens: 1000, OutputTokens: 10}, c.now()); !d.Allowed {
		t.Fatalf("the claim's input budget of 1000 not applied: %+v", d)
	}
	if d := l.ReserveAt("tenant", "m", Ask{OutputTokens: 500}, c.now()); d.Allowed || d.Dim != "output" || d.Limit != 100 {
		t.Fatalf("500 output tokens under the operator's 100: %+v, want refused by the output limit", d)
	}
	if d := l.ReserveAt("listed", "m", Ask{OutputTokens: 40}, c.now()); d.Allowed || d.Limit != 30 {
		t.Fatalf("a listed key's output limit lost to a partial claim: %+v", d)
	}
}
