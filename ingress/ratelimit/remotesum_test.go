package ratelimit

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/zeebo/xxh3"
)

// scanUsage is what usage adds of the other replicas, computed the way it was
// before the running sums: every origin's counts of the scope, looked up one by
// one. It is the oracle of the running sums and the baseline of their benchmark.
func scanUsage(l *Limiter, id uint64, w int64, dim int) (prev, curr int64) {
	for _, o := range l.origins {
		e, ok := o.scopes[id]
		if !ok {
			continue
		}
		switch o.win {
		case w:
			prev += count(e.prev, dim)
			curr += count(e.curr, dim)
		case w - 1:
			prev += count(e.curr, dim)
		case w + 1:
			curr += count(e.curr, dim) + count(e.prev, dim)
		}
	}
	return prev, curr
}

// checkSums fails unless the running sums are exactly what the origins' latest
// states add up to, per scope and window, with no sum left over.
func checkSums(t testing.TB, l *Limiter) {
	t.Helper()
	type key struct {
		id  uint64
		win int64
	}
	want := map[key]remoteSum{}
	for _, o := range l.origins {
		for id, c := range o.scopes {
			k := key{id, o.win}
			s := want[k]
			s.win = o.win
			s.refs++
			curr, prev := c.counts()
			for d := range s.curr {
				s.curr[d] += curr[d]
				s.prev[d] += prev[d]
			}
			want[k] = s
		}
	}
	n := 0
	for id, sums := range l.remote {
		if len(sums) == 0 {
			t.Fatalf("scope %x kept with no sums", id)
		}
		for _, s := range sums {
			n++
			if w, ok := want[key{id, s.win}]; !ok || w != s {
				t.Fatalf("scope %x window %d: running sum %+v, origins add up to %+v", id, s.win, s, w)
			}
		}
	}
	if n != len(want) {
		t.Fatalf("%d running sums, origins add up to %d", n, len(want))
	}
}

// The running sums of the other replicas' usage stay what their latest states
// add up to through every way a state arrives or goes: a first state, a newer
// window replacing an older one, the same window merged (counters only grow,
// net output may shrink as reservations are released), a stale or reordered
// state ignored, an origin forgotten or evicted for a new one. Admission reads
// the same usage as a scan over every origin.
func TestRemoteSumsMatchOrigins(t *testing.T) {
	c := newClock()
	cfg := Config{PerKey: Limits{InputTokens: 1 << 40, OutputTokens: 1 << 40}, PerModel: Limits{OutputTokens: 1 << 40}, MaxOrigins: 6}
	l := newLimiter(t, cfg, c)
	rng := rand.New(rand.NewPCG(1, 2))
	type peer struct {
		lim   *Limiter
		clock *clock
		sent  [][]byte // states published so far, for reordered deliveries
	}
	peers := make([]*peer, 8)
	for i := range peers {
		pc := &clock{t: c.now()}
		peers[i] = &peer{lim: newLimiter(t, cfg, pc), clock: pc}
	}
	keys := []string{"a", "b", "c", "d"}
	for step := range 4000 {
		p := peers[rng.IntN(len(peers))]
		name := fmt.Sprint("p", rng.IntN(len(peers)))
		switch op := rng.IntN(20); {
		case op < 8: // the peer admits and settles requests
			k := keys[rng.IntN(len(keys))]
			d := p.lim.ReserveAt(k, "m", Ask{InputTokens: rng.IntN(50), OutputTokens: rng.IntN(40)}, p.clock.now())
			if rng.IntN(2) == 0 {
				p.lim.SettleAt(k, "m", d.Reservation, rng.IntN(60), p.clock.now())
			}
		case op < 15: // its state arrives, maybe an old one
			b := p.lim.AppendState(nil, 0)
			p.sent = append(p.sent, b)
			if rng.IntN(4) == 0 {
				b = p.sent[rng.IntN(len(p.sent))]
			}
			_ = l.MergeState(name, b) // more than MaxOrigins is refused: fine
		case op < 16:
			l.ForgetOrigin(name)
		case op < 18: // a peer's clock moves on (a window or more, sometimes)
			p.clock.add(time.Duration(rng.IntN(90)) * time.Second)
		default: // this replica's clock follows the slowest peer's
			if now := p.clock.now(); now.After(c.now()) {
				c.add(now.Sub(c.now()))
			}
		}
		checkSums(t, l)
		w := c.now().UnixNano() / l.window
		for _, k := range keys {
			for _, id := range []uint64{hashKey(k), xxh3.HashStringSeed("m", seedModel)} {
				for _, at := range []int64{w - 1, w, w + 1} {
					for dim := range 2 {
						wp, wc := scanUsage(l, id, at, dim)
						gp, gc := l.usage(id, &counter{}, at, dim)
						if gp != float64(wp) || gc != float64(wc) {
							t.Fatalf("step %d: usage of %x at window %d dim %d = %v/%v, the origins add up to %d/%d", step, id, at, dim, gp, gc, wp, wc)
						}
					}
				}
			}
		}
	}
}

