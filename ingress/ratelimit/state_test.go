package ratelimit

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// TestClusterWideThroughState runs two replicas that exchange state the way gossip
// would: each alone would admit the full limit; together they hold the cluster to it.
func TestClusterWideThroughState(t *testing.T) {
	c := newClock()
	cfg := Config{PerKey: Limits{InputTokens: 1000}}
	a, b := newLimiter(t, cfg, c), newLimiter(t, cfg, c)
	exchange := func() {
		t.Helper()
		if err := b.MergeState("a", a.AppendState(nil, 0)); err != nil {
			t.Fatal(err)
		}
		if err := a.MergeState("b", b.AppendState(nil, 0)); err != nil {
			t.Fatal(err)
		}
	}
	if !a.AdmitAt("k", "m", 600, c.now()).Allowed || !b.AdmitAt("k", "m", 300, c.now()).Allowed {
		t.Fatal("first requests refused")
	}
	exchange()
	if a.AdmitAt("k", "m", 200, c.now()).Allowed {
		t.Fatal("replica a ignored b's usage")
	}
	if b.AdmitAt("k", "m", 200, c.now()).Allowed {
		t.Fatal("replica b ignored a's usage")
	}
	if !b.AdmitAt("k", "m", 100, c.now()).Allowed {
		t.Fatal("remaining 100 tokens refused")
	}
	// Standalone: without the exchange a third replica admits the whole limit locally.
	solo := newLimiter(t, cfg, c)
	if !solo.AdmitAt("k", "m", 1000, c.now()).Allowed {
		t.Fatal("standalone limiter refused its own limit")
	}
	// A departed replica's usage stops counting.
	a.ForgetOrigin("b")
	if !a.AdmitAt("k", "m", 400, c.now()).Allowed {
		t.Fatal("usage of a forgotten origin still counted")
	}
}

func TestMergeRule(t *testing.T) {
	c := newClock()
	cfg := Config{PerKey: Limits{InputTokens: 1000}}
	src := newLimiter(t, cfg, c)
	dst := newLimiter(t, cfg, c)

	src.AdmitAt("k", "m", 300, c.now())
	older := src.AppendState(nil, 0)
	src.AdmitAt("k", "m", 400, c.now())
	newer := src.AppendState(nil, 0)

	// Reordered delivery: newer then older within one window keeps the max (700).
	for _, p := range [][]byte{newer, older} {
		if err := dst.MergeState("src", p); err != nil {
			t.Fatal(err)
		}
	}
	if dst.AdmitAt("k", "m", 301, c.now()).Allowed {
		t.Fatal("older state lowered the merged counter")
	}
	if !dst.AdmitAt("k", "m", 300, c.now()).Allowed {
		t.Fatal("merged counter too high")
	}

	// A state from a later window replaces the old one; one a window earlier
	// (reordered across a boundary) is ignored. More than a window earlier is the
	// origin's clock stepping back, a reset (TestSharedBudgetUnderClockSkew).
	c.add(2 * time.Minute)
	fresh := newLimiter(t, cfg, c)
	fresh.AdmitAt("k", "m", 100, c.now())
	later := fresh.AppendState(nil, 0)
	before := &clock{t: c.now().Add(-time.Minute)}
	old := newLimiter(t, cfg, before)
	old.AdmitAt("k", "m", 700, before.now())
	stale := old.AppendState(nil, 0)
	dst2 := newLimiter(t, cfg, c)
	if err := dst2.MergeState("src", later); err != nil {
		t.Fatal(err)
	}
	if err := dst2.MergeState("src", stale); err != nil { // a window old
		t.Fatal(err)
	}
	if !dst2.AdmitAt("k", "m", 900, c.now()).Allowed {
		t.Fatal("stale window state counted")
	}
}

