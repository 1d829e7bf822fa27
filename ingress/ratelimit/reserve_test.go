package ratelimit

import (
	"encoding/binary"
	"testing"
	"time"
)

// Parallel requests reserve their max_tokens at admission: under a 100-token output
// budget five requests of max_tokens 20 are in flight at once, not twenty, and one
// that alone asks more than the budget (n 20 × max_tokens 500) is refused as too
// large instead of admitted.
func TestReserveBoundsParallelOutput(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{OutputTokens: 100}}, c)
	for i := 0; i < 20; i++ {
		d := l.ReserveAt("a", "m", Ask{InputTokens: 5, OutputTokens: 500}, c.now())
		if d.Allowed || !d.TooLarge || d.Limit != 100 || d.Requested != 500 || d.Scope != "key" || d.Dim != "output" {
			t.Fatalf("max_tokens 500 under a budget of 100: %+v, want refused as too large", d)
		}
	}
	if d := l.ReserveAt("a", "m", Ask{OutputTokens: 20 * 500}, c.now()); !d.TooLarge || d.Requested != 10_000 {
		t.Fatalf("n 20 × max_tokens 500: %+v, want too large, requested 10000", d)
	}
	var held []Reservation
	for i := 0; i < 20; i++ {
		d := l.ReserveAt("a", "m", Ask{InputTokens: 5, OutputTokens: 20}, c.now())
		if d.Allowed {
			held = append(held, d.Reservation)
			continue
		}
		if d.TooLarge || d.Dim != "output" || d.RetryAfter <= 0 {
			t.Fatalf("request %d refused as %+v, want an output refusal with a Retry-After", i, d)
		}
	}
	if len(held) != 5 {
		t.Fatalf("%d requests of max_tokens 20 admitted at once under 100, want 5", len(held))
	}
	// They answer 1 token each: the 95 unused are released.
	for _, r := range held {
		l.SettleAt("a", "m", r, 1, c.now())
	}
	n := 0
	for l.ReserveAt("a", "m", Ask{OutputTokens: 20}, c.now()).Allowed {
		n++
	}
	if n != 4 { // 5 used, 95 left: four more of 20
		t.Fatalf("after settling, %d more admitted, want 4", n)
	}
}

// Without max_tokens a request reserves the output it is expected to produce or, when
// nothing is expected or that is larger, the scope's whole limit; it is never too large.
func TestReserveUnbounded(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerModel: Limits{OutputTokens: 100}}, c)
	d := l.ReserveAt("a", "m", Ask{Unbounded: true}, c.now())
	if !d.Allowed {
		t.Fatalf("first unbounded request refused: %+v", d)
	}
	if d2 := l.ReserveAt("b", "m", Ask{Unbounded: true, OutputTokens: 1}, c.now()); d2.Allowed {
		t.Fatal("a second request admitted while the first holds the whole budget")
	}
	l.SettleAt("a", "m", d.Reservation, 0, c.now())
	for i := 0; i < 2; i++ {
		if !l.ReserveAt("b", "m", Ask{Unbounded: true, OutputTokens: 50}, c.now()).Allowed {
			t.Fatalf("request %d expecting 50 tokens refused", i)
		}
	}
	if l.ReserveAt("b", "m", Ask{Unbounded: true, OutputTokens: 50}, c.now()).Allowed {
		t.Fatal("third request expecting 50 tokens admitted under 100")
	}
	if d := l.ReserveAt("b", "m", Ask{Unbounded: true, OutputTokens: 1 << 30}, c.now()); d.TooLarge {
		t.Fatalf("unbounded request refused as too large: %+v", d)
	}
}

// What a request produces beyond its reservation (and a prompt larger than the
// limit) is a debt paid off a limit per window, not forgotten after two windows.
func TestDebtIsCarriedNotForgotten(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 100, OutputTokens: 100}}, c)
	d := l.ReserveAt("a", "m", Ask{Unbounded: true}, c.now())
	if !d.Allowed {
		t.Fatal(d)
	}
	l.SettleAt("a", "m", d.Reservation, 1000, c.now()) // 900 beyond the reservation of 100
	for _, tc := range []struct {
		at   time.Duration
		want bool
	}{
		{3 * time.Minute, false},  // forgotten here before
		{9 * time.Minute, false},  // 1000 tokens at 100 a minute
		{12 * time.Minute, true},  // paid off
		{12 * time.Minute, false}, // and counting again
	} {
		got := l.ReserveAt("a", "m", Ask{OutputTokens: 100}, newClock().t.Add(tc.at)).Allowed
		if got != tc.want {
			t.Fatalf("after %v: admitted %v, want %v", tc.at, got, tc.want)
		}
	}
	// The same for a prompt of 1,000 tokens under an input limit of 100: admitted
	// into an idle window, then refused until it is paid.
	c2 := newClock()
	l2 := newLimiter(t, Config{PerKey: Limits{InputTokens: 100}}, c2)
	if !l2.AdmitAt("a", "m", 1000, c2.now()).Allowed {
		t.Fatal("oversized prompt refused in an idle window")
	}
	if d := l2.AdmitAt("a", "m", 10, c2.now().Add(3*time.Minute)); d.Allowed || d.RetryAfter < 5*time.Minute {
		t.Fatalf("3 minutes after 1,000 prompt tokens under 100/min: %+v, want refused for minutes", d)
	}
	if !l2.AdmitAt("a", "m", 10, c2.now().Add(12*time.Minute)).Allowed {
		t.Fatal("still refused once the debt is paid")
	}
}