// benchOrigins is a limiter that knows the usage n other replicas published for
// the key alice and model m (and 20 other keys each), at the current window.
func benchOrigins(b *testing.B, n int) (*Limiter, *clock) {
	b.Helper()
	c := newClock()
	cfg := Config{PerKey: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}, PerModel: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}, MaxOrigins: 256}
	l := newLimiter(b, cfg, c)
	for i := range n {
		p := newLimiter(b, cfg, c)
		p.ReserveAt("alice", "m", Ask{InputTokens: 100, OutputTokens: 10}, c.now())
		for k := range 20 {
			p.ReserveAt(fmt.Sprint("key-", i, "-", k), "m", Ask{InputTokens: 1}, c.now())
		}
		if err := l.MergeState(fmt.Sprint("ingress-", i), p.AppendState(nil, maxStateBytes)); err != nil {
			b.Fatal(err)
		}
	}
	return l, c
}

// The other replicas' usage of one scope and dimension, as an admission reads
// it four times (key and model, input and output): a scan over every origin
// (before) against the running sums (now), side by side.
func BenchmarkRemoteUsage(b *testing.B) {
	for _, n := range []int{0, 16, 256} {
		l, c := benchOrigins(b, n)
		w := c.now().UnixNano() / l.window
		id := hashKey("alice")
		b.Run(fmt.Sprintf("origins=%d/scan", n), func(b *testing.B) {
			b.ReportAllocs()
			var sink int64
			for b.Loop() {
				l.mu.Lock()
				p, q := scanUsage(l, id, w, dimIn)
				l.mu.Unlock()
				sink += p + q
			}
			_ = sink
		})
		b.Run(fmt.Sprintf("origins=%d/sum", n), func(b *testing.B) {
			b.ReportAllocs()
			var sink float64
			for b.Loop() {
				l.mu.Lock()
				p, q := l.usage(id, &counter{}, w, dimIn)
				l.mu.Unlock()
				sink += p + q
			}
			_ = sink
		})
	}
}

// A whole admission and its settlement with n other replicas' usage known,
// serial and from every core at once (the lock every request takes).
func BenchmarkReserveOrigins(b *testing.B) {
	for _, n := range []int{0, 256} {
		l, c := benchOrigins(b, n)
		now := c.now()
		a := Ask{InputTokens: 2048, OutputTokens: 64}
		b.Run(fmt.Sprintf("origins=%d", n), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				d := l.ReserveAt("alice", "m", a, now)
				l.SettleAt("alice", "m", d.Reservation, 10, now)
			}
		})
		b.Run(fmt.Sprintf("origins=%d/parallel", n), func(b *testing.B) {
			b.ReportAllocs()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					d := l.ReserveAt("alice", "m", a, now)
					l.SettleAt("alice", "m", d.Reservation, 10, now)
				}
			})
		})
	}
}

// What the running sums cost where states arrive: one replica's state (about
// 50 scopes, DefaultMaxSize) merged again in the same window, and replacing
// the one of the window before, among 255 other origins.
func BenchmarkMergeState(b *testing.B) {
	l, c := benchOrigins(b, 255)
	cfg := Config{PerKey: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}, PerModel: Limits{InputTokens: 1 << 50, OutputTokens: 1 << 50}}
	pc := &clock{t: c.now().Add(-time.Minute)}
	p := newLimiter(b, cfg, pc)
	for k := range 200 {
		p.ReserveAt(fmt.Sprint("key-", k), "m", Ask{InputTokens: k + 1, OutputTokens: 5}, pc.now())
	}
	older := p.AppendState(nil, DefaultMaxSize)
	pc.add(time.Minute)
	newer := p.AppendState(nil, DefaultMaxSize)
	b.Run("same-window", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if err := l.MergeState("ingress-0", newer); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("newer-window", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			l.ForgetOrigin("ingress-x")
			if err := l.MergeState("ingress-x", older); err != nil {
				b.Fatal(err)
			}
			if err := l.MergeState("ingress-x", newer); err != nil {
				b.Fatal(err)
			}
		}
	})
}