func TestAppendStateBoundedBusiestFirst(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1 << 40}}, c)
	for i := 0; i < 200; i++ {
		l.AdmitAt(fmt.Sprintf("key-%d", i), "m", i+1, c.now())
	}
	b := l.AppendState([]byte("prefix"), 300)
	if string(b[:6]) != "prefix" {
		t.Fatal("dst prefix lost")
	}
	b = b[6:]
	if len(b) > 300 {
		t.Fatalf("state %d bytes > 300", len(b))
	}
	_, _, scopes, err := decodeState(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(scopes) < 10 {
		t.Fatalf("only %d scopes fit in 300 bytes", len(scopes))
	}
	// The busiest key (key-199, 200 tokens) must be among them, the idlest must not.
	if _, ok := scopes[hashKey("key-199")]; !ok {
		t.Fatal("busiest scope dropped")
	}
	if _, ok := scopes[hashKey("key-0")]; ok {
		t.Fatal("idlest scope kept over busier ones")
	}
}

func TestMergeStateRejects(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
	other := newLimiter(t, Config{Window: 30 * time.Second, PerKey: Limits{InputTokens: 1000}}, c)
	other.AdmitAt("k", "m", 10, c.now())
	if err := l.MergeState("o", other.AppendState(nil, 0)); !errors.Is(err, ErrOldWindow) {
		t.Fatalf("window mismatch: err = %v", err)
	}
	good := func() []byte {
		s := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
		s.AdmitAt("k", "m", 5, c.now())
		return s.AppendState(nil, 0)
	}()
	for name, b := range map[string][]byte{
		"empty":     nil,
		"version":   append([]byte{9}, good[1:]...),
		"truncated": good[:len(good)-1],
		"trailing":  append(append([]byte{}, good...), 0),
		"count":     {1, 0xe0, 0xd4, 0x03, 0x00, 0xff, 0xff, 0x03},
	} {
		if err := l.MergeState("x", b); !errors.Is(err, ErrBadState) {
			t.Errorf("%s: err = %v, want ErrBadState", name, err)
		}
	}
	if err := l.MergeState("x", good); err != nil {
		t.Fatalf("good state after bad ones: %v", err)
	}
}

func TestMaxOrigins(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}, MaxOrigins: 1}, c)
	s := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
	s.AdmitAt("k", "m", 5, c.now())
	st := s.AppendState(nil, 0)
	if err := l.MergeState("a", st); err != nil {
		t.Fatal(err)
	}
	if err := l.MergeState("b", st); !errors.Is(err, ErrBadState) {
		t.Fatalf("second origin over the bound: err = %v", err)
	}
	c.add(3 * time.Minute) // a's state is stale now and may be replaced
	st = s.AppendState(nil, 0)
	if err := l.MergeState("b", st); err != nil {
		t.Fatalf("stale origin not evicted: %v", err)
	}
}

func hashKey(k string) uint64 { return xxh3.HashStringSeed(k, seedKey) }

func FuzzMergeState(f *testing.F) {
	c := newClock()
	s, _ := New(Config{PerKey: Limits{InputTokens: 1000}, PerModel: Limits{OutputTokens: 100}, Now: c.now})
	f.Add([]byte{})
	f.Add(s.AppendState(nil, 0))
	for i := 0; i < 5; i++ {
		s.AdmitAt(fmt.Sprint("k", i), "m", 10*i, c.now())
		s.ObserveAt(fmt.Sprint("k", i), "m", i, c.now())
	}
	f.Add(s.AppendState(nil, 0))
	f.Add([]byte{1, 0xe0, 0xd4, 0x03, 0x00, 0x01})
	f.Fuzz(func(t *testing.T, b []byte) {
		l, _ := New(Config{PerKey: Limits{InputTokens: 1000}, Now: c.now})
		err := l.MergeState("o", b)
		if err == nil {
			// Whatever was accepted round-trips through decode with the same scopes.
			_, _, scopes, derr := decodeState(b)
			if derr != nil {
				t.Fatalf("accepted then failed to decode: %v", derr)
			}
			if len(l.origins["o"].scopes) != len(scopes) {
				t.Fatal("merged scope count differs")
			}
		}
		// The running sums follow whatever was merged, merged again by
		// another origin, and forgotten.
		checkSums(t, l)
		_ = l.MergeState("p", b)
		_ = l.MergeState("o", b)
		checkSums(t, l)
		l.ForgetOrigin("o")
		checkSums(t, l)
		l.AdmitAt("k0", "m", 10, c.now()) // must not panic whatever was merged
	})
}