// Settle releases the unused reservation in the window it was made in, also once that
// window has become the previous one; a reservation older than that is not touched.
func TestSettleAcrossWindows(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{OutputTokens: 100}}, c)
	d := l.ReserveAt("a", "m", Ask{OutputTokens: 80}, c.now())
	if !d.Allowed {
		t.Fatal(d)
	}
	c.add(61 * time.Second)
	if l.ReserveAt("a", "m", Ask{OutputTokens: 90}, c.now()).Allowed {
		t.Fatal("80 reserved a second ago, 90 more admitted under 100")
	}
	l.SettleAt("a", "m", d.Reservation, 10, c.now()) // 70 freed in the previous window
	if !l.ReserveAt("a", "m", Ask{OutputTokens: 90}, c.now()).Allowed {
		t.Fatal("the unused reservation was not released")
	}
	old := l.ReserveAt("b", "m", Ask{OutputTokens: 50}, c.now())
	c.add(3 * time.Minute)
	l.SettleAt("b", "m", old.Reservation, 0, c.now()) // its window is gone: nothing to do
	if !l.ReserveAt("b", "m", Ask{OutputTokens: 100}, c.now()).Allowed {
		t.Fatal("a stale settle changed the counts")
	}
}

// Reservations and their release travel through the shared state: a replica sees
// another's output reserved in flight, and sees it released when that one settles.
func TestReservationsSharedThroughState(t *testing.T) {
	c := newClock()
	cfg := Config{PerKey: Limits{OutputTokens: 100}}
	a, b := newLimiter(t, cfg, c), newLimiter(t, cfg, c)
	exchange := func() {
		t.Helper()
		if err := b.MergeState("a", a.AppendState(nil, 0)); err != nil {
			t.Fatal(err)
		}
	}
	d := a.ReserveAt("k", "m", Ask{OutputTokens: 60}, c.now())
	if !d.Allowed {
		t.Fatal(d)
	}
	exchange()
	if b.ReserveAt("k", "m", Ask{OutputTokens: 60}, c.now()).Allowed {
		t.Fatal("b admitted 60 while a holds 60 of 100")
	}
	older := a.AppendState(nil, 0)
	a.SettleAt("k", "m", d.Reservation, 10, c.now())
	exchange()
	if err := b.MergeState("a", older); err != nil { // reordered gossip changes nothing
		t.Fatal(err)
	}
	if !b.ReserveAt("k", "m", Ask{OutputTokens: 60}, c.now()).Allowed {
		t.Fatal("b did not see a release its reservation")
	}
	if b.ReserveAt("k", "m", Ask{OutputTokens: 40}, c.now()).Allowed {
		t.Fatal("b forgot a's 10 tokens")
	}
}

// A replica that has not been upgraded still sends version 1 states; they are read.
func TestMergeVersion1State(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{InputTokens: 1000}}, c)
	w := c.now().UnixNano() / int64(time.Minute)
	b := []byte{1}
	b = binary.AppendUvarint(b, uint64(time.Minute.Milliseconds()))
	b = binary.AppendVarint(b, w)
	b = binary.AppendUvarint(b, 1)
	b = binary.LittleEndian.AppendUint64(b, hashKey("k"))
	for _, v := range []uint64{900, 0, 0, 0} {
		b = binary.AppendUvarint(b, v)
	}
	if err := l.MergeState("old", b); err != nil {
		t.Fatal(err)
	}
	if l.AdmitAt("k", "m", 200, c.now()).Allowed {
		t.Fatal("a version 1 state's usage not counted")
	}
}

// A replica's released output never goes below zero, so a bad state cannot cancel
// the other replicas' usage.
func TestFreedNeverCancelsOthers(t *testing.T) {
	c := newClock()
	l := newLimiter(t, Config{PerKey: Limits{OutputTokens: 100}}, c)
	l.ObserveAt("k", "m", 90, c.now())
	w := c.now().UnixNano() / int64(time.Minute)
	b := []byte{stateVersion}
	b = binary.AppendUvarint(b, uint64(time.Minute.Milliseconds()))
	b = binary.AppendVarint(b, w)
	b = binary.AppendUvarint(b, 1)
	b = binary.LittleEndian.AppendUint64(b, hashKey("k"))
	for _, v := range []uint64{0, 0, 0, 0, 1000, 1000} { // freed more than it charged
		b = binary.AppendUvarint(b, v)
	}
	if err := l.MergeState("liar", b); err != nil {
		t.Fatal(err)
	}
	if l.ReserveAt("k", "m", Ask{OutputTokens: 20}, c.now()).Allowed {
		t.Fatal("another replica's freed counts cancelled this one's usage")
	}
}
