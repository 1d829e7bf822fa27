package learn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/sim/engine"
)

// sample is one observation for both lines.
type sample struct {
	engine      string
	tokens      int
	ttft        time.Duration
	seqs, ctx   float64
	step        time.Duration
	decodeSteps int
}

func (s sample) feed(l *Learner) {
	l.ObservePrefill(s.engine, s.tokens, s.ttft)
	l.ObserveDecode(s.engine, s.seqs, s.ctx, s.step, s.decodeSteps)
}

// samples draws n noisy observations of engines e0 and e1 (e1 twice as
// slow), seeded.
func samples(n int, seed uint64) []sample {
	rng := rand.New(rand.NewPCG(seed, 9))
	out := make([]sample, n)
	for i := range out {
		slow := float64(1 + i%2)
		tok := 200 + rng.IntN(12000)
		seqs := 1 + rng.Float64()*40
		ctx := seqs * (500 + rng.Float64()*3000)
		noise := 1 + 0.1*(rng.Float64()-0.5)
		out[i] = sample{
			engine:      []string{"e0", "e1"}[i%2],
			tokens:      tok,
			ttft:        time.Duration(slow * (0.02 + float64(tok)/9000) * noise * 1e9),
			seqs:        seqs,
			ctx:         ctx,
			step:        time.Duration(slow * (0.012 + 2e-7*ctx + 3e-5*seqs) * noise * 1e9),
			decodeSteps: 1 + rng.IntN(200),
		}
	}
	return out
}

func near(a, b Rates, tol float64) bool {
	return within(a.PrefillRate, b.PrefillRate, tol) && within(a.StepBase, b.StepBase, tol) && within(a.DecodeSecPerToken, b.DecodeSecPerToken, tol)
}

// TestSharedSumsFitTheUnion: two routers each see half of the samples; once
// each has the other's share, both estimate every engine (and the pooled
// line) as one router that saw all of them does. Forgetting is off
// (memory 10¹²) so that the order samples arrive in does not matter.
func TestSharedSumsFitTheUnion(t *testing.T) {
	cfg := Config{Memory: 1e12}
	a, _ := New(cfg)
	b, _ := New(cfg)
	all, _ := New(cfg)
	for i, s := range samples(400, 1) {
		s.feed(all)
		if i%4 < 2 {
			s.feed(a)
		} else {
			s.feed(b)
		}
	}
	for _, id := range []string{"e0", "e1"} {
		if near(a.Rates(id), all.Rates(id), 1e-3) {
			t.Fatalf("%s: half the samples already fit as all do (%+v): the test shows nothing", id, a.Rates(id))
		}
	}
	share := func(from, to *Learner, name string) {
		es, pooled := from.Own(nil)
		if len(es) != 2 || es[0].Engine != "e0" || es[1].Engine != "e1" {
			t.Fatalf("Own: %+v, want e0 and e1 in order", es)
		}
		if err := to.SetPeer(name, pooled, es); err != nil {
			t.Fatal(err)
		}
	}
	share(a, b, "a")
	share(b, a, "b")
	for _, l := range []*Learner{a, b} {
		for _, id := range []string{"e0", "e1", "never-seen"} {
			if got, want := l.Rates(id), all.Rates(id); !near(got, want, 1e-6) {
				t.Errorf("%s: %+v, want the union's %+v", id, got, want)
			}
		}
		if got, want := l.Pooled(), all.Pooled(); !near(got, want, 1e-6) {
			t.Errorf("pooled: %+v, want %+v", got, want)
		}
	}
	// What a router publishes stays its own: b's share is not in a's.
	es, _ := a.Own(nil)
	if got := es[0].Prefill[0]; math.Abs(got-100) > 1e-6 {
		t.Errorf("a's own e0 prefill weight %v after b's share, want its own 100 samples", got)
	}
	// A second share replaces the first, not adds to it.
	share(b, a, "b")
	if got, want := a.Rates("e0"), all.Rates("e0"); !near(got, want, 1e-6) {
		t.Errorf("after b shared twice: %+v, want %+v", got, want)
	}
	// b leaves: a is back to its own samples.
	alone, _ := New(cfg)
	for i, s := range samples(400, 1) {
		if i%4 < 2 {
			s.feed(alone)
		}
	}
	a.ForgetPeer("b")
	if a.Peers() != 0 {
		t.Errorf("%d peers after the only one left", a.Peers())
	}
	if got, want := a.Rates("e1"), alone.Rates("e1"); !near(got, want, 1e-9) {
		t.Errorf("after b left: %+v, want a's own %+v", got, want)
	}
}

