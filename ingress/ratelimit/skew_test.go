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

// Clocks in sync, b's last state of window W arrives just after a entered W+1
// (sent before the boundary, still in gossip): b's usage of W counts as a's
// previous window and nothing of it as current, so with 400 of W and 400 of
// W-1 used on b, 500 more fit a budget of 1000. Before, the late state was
// placed as a's current window and b's W-1 usage counted on top (refused for
// a gossip interval after every boundary).
func TestLateStateAtWindowBoundary(t *testing.T) {
	c := newClock() // the start of W-1
	cfg := Config{PerKey: Limits{InputTokens: 1000}}
	a, b := newLimiter(t, cfg, c), newLimiter(t, cfg, c)
	c.add(10 * time.Second)
	if !b.AdmitAt("k", "m", 400, c.now()).Allowed {
		t.Fatal("b refused 400 in W-1")
	}
	c.add(time.Minute) // W
	if !b.AdmitAt("k", "m", 400, c.now()).Allowed {
		t.Fatal("b refused 400 in W")
	}
	if err := a.MergeState("b", b.AppendState(nil, 0)); err != nil {
		t.Fatal(err)
	}
	c.add(50*time.Second - 100*time.Millisecond) // 100 ms before W+1
	late := b.AppendState(nil, 0)
	c.add(200 * time.Millisecond) // 100 ms into W+1
	if err := a.MergeState("b", late); err != nil {
		t.Fatal(err)
	}
	if r := a.AdmitAt("k", "m", 500, c.now()); !r.Allowed {
		t.Fatalf("500 refused although about 400 of 1000 is used in the sliding window: %+v", r)
	}
	if got := promtest.ToFloat64(a.metrics.skewed); got != 0 {
		t.Fatalf("a late state counted as skewed (%v)", got)
	}
}

// b's clock is a window behind a's. Its state of one window behind arrives
// just after a's boundary too, but b was already a window behind well past
// the previous boundary: its clock is behind, not its state late, so its
// current window still counts as current, as the clocks agreeing would have
// it (placeWindow). A state one window behind is kept at its own window only
// when the origin was in step until the boundary.
func TestStateAWindowBehindAtBoundary(t *testing.T) {
	c := newClock() // the start of a's window A
	cfg := Config{PerKey: Limits{InputTokens: 1000}}
	a := newLimiter(t, cfg, c)
	cfg.Now = func() time.Time { return c.now().Add(-time.Minute) }
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	c.add(70 * time.Second) // a: A+1 at 10 s; b: A at 10 s
	if !b.AdmitAt("k", "m", 400, cfg.Now()).Allowed {
		t.Fatal("b refused 400")
	}
	if err := a.MergeState("b", b.AppendState(nil, 0)); err != nil {
		t.Fatal(err)
	}
	c.add(51 * time.Second) // a: A+2 at 1 s; b: A+1 at 1 s, its 400 of A as previous
	if err := a.MergeState("b", b.AppendState(nil, 0)); err != nil {
		t.Fatal(err)
	}
	if r := a.AdmitAt("k", "m", 700, c.now()); r.Allowed {
		t.Fatal("700 admitted although b used 400 of 1000 within the last minute")
	}
	if r := a.AdmitAt("k", "m", 550, c.now()); !r.Allowed {
		t.Fatalf("550 refused with about 400 of 1000 used: %+v", r)
	}
}
