package ratelimit

import (
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A budget shared by two replicas whose clocks disagree holds: 1,000 input
// tokens a minute for a key, 100-token requests alternating between the
// replicas with the states exchanged after each (a gossip interval per
// request). Before, a replica a window or more off counted only its own
// usage, and the other ignored it (20 admitted where 10 fit); one a fraction
// of a window behind had the other's usage faded as a previous window's.
// Then the skewed clock is corrected (stepped back to agree): the minute's
// usage still counts on both (before, the corrected replica's counts stayed
// in its old future window, unpublished, and the other ignored its states as
// older), and two minutes later the whole budget is there again, shared.
// Skews over a window are counted and logged, naming the replica.
func TestSharedBudgetUnderClockSkew(t *testing.T) {
	for _, skew := range []time.Duration{
		10 * time.Minute, -10 * time.Minute,
		10*time.Minute + 30*time.Second, -(10*time.Minute + 30*time.Second),
		90 * time.Second, -90 * time.Second,
		30 * time.Second, -30 * time.Second,
	} {
		t.Run(skew.String(), func(t *testing.T) {
			c := &clock{t: time.Unix(1_800_000_000, 0).Truncate(time.Minute).Add(20 * time.Second)}
			var off atomic.Int64
			off.Store(int64(skew))
			var logs testutil.SyncBuffer
			cfg := Config{PerKey: Limits{InputTokens: 1000}, Logger: slog.New(slog.NewTextHandler(&logs, nil))}
			a := newLimiter(t, cfg, c)
			cfg.Now = func() time.Time { return c.now().Add(time.Duration(off.Load())) }
			b, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			exchange := func() {
				t.Helper()
				if err := a.MergeState("b", b.AppendState(nil, 0)); err != nil {
					t.Fatal(err)
				}
				if err := b.MergeState("a", a.AppendState(nil, 0)); err != nil {
					t.Fatal(err)
				}
			}
			round := func(n int) (admitted int) {
				t.Helper()
				for i := range n {
					l := a
					if i%2 == 1 {
						l = b
					}
					if _, ok := l.Admit("k", "m", 100); ok {
						admitted++
					}
					exchange()
				}
				return admitted
			}
			if got := round(40); got != 10 {
				t.Fatalf("skew %v: %d requests of 100 admitted against a shared budget of 1000", skew, got)
			}
			overWindow := skew > 2*time.Minute || skew < -2*time.Minute
			if overWindow {
				if promtest.ToFloat64(a.metrics.skewed) == 0 || promtest.ToFloat64(b.metrics.skewed) == 0 {
					t.Fatal("skewed states not counted")
				}
				for _, want := range []string{"origin=b", "origin=a", "more than a window off", "skew="} {
					if !strings.Contains(logs.String(), want) {
						t.Fatalf("no warning with %q:\n%s", want, logs.String())
					}
				}
			}

			// The clock is corrected, a second later: this minute's usage
			// still counts, on both replicas. Stepped back, b keeps its
			// counts as current. Stepped forward, b's own usage looks older
			// by the step, as if b had been idle that long: up to that
			// fraction of it (all of it past a window) is not counted.
			off.Store(0)
			c.add(time.Second)
			exchange()
			allowed := 0 // more admitted this minute
			if skew < 0 {
				allowed = int(min(float64(-skew)/float64(time.Minute), 1) * 5) // b admitted 5 of the 10
			}
			if got := round(20); got > allowed {
				t.Fatalf("after the clock was corrected, %d more admitted within the same minute (tolerance %d)", got, allowed)
			}
			// Every two minutes on, the whole budget again, shared. A clock
			// stepped back by less than two windows keeps b's old counts a
			// window newer than they are: the first time, up to b's usage of
			// a window (5) is still counted, never more than the budget
			// admitted.
			for i := range 3 {
				c.add(2 * time.Minute)
				exchange()
				least := 10
				if i == 0 && skew > 0 && skew < 2*time.Minute {
					least = 5
				}
				if got := round(40); got > 10 || got < least {
					t.Fatalf("%d minutes after the correction: %d requests of 100 admitted against a shared budget of 1000 (want %d to 10)", 2*(i+1), got, least)
				}
			}
			if overWindow && skew > 0 && !strings.Contains(logs.String(), "stepped back") {
				t.Fatalf("the clock stepping back not logged:\n%s", logs.String())
			}
		})
	}
}