// TestPeerTeachesAnUnseenEngine: a router that never sent a request to an
// engine prices it with a peer's measurements of a real simulated engine,
// within 10 % of the engine's true rates, from a prior 2× off.
func TestPeerTeachesAnUnseenEngine(t *testing.T) {
	p, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	pr, sb, dt := p.Rates()
	cfg := Config{Prior: Rates{PrefillRate: pr / 2, StepBase: 2 * sb, DecodeSecPerToken: 2 * dt}}
	a, _ := New(cfg)
	b, _ := New(cfg)
	drive(t, a, p, 40, rand.New(rand.NewPCG(1, 2)))
	if got := b.Rates("e0"); got != cfg.Prior {
		t.Fatalf("b before any share: %+v, want its prior", got)
	}
	es, pooled := a.Own(nil)
	if err := b.SetPeer("a", pooled, es); err != nil {
		t.Fatal(err)
	}
	got := b.Rates("e0")
	if !within(got.PrefillRate, pr, 0.10) || !within(got.StepBase, sb, 0.10) || !within(got.DecodeSecPerToken, dt, 0.10) {
		t.Errorf("b from a's share: %+v, true {%.0f %.4f %.3g}", got, pr, sb, dt)
	}
	if own, _ := b.Own(nil); len(own) != 0 {
		t.Errorf("b publishes %d engines it never measured", len(own))
	}
}

// TestSharingConvergesFaster: four routers each send a quarter of the
// traffic to one simulated engine (virtual time, seeded), from a prior 2×
// off. Alone, each one's estimates are still far off after 40 requests;
// with the other three's shares every one is within 10 % of the engine's
// true rates, on two profiles. The table in docs/BENCHMARKS.md ("Learned
// costs shared between replicas") is this test's log.
func TestSharingConvergesFaster(t *testing.T) {
	for _, name := range []string{"7b-l40s", "8b-h100"} {
		p, err := engine.LookupProfile(name)
		if err != nil {
			t.Fatal(err)
		}
		pr, sb, dt := p.Rates()
		cfg := Config{Prior: Rates{PrefillRate: pr / 2, StepBase: 2 * sb, DecodeSecPerToken: 2 * dt}}
		worst := func(r Rates) float64 { // the largest relative error of the three rates
			return max(math.Abs(r.PrefillRate/pr-1), math.Abs(r.StepBase/sb-1), math.Abs(r.DecodeSecPerToken/dt-1))
		}
		for _, waves := range []int{2, 4, 8} {
			const routers = 4
			ls := make([]*Learner, routers)
			reqs := 0
			for i := range ls {
				ls[i], _ = New(cfg)
				reqs += drive(t, ls[i], p, waves, rand.New(rand.NewPCG(uint64(i+1), uint64(waves))))
			}
			var alone, shared, sharedWorst float64
			for _, l := range ls {
				alone += worst(l.Rates("e0")) / routers
			}
			for i, l := range ls {
				for j, from := range ls {
					if i != j {
						es, pooled := from.Own(nil)
						if err := l.SetPeer(fmt.Sprint(j), pooled, es); err != nil {
							t.Fatal(err)
						}
					}
				}
			}
			for _, l := range ls {
				e := worst(l.Rates("e0"))
				shared += e / routers
				sharedWorst = max(sharedWorst, e)
			}
			t.Logf("%s, %d requests per router: worst-rate error, mean over routers: alone %.1f %%, shared %.1f %% (worst router %.1f %%)",
				name, reqs/routers, 100*alone, 100*shared, 100*sharedWorst)
			if shared >= alone && alone > 0.10 { // both converged: either may be a little closer
				t.Errorf("%s, %d waves: sharing did not help (%.3f vs %.3f alone)", name, waves, shared, alone)
			}
			if waves >= 4 && sharedWorst > 0.10 {
				t.Errorf("%s, %d waves: a router with its peers' shares is %.1f %% off, want ≤ 10 %%", name, waves, 100*sharedWorst)
			}
		}
	}
}

