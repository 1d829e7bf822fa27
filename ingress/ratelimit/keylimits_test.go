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
