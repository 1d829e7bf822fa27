package learn

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/sim/engine"
)

// drive runs waves of concurrent requests through one simulated engine and
// feeds l exactly what an ingress in front of it would see: each request's
// TTFT against the uncached tokens sent ahead of it plus its own, and the
// step time of stretches in which no request was awaiting its first token
// (from the streamed tokens) against the context the ingress counts itself
// (prompt + streamed tokens of its in-flight requests). It returns how many
// requests finished.
func drive(t *testing.T, l *Learner, p engine.Profile, waves int, rng *rand.Rand) int {
	t.Helper()
	e, err := engine.New(engine.Config{BlockSize: 16, GPUBlocks: 30000, Profile: p}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var (
		meter ContextMeter
		now   time.Duration
		done  int
		tok   uint32
	)
	for w := 0; w < waves; w++ {
		k := 1 + rng.IntN(24)
		reqs := make([]*engine.Request, k)
		ahead := make([]int, k)
		queued := 0
		// Prompt lengths vary between waves as well as within one, so that
		// context per sequence varies and the two decode costs separate.
		base := []int{200, 600, 1500, 2500}[rng.IntN(4)]
		for i := range reqs {
			prompt := make([]uint32, base+rng.IntN(base))
			for j := range prompt {
				tok++
				prompt[j] = tok // never repeats: no cache hits
			}
			queued += len(prompt)
			ahead[i] = queued
			reqs[i] = &engine.Request{Prompt: prompt, OutputLen: 32 + rng.IntN(224)}
			if err := e.Add(reqs[i], now); err != nil {
				t.Fatal(err)
			}
		}
		ctx := func() (c, seqs float64, prefilling bool) {
			for _, r := range reqs {
				if !r.Done() {
					c += float64(len(r.Prompt) + r.Generated())
					seqs++
					prefilling = prefilling || r.Generated() == 0
				}
			}
			return c, seqs, prefilling
		}
		seen := make([]bool, k)
		for !e.Idle() {
			c0, seqs, prefilling := ctx()
			meter.At(now, c0)
			before := meter.Integral()
			res := e.Step(now, now+time.Millisecond)
			c1, _, _ := ctx()
			meter.At(res.End, c1)
			if !prefilling && res.Steps > 0 {
				d := res.End - now
				l.ObserveDecode("e0", seqs, (meter.Integral()-before)/d.Seconds(), d/time.Duration(res.Steps), res.Steps)
			}
			now = res.End
			for i, r := range reqs {
				if r.Generated() > 0 && !seen[i] {
					seen[i] = true
					rs := r.Result()
					l.ObservePrefill("e0", ahead[i], rs.TTFT)
				}
			}
			done += len(res.Finished)
		}
	}
	return done
}

func within(got, want, tol float64) bool { return math.Abs(got-want) <= tol*want }

// TestConvergesFromTwiceOff is issue 16's convergence check: started from a
// prior 2× off on every rate (half the prefill rate and twice the step and
// per-token costs, or the reverse), the estimates come
// within 10 % of the simulated engine's true rates after a bounded number
// of requests, on two profiles.
func TestConvergesFromTwiceOff(t *testing.T) {
	for _, tc := range []struct {
		name string
		off  float64 // the prior's costs are off × the truth
	}{{"7b-l40s", 2}, {"8b-h100", 2}, {"7b-l40s", 0.5}} {
		name, off := tc.name, tc.off
		t.Run(fmt.Sprintf("%s/%gx", name, off), func(t *testing.T) {
			p, err := engine.LookupProfile(name)
			if err != nil {
				t.Fatal(err)
			}
			pr, sb, dt := p.Rates()
			l, err := New(Config{Prior: Rates{PrefillRate: pr / off, StepBase: off * sb, DecodeSecPerToken: off * dt}})
			if err != nil {
				t.Fatal(err)
			}
			before := l.Rates("e0")
			if before.PrefillRate != pr/off || before.StepBase != off*sb {
				t.Fatalf("before any sample: %+v, want the prior", before)
			}
			n := drive(t, l, p, 40, rand.New(rand.NewPCG(1, 2)))
			const bound = 600 // requests
			if n > bound {
				t.Fatalf("drove %d requests, bound %d", n, bound)
			}
			got := l.Rates("e0")
			t.Logf("%s after %d requests: prefill %.0f tok/s (true %.0f), step %.4f s (true %.4f), decode %.3g s/token (true %.3g)",
				name, n, got.PrefillRate, pr, got.StepBase, sb, got.DecodeSecPerToken, dt)
			if !within(got.PrefillRate, pr, 0.10) || !within(got.StepBase, sb, 0.10) || !within(got.DecodeSecPerToken, dt, 0.10) {
				t.Errorf("not within 10 %%: got %+v, true {%.0f %.4f %.3g}", got, pr, sb, dt)
			}
			// The engine's own lines start from the pooled ones (partial
			// pooling), so with one engine the two agree within 2 %, not to
			// the bit (the pooled lines' pseudo-samples sit on the prior,
			// 2× off, and pull its per-token cost 1.7 % up).
			if other := l.Rates("unseen"); other != l.Pooled() || !near(other, got, 0.02) {
				t.Errorf("an engine without samples should use the pooled estimate %+v: %+v vs %+v", l.Pooled(), other, got)
			}
		})
	}
}

// TestPriorHoldsWithoutSamples: bad samples are dropped and the prior is
// the answer until real ones arrive; the clamp bounds a wild estimate.
func TestPriorHoldsWithoutSamples(t *testing.T) {
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	l.ObservePrefill("e", 0, time.Second)
	l.ObservePrefill("e", 100, -time.Second)
	l.ObserveDecode("e", 1, math.NaN(), time.Millisecond, 1)
	l.ObserveDecode("e", 1, 1000, 0, 1)
	l.ObserveDecode("e", 0, 1000, time.Millisecond, 1)
	if got := l.Rates("e"); got != DefaultPrior() {
		t.Fatalf("after bad samples: %+v, want the prior %+v", got, DefaultPrior())
	}
	// A thousand samples claiming decode gets cheaper with context: the
	// negative slope is rejected, the estimate stays the prior's slope.
	for i := 0; i < 1000; i++ {
		x := float64(i * 100)
		l.ObserveDecode("e", 4, x, time.Duration((0.05-x*1e-7)*1e9), 1)
	}
	if got := l.Rates("e").DecodeSecPerToken; got != DefaultPrior().DecodeSecPerToken {
		t.Errorf("negative slope gave %v, want the prior", got)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{
		{Prior: Rates{PrefillRate: -1, StepBase: 1, DecodeSecPerToken: 1}},
		{PriorWeight: -1},
		{Memory: 1},
		{Clamp: 0.5},
	} {
		if _, err := New(c); !errors.Is(err, ErrConfig) {
			t.Errorf("%+v: err %v, want ErrConfig", c, err)
		}
	}
}

func TestContextMeter(t *testing.T) {
	var m ContextMeter
	m.At(0, 100)
	m.At(time.Second, 300) // mean 200 over 1 s
	m.At(time.Second, 50)  // jump: no time passes
	m.At(3*time.Second, 50)
	if got, want := m.Integral(), 200.0+100; math.Abs(got-want) > 1e-9 {
		t.Errorf("integral %v, want %v", got, want)
	}
}

// TestPartialPooling: an engine with a couple of samples of its own starts
// from what the cluster measured (its lines' pseudo-samples sit on the
// pooled lines), where without pooling the prior, 3× off, still dominates
// it; an engine truly twice as slow as the rest still gets its own rate
// once its samples outweigh the pseudo-samples.
func TestPartialPooling(t *testing.T) {
	const rate, slow = 9000.0, 4500.0
	prefill := func(l *Learner, id string, r float64, n, seed int) {
		for k := 0; k < n; k++ {
			tok := 500 + ((k+seed)*977)%12000
			l.ObservePrefill(id, tok, time.Duration((0.02+float64(tok)/r)*float64(time.Second)))
		}
	}
	for _, unpooled := range []bool{false, true} {
		l, _ := New(Config{Prior: Rates{PrefillRate: 3 * rate, StepBase: 0.01, DecodeSecPerToken: 1e-7}, Unpooled: unpooled})
		for e := 0; e < 7; e++ {
			prefill(l, fmt.Sprint("e", e), rate, 100, e)
		}
		prefill(l, "new", rate, 2, 99)
		prefill(l, "slow", slow, 40, 7)
		got, sl := l.Rates("new").PrefillRate, l.Rates("slow").PrefillRate
		t.Logf("unpooled %v: new engine %.0f tok/s (true %.0f), slow engine %.0f (true %.0f)", unpooled, got, rate, sl, slow)
		if !within(sl, slow, 0.10) {
			t.Errorf("unpooled %v: the slow engine's own rate %.0f, want within 10 %% of %.0f", unpooled, sl, slow)
		}
		if ok := within(got, rate, 0.10); ok == unpooled {
			t.Errorf("unpooled %v: the new engine's rate %.0f: within 10 %% of %.0f is %v, want %v", unpooled, got, rate, ok, !unpooled)
		}
	}
}

// TestFirstSampleStartsFromReportedRates: when the pooled decode fit has a
// coefficient Rates would clamp (here a negative step base, from engines
// whose step cost is nearly all per token), an engine's first sample starts
// from the rates every unsampled engine is given, not from the prior's
// plane. Otherwise the first engine sampled reads several times cheaper per
// token than its unsampled peers and new work herds onto it.
func TestFirstSampleStartsFromReportedRates(t *testing.T) {
	const perTok, perSeq, base = 3e-7, 1e-5, -0.003
	step := func(ctx, seqs float64) time.Duration {
		return time.Duration((base + perTok*ctx + perSeq*seqs) * float64(time.Second))
	}
	l, _ := New(Config{Prior: Rates{PrefillRate: 30000, StepBase: 0.01, DecodeSecPerToken: 1e-7}})
	for e := 0; e < 6; e++ {
		for k := 0; k < 200; k++ {
			ctx, seqs := 20000+float64((k*7919+e*104729)%180000), float64(1+(k*31+e)%32)
			l.ObserveDecode(fmt.Sprint("e", e), seqs, ctx, step(ctx, seqs), 16)
		}
	}
	l.ObserveDecode("new", 8, 90000, step(90000, 8), 16)
	unseen, got := l.Rates("unseen"), l.Rates("new")
	t.Logf("unsampled engine: step base %.4f s, %.3g s/token; one-sample engine: %.4f s, %.3g s/token",
		unseen.StepBase, unseen.DecodeSecPerToken, got.StepBase, got.DecodeSecPerToken)
	if !within(unseen.DecodeSecPerToken, perTok, 0.05) {
		t.Fatalf("the pooled per-token cost %.3g, want within 5 %% of %.3g", unseen.DecodeSecPerToken, perTok)
	}
	if !within(got.DecodeSecPerToken, unseen.DecodeSecPerToken, 0.10) || !within(got.StepBase, unseen.StepBase, 0.10) {
		t.Errorf("one-sample engine (%.4f s, %.3g s/token), want within 10 %% of an unsampled engine's (%.4f s, %.3g s/token)",
			got.StepBase, got.DecodeSecPerToken, unseen.StepBase, unseen.DecodeSecPerToken)
	}
}

// TestInterceptPrior: the first TTFTs, all at one prompt length and far
// above a prior that is 3× too fast, move the prefill rate toward the
// engine's (slower) rate. Without the intercept's prior at the step cost
// (FreeIntercept) they raise the line's intercept instead, and the rate
// reads faster than the prior: the wrong way, while a cluster's prefixes
// are being placed.
func TestInterceptPrior(t *testing.T) {
	const rate, step, perTok = 10100.0, 0.024, 3e-8
	for _, free := range []bool{false, true} {
		l, _ := New(Config{FreeIntercept: free})
		for k := 0; k < 12; k++ {
			ctx, seqs := float64(4000+k*3000), float64(2+k%5)
			l.ObserveDecode("e", seqs, ctx, time.Duration((step+perTok*ctx+20e-6*seqs)*float64(time.Second)), 16)
		}
		for k := 0; k < 3; k++ {
			tok := 2176 + 16*k
			l.ObservePrefill("e", tok, time.Duration((step+float64(tok)/rate)*float64(time.Second)))
		}
		got := l.Rates("e").PrefillRate
		prior := DefaultPrior().PrefillRate
		t.Logf("free intercept %v: %.0f tok/s after three TTFTs (prior %.0f, true %.0f)", free, got, prior, rate)
		if toward := got < prior; toward == free {
			t.Errorf("free intercept %v: rate %.0f tok/s, moved toward the true %.0f from the prior %.0f: %v, want %v", free, got, rate, prior, toward, !free)
		}
	}
}

// TestShared: with Config.Shared every engine is priced with the pooled
// estimate, whatever its own samples say; without it, an engine's own
// samples set it apart.
func TestShared(t *testing.T) {
	for _, shared := range []bool{false, true} {
		l, err := New(Config{Shared: shared})
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 400; i++ {
			tokens := 500 + 37*(i%50)
			l.ObservePrefill("fast", tokens, time.Duration(float64(tokens)/20000*float64(time.Second)))
			l.ObservePrefill("slow", tokens, time.Duration(float64(tokens)/5000*float64(time.Second)))
		}
		fast, slow := l.Rates("fast").PrefillRate, l.Rates("slow").PrefillRate
		if shared && fast != slow {
			t.Errorf("shared: fast %v and slow %v differ", fast, slow)
		}
		if !shared && !(fast > 2*slow) {
			t.Errorf("per engine: fast %v not above twice slow %v", fast, slow)
		}
	}
}

// TestUniformPromptsKeepTheContextCost: when every request has about the
// same prompt, an engine's context is its sequence count times one length,
// and the decode samples cannot tell the per-token cost from the
// per-sequence one. Rates reports no per-sequence cost, so the per-token
// slope must carry it: what one more stream adds to a step (its context
// times DecodeSecPerToken) stays within 25 % of what it adds on the
// simulated engine. Without the ridge on the per-sequence coefficient the
// fit put the whole cost on the sequences and the slope fell to the clamp,
// and a P/D router piled streams onto one decode engine.
func TestUniformPromptsKeepTheContextCost(t *testing.T) {
	p, err := engine.LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	const prompt = 2048
	rng := rand.New(rand.NewPCG(3, 4))
	for i := 0; i < 3000; i++ {
		// A decode engine's stretches: seqs streams of one prompt length,
		// each some way into its 512-token output.
		// The router's count of the context is an average over the
		// stretch and a little off the engine's.
		seqs := 1 + rng.IntN(160)
		ctx := seqs * (prompt + rng.IntN(512))
		seen := float64(ctx) * (1 + 0.05*rng.NormFloat64())
		l.ObserveDecode("d", float64(seqs), seen, p.DecodeStepTime(seqs, ctx), 1+rng.IntN(8))
	}
	got := l.Rates("d")
	for _, seqs := range []int{8, 64, 150} {
		ctx := seqs * (prompt + 256)
		want := (p.DecodeStepTime(seqs+1, ctx+prompt+256) - p.DecodeStepTime(seqs, ctx)).Seconds()
		if add := got.DecodeSecPerToken * (prompt + 256); !within(add, want, 0.25) {
			t.Errorf("at %d streams one more adds %.3g s per step, predicted %.3g (rates %+v)", seqs, want, add, got)
		}
	}
}

// TestLineWithoutSamplesIsPooled: an engine with prefill samples but no
// decode stretch of its own (an engine never idle of first tokens) is
// priced at the pooled step cost, as an engine with no sample at all is,
// not at the prior's. The prior here is 3.4× below the engines' true step
// cost (the ingress default against 7b-l40s): reported for the busiest
// engine, it made that engine the cheapest-looking one, and a router sent
// it every short prompt (docs/BENCHMARKS.md, "Unseen shapes (stop 68)").
func TestLineWithoutSamplesIsPooled(t *testing.T) {
	const base, perTok, rate = 0.024, 8.3e-8, 9500.0
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	for _, shared := range []bool{false, true} {
		l, _ := New(Config{Shared: shared}) // DefaultPrior: step base 0.007 s
		for e := 0; e < 6; e++ {
			id := fmt.Sprint("e", e)
			for k := 0; k < 100; k++ {
				ctx, seqs := 2000+float64((k*7919+e*104729)%60000), float64(1+(k*31+e)%32)
				l.ObserveDecode(id, seqs, ctx, sec(base+perTok*ctx+20e-6*seqs), 16)
				tok := 20 + ((k+e)*977)%4000
				l.ObservePrefill(id, tok, sec(base+float64(tok)/rate))
			}
		}
		for k := 0; k < 500; k++ {
			tok := 20 + (k*977)%4000
			l.ObservePrefill("busy", tok, sec(base+float64(tok)/rate))
		}
		busy, unseen := l.Rates("busy"), l.Rates("unseen")
		t.Logf("shared %v: prefill-only engine step base %.4f s, %.3g s/token; unsampled engine %.4f s, %.3g s/token (true %.4f, %.3g)",
			shared, busy.StepBase, busy.DecodeSecPerToken, unseen.StepBase, unseen.DecodeSecPerToken, base, perTok)
		if !within(unseen.StepBase, base, 0.10) {
			t.Fatalf("shared %v: the pooled step base %.4f s, want within 10 %% of %.4f", shared, unseen.StepBase, base)
		}
		if !within(busy.StepBase, unseen.StepBase, 0.02) || !within(busy.DecodeSecPerToken, unseen.DecodeSecPerToken, 0.02) {
			t.Errorf("shared %v: the prefill-only engine's decode line (%.4f s, %.3g s/token), want an unsampled engine's (%.4f s, %.3g s/token)",
				shared, busy.StepBase, busy.DecodeSecPerToken, unseen.StepBase, unseen.DecodeSecPerToken)
		}
	}
}

// TestKVBoundTTFTsPoolOnly: a TTFT observed through a KV-memory stall
// (ObservePrefillKVBound) moves the pooled estimate but not its engine's
// own: two engines of one speed stay priced alike however long one of
// them waited for blocks, and an engine with nothing but such TTFTs is
// priced at the pooled estimate.
func TestKVBoundTTFTsPoolOnly(t *testing.T) {
	l, err := New(Config{Prior: Rates{PrefillRate: 10000, StepBase: 0.01, DecodeSecPerToken: 1e-7}})
	if err != nil {
		t.Fatal(err)
	}
	const rate = 10000.0
	ttft := func(tokens int) time.Duration {
		return time.Duration((0.01 + float64(tokens)/rate) * float64(time.Second))
	}
	for i := range 200 {
		tokens := 500 + 37*i%4000
		l.ObservePrefill("a", tokens, ttft(tokens))
		l.ObservePrefill("b", tokens, ttft(tokens))
		// b also stalled on memory: the same prefill plus 2 s.
		l.ObservePrefillKVBound("b", tokens, ttft(tokens)+2*time.Second)
		l.ObservePrefillKVBound("c", tokens, ttft(tokens)+2*time.Second)
	}
	a, b, c, p := l.Rates("a").PrefillRate, l.Rates("b").PrefillRate, l.Rates("c").PrefillRate, l.Pooled()
	t.Logf("prefill rates a %.0f, b %.0f, c %.0f, pooled %.0f tok/s; true %.0f", a, b, c, p.PrefillRate, rate)
	if b != a {
		t.Errorf("prefill rates a %.0f, b %.0f; want them equal: b's stalled TTFTs moved its own line", a, b)
	}
	if math.Abs(a/rate-1) >= math.Abs(p.PrefillRate/rate-1) {
		t.Errorf("a at %.0f tok/s, pooled at %.0f; want a nearer the true %.0f", a, p.PrefillRate, rate)
	}
	if c != p.PrefillRate {
		t.Errorf("c, with only stalled TTFTs, at %.0f tok/s; want the pooled %.0f", c, p.PrefillRate)
	}
	if !l.Measured("a") || l.Measured("c") {
		t.Errorf("measured a %v, c %v; want true, false", l.Measured("a"), l.Measured("c"))
	}
	for _, tc := range []struct {
		waiting int
		usage   float64
		want    bool
	}{{0, 1, false}, {1, 0.5, false}, {1, KVBoundUsage, true}, {4, 0.99, true}} {
		if got := KVBound(tc.waiting, tc.usage); got != tc.want {
			t.Errorf("KVBound(%d, %v) = %v", tc.waiting, tc.usage, got)
		}
	}
}