// TestSetPeerRefusesBadStats: sums no learner produces are refused and
// change nothing; a bad engine does not cost the good ones of one share.
func TestSetPeerRefusesBadStats(t *testing.T) {
	src, _ := New(Config{})
	for _, s := range samples(50, 3) {
		s.feed(src)
	}
	good, pooled := src.Own(nil)
	bad := []func(*Stats){
		func(s *Stats) { s.Prefill[1] = math.NaN() },
		func(s *Stats) { s.Decode[7] = math.Inf(1) },
		func(s *Stats) { s.Prefill[0] = -1 },
		func(s *Stats) { s.Decode[5] = -3 },
		func(s *Stats) { s.Prefill[1] = 1e9 }, // (Σx)² > Σw·Σx²
		func(s *Stats) { s.Decode[2] = 1e12 },
	}
	for i, mut := range bad {
		l, _ := New(Config{})
		s := pooled
		mut(&s)
		if err := l.SetPeer("p", s, good); !errors.Is(err, ErrStats) {
			t.Errorf("bad pooled %d: err %v, want ErrStats", i, err)
		}
		if l.Peers() != 0 || l.Rates("e0") != DefaultPrior() {
			t.Errorf("bad pooled %d changed the learner: %d peers, %+v", i, l.Peers(), l.Rates("e0"))
		}
		es := append([]EngineStats(nil), good...)
		mut(&es[0].Stats)
		err := l.SetPeer("p", pooled, es)
		if !errors.Is(err, ErrStats) || !strings.Contains(err.Error(), `"e0"`) {
			t.Errorf("bad engine %d: err %v, want ErrStats naming e0", i, err)
		}
		if l.Rates("e0") != l.Pooled() {
			t.Errorf("bad engine %d: e0 is not on the pooled estimate", i)
		}
		if !near(l.Rates("e1"), src.Rates("e1"), 1e-9) {
			t.Errorf("bad engine %d: e1 %+v, want the share's %+v", i, l.Rates("e1"), src.Rates("e1"))
		}
	}
	l, _ := New(Config{})
	if err := l.SetPeer("", pooled, good); !errors.Is(err, ErrStats) {
		t.Errorf("no peer name: %v", err)
	}
	if err := l.SetPeer("p", pooled, []EngineStats{{Stats: good[0].Stats}}); !errors.Is(err, ErrStats) {
		t.Errorf("no engine id: %v", err)
	}
}

// BenchmarkRatesWithPeers: the price of a cost lookup (the policies make
// several per candidate) with eight peers' shares beside the own samples.
func BenchmarkRatesWithPeers(b *testing.B) {
	for _, peers := range []int{0, 8} {
		b.Run(map[int]string{0: "own", 8: "own+8peers"}[peers], func(b *testing.B) {
			l, _ := New(Config{})
			for _, s := range samples(200, 1) {
				s.feed(l)
			}
			for i := 0; i < peers; i++ {
				src, _ := New(Config{})
				for _, s := range samples(200, uint64(i+2)) {
					s.feed(src)
				}
				es, pooled := src.Own(nil)
				if err := l.SetPeer(string(rune('a'+i)), pooled, es); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportAllocs()
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				_ = l.Rates("e0")
			}
		})
	}
}

