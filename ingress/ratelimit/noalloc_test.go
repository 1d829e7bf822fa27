//go:build !race

package ratelimit

import "testing"

// The request path's calls allocate nothing once a scope is tracked.
func TestReserveSettleNoAlloc(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}, PerModel: Limits{OutputTokens: 1 << 50}}, c)
	a := Ask{InputTokens: 2048, OutputTokens: 64}
	l.SettleAt("alice", "m", l.ReserveAt("alice", "m", a, c.now()).Reservation, 10, c.now())
	if n := testing.AllocsPerRun(1000, func() {
		d := l.ReserveAt("alice", "m", a, c.now())
		l.SettleAt("alice", "m", d.Reservation, 10, c.now())
	}); n != 0 {
		t.Fatalf("%v allocations per Reserve and Settle", n)
	}
}