// TestRatesOverWeighsBySamples: a group's rate is one fit on its engines'
// samples (own and shared): with every engine in the group it is the pooled
// fit; an engine with a single sample barely moves it, where the mean of
// the engines' estimates would be pulled halfway to that engine's
// prior-dominated one (without partial pooling: with it, the new engine
// starts from the pooled fit and the mean is good too); a group without
// samples gets the pooled estimate.
func TestRatesOverWeighsBySamples(t *testing.T) {
	l, _ := New(Config{Unpooled: true})
	const rate = 9000.0
	for k := 0; k < 200; k++ {
		tok := 500 + (k*977)%12000
		l.ObservePrefill("old", tok, time.Duration((0.02+float64(tok)/rate)*float64(time.Second)))
	}
	l.ObservePrefill("new", 800, 60*time.Millisecond)
	// (Equal up to forgetting, which discounts per engine in one and per
	// sample of any engine in the other.)
	if got, want := l.RatesOver([]string{"old", "new"}), l.Pooled(); !near(got, want, 1e-4) {
		t.Errorf("the whole cluster: %+v, want the pooled %+v", got, want)
	}
	group := l.RatesOver([]string{"old", "new"}).PrefillRate
	mean := (l.Rates("old").PrefillRate + l.Rates("new").PrefillRate) / 2
	if !within(group, rate, 0.05) {
		t.Errorf("group rate %.0f, want within 5 %% of %.0f", group, rate)
	}
	if within(mean, rate, 0.05) {
		t.Errorf("the mean of estimates %.0f is as good: the test shows nothing", mean)
	}
	if got := l.RatesOver([]string{"unseen"}); got != l.Pooled() {
		t.Errorf("a group without samples: %+v, want the pooled %+v", got, l.Pooled())
	}
	// A peer's samples of a group engine count too.
	p, _ := New(Config{})
	es, pooled := l.Own(nil)
	if err := p.SetPeer("l", pooled, es); err != nil {
		t.Fatal(err)
	}
	if got := p.RatesOver([]string{"old", "new"}).PrefillRate; !within(got, group, 1e-9) {
		t.Errorf("from the share: %.0f, want %.0f", got, group)
	}
}

// TestForgetDropsEngineEverywhere: Forget drops an engine's own lines and
// what every peer shared of it (a peer's later shares may leave it out),
// so it is priced on the pooled estimate again; other engines keep theirs.
func TestForgetDropsEngineEverywhere(t *testing.T) {
	a, _ := New(Config{})
	b, _ := New(Config{})
	for _, s := range samples(40, 3) {
		s.feed(a)
		s.feed(b)
	}
	es, pooled := a.Own(nil)
	if err := b.SetPeer("a", pooled, es); err != nil {
		t.Fatal(err)
	}
	e1 := b.Rates("e1")
	if !b.Measured("e0") || len(b.Engines(nil)) != 4 { // e0 and e1, own and a's
		t.Fatalf("before: engines %v", b.Engines(nil))
	}
	b.Forget("e0")
	if b.Measured("e0") || b.Rates("e0") != b.Pooled() {
		t.Fatalf("e0 forgotten but still measured: %+v, pooled %+v", b.Rates("e0"), b.Pooled())
	}
	if got := b.Engines(nil); len(got) != 2 || got[0] != "e1" || got[1] != "e1" {
		t.Fatalf("after: engines %v, want e1 (own and a's)", got)
	}
	if own, _ := b.Own(nil); len(own) != 1 || own[0].Engine != "e1" {
		t.Fatalf("b publishes %v after forgetting e0", own)
	}
	if got := b.Rates("e1"); got != e1 {
		t.Fatalf("e1 changed: %+v, was %+v", got, e1)
	}
	// A share from a that no longer lists e0 does not bring it back.
	if err := b.SetPeer("a", pooled, es[1:]); err != nil {
		t.Fatal(err)
	}
	if b.Measured("e0") {
		t.Fatal("e0 back from a share that does not list it")
	}
}
