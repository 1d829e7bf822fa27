package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"math"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// learnProfile is a simulated engine whose prefill is compute-bound and
// linear in the prompt (attention and memory traffic negligible), at
// tokensPerSecond (its FLOPS over 2·Params); a decode step costs its 2 ms
// overhead. Every per-token cost outside the model (the client's JSON, the
// ingress's parse and hashing, the simulator's parse) lands in a learned
// slope: ~1–3 µs a token under the race detector, but a CI run that
// shares its 2 cores with other test binaries measured up to ~30 µs (a
// 25,000-token/s engine was learned at 14,400), so the accuracy test runs
// a slow engine, where that is under 15 % of a modelled token's 200 µs.
func learnProfile(tokensPerSecond float64) engine.Profile {
	return engine.Profile{Name: "learn-test", Params: 1e9, WeightBytes: 1e6, Layers: 1, Hidden: 8,
		KVBytesPerToken: 1, FLOPS: 2e9 * tokensPerSecond, MemBW: 1e15, StepOverhead: 2 * time.Millisecond}
}

// TestIngressLearnsPrefillRateFromSimulator: an ingress whose learner
// starts 2× too fast learns a real simulator's prefill rate from the
// streamed requests it proxies, within 30 %.
//
// The simulator runs in wall time (TimeScale 1: one model second is one
// wall second), so what the ingress measures is the model's timing plus
// real HTTP, scheduling and timer latency. That overhead is roughly the
// same for every prompt and lands in the fitted line's intercept, not its
// slope; prompts from 500 to 12,000 tokens keep the slope well determined (the
// prior's pseudo-samples span a wide range of prompt sizes: a narrow range
// of real ones would leave the slope to the prior).
// 30 % leaves room for a busy machine's jitter and for the prior's pull
// (4 pseudo-samples against 24 requests).
func TestIngressLearnsPrefillRateFromSimulator(t *testing.T) {
	eng, want := startLearnSim(t, 5000)

	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: eng.URL()})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.Learn.Prior = learn.Rates{PrefillRate: 2 * want} // 2× off
	cfg.AdminListen = "127.0.0.1:0"
	reg := prometheus.NewRegistry()
	s := startIngress(t, cfg, Deps{Registry: reg})
	if s.learn == nil {
		t.Fatal("no learner with policy kvmesh")
	}
	if got := s.learn.Rates("e0").PrefillRate; math.Abs(got/want-1) <= 0.3 {
		t.Fatalf("the prior %v is already within 30 %% of %v: the test shows nothing", got, want)
	}

	const n = 24
	sendRandomStreams(t, s, rand.New(rand.NewPCG(7, 1)), n, 6000, 6)
	got := s.learned("e0")
	t.Logf("learned %+v; the profile's prefill rate %v tokens/s", *got, want)
	if math.Abs(got.PrefillRate/want-1) > 0.3 {
		t.Errorf("learned prefill rate %.0f tokens/s, the simulator's is %.0f (want within 30 %%)", got.PrefillRate, want)
	}
	if got.PrefillSamples != n || got.DecodeSamples == 0 {
		t.Errorf("%d prefill and %d decode samples, want %d and some", got.PrefillSamples, got.DecodeSamples, n)
	}
	up, _ := s.ups.get("e0", eng.URL())
	if c := up.lw.ctx.Load(); c != 0 {
		t.Errorf("%d context tokens still counted on the idle engine", c)
	}

	// Shown on /debug/engines and as the gauge.
	st, body := getAuth(t, "http://"+s.AdminAddr()+"/debug/engines", "")
	var engines []struct {
		Learned *learnedRates `json:"learned"`
	}
	if err := json.Unmarshal([]byte(body), &engines); st != 200 || err != nil || len(engines) != 1 || engines[0].Learned == nil {
		t.Fatalf("/debug/engines: %d %v %s", st, err, body)
	}
	if l := engines[0].Learned; l.PrefillRate <= 0 || l.StepBase <= 0 || l.DecodeSecPerToken <= 0 || l.PrefillSamples != n {
		t.Errorf("/debug/engines learned: %+v", *l)
	}
	if g := metricValue(t, reg, "kvmesh_ingress_learned_prefill_tokens_per_second", "engine", "e0"); g != s.learn.Rates("e0").PrefillRate {
		t.Errorf("gauge %v, learner %v", g, s.learn.Rates("e0").PrefillRate)
	}
}

// sendRandomStreams sends n streamed completions of 500 to 500+spread
// random token ids (no prefix shared) with maxTokens output tokens each,
// through s, and fails unless each ends with [DONE].
func sendRandomStreams(t *testing.T, s *Server, rng *rand.Rand, n, spread, maxTokens int) {
	t.Helper()
	for i := 0; i < n; i++ {
		tokens := 500 + rng.IntN(spread)
		var sb strings.Builder
		sb.WriteString(`{"model":"m","max_tokens":` + strconv.Itoa(maxTokens) + `,"stream":true,"prompt":[`)
		for j := 0; j < tokens; j++ {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(strconv.Itoa(1 + rng.IntN(250)))
		}
		sb.WriteString("]}")
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", sb.String())
		if evs := sseEvents(body); st != 200 || len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
			t.Fatalf("request %d: status %d body %.300s", i, st, body)
		}
	}
}

// startLearnSim starts a simulator of learnProfile(tokensPerSecond) in
// wall time and returns it with the profile's true prefill rate.
func startLearnSim(t *testing.T, tokensPerSecond float64) (*sim.Server, float64) {
	t.Helper()
	prof := learnProfile(tokensPerSecond)
	want, _, _ := prof.Rates()
	eng, err := sim.Start(context.Background(), sim.Config{Model: "m", TimeScale: 1, Seed: 3,
		Engine: engine.Config{Profile: prof, MaxBatchTokens: 16384, GPUBlocks: 8192},
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = eng.Close() })
	return eng, want
}

// metricValue reads the gauge or counter name{label=value} from reg; 0
// when there is no such series.
func metricValue(t *testing.T, reg *prometheus.Registry, name, label, value string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if lp.GetName() == label && lp.GetValue() == value {
					if c := m.GetCounter(); c != nil {
						return c.GetValue()
					}
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	return 0
}

// TestLearnedCostsSteerKVMesh: the kvmesh policy prices with the ingress's
// learner. With e0 learned 20× slower at prefill than e1 and nothing else
// to tell them apart, every long prompt goes to e1.
func TestLearnedCostsSteerKVMesh(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"}, StaticEngine{ID: "e1", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.AccessLog = false
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 200; i++ {
		tok := 1000 + 100*(i%50)
		s.learn.ObservePrefill("e0", tok, time.Duration(float64(tok)/1500*float64(time.Second)))
		s.learn.ObservePrefill("e1", tok, time.Duration(float64(tok)/30000*float64(time.Second)))
	}
	for i := 0; i < 20; i++ {
		var sb strings.Builder
		sb.WriteString(`{"model":"m","max_tokens":4,"prompt":[`)
		for j := 0; j < 4000; j++ {
			if j > 0 {
				sb.WriteByte(',')
			}
			sb.WriteString(strconv.Itoa(1 + (i*7919+j*31)%5000))
		}
		sb.WriteString("]}")
		var ctx fasthttp.RequestCtx
		ctx.Request.Header.SetMethod("POST")
		ctx.Request.SetBody([]byte(sb.String()))
		c := &call{}
		c.reset()
		c.s, c.ep = s, epCompletions
		if err := c.prepare(&ctx); err != nil {
			t.Fatal(err)
		}
		if c.dec.Engine != "e1" {
			t.Fatalf("request %d went to %s (%s), want e1: e0 is learned 20× slower", i, c.dec.Engine, c.dec.Reason)
		}
	}
}

// TestBuildPDPassesCostsAndTPOT: the P/D policy gets the ingress's learner
// as its cost model and the configured TPOT and TTFT objectives.
func TestBuildPDPassesCostsAndTPOT(t *testing.T) {
	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Scheduler.Policy = "kvmesh"
	cfg.PD = PDConfig{Policy: "kvmesh", SLOTPOT: 40 * time.Millisecond, SLOTTFT: 2 * time.Second}
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	if s.learn == nil {
		t.Fatal("no learner")
	}
	pc := s.pdPolicyConfig(cfg.PD, nil)
	if pc.Costs != s.learn || pc.SLOTPOT != 0.04 || pc.SLOTTFT != 2 || pc.Outputs == nil || pc.Outputs != s.outs {
		t.Fatalf("pd config: costs %v (learner %p), sloTPOT %v, sloTTFT %v", pc.Costs, s.learn, pc.SLOTPOT, pc.SLOTTFT)
	}
	pol, err := pd.New(pc)
	if err != nil {
		t.Fatal(err)
	}
	k, ok := pol.(pd.KVMesh)
	if !ok || k.Cost.Costs != s.learn || k.SLOTPOT != 0.04 || k.Outputs != s.outs {
		t.Fatalf("pd policy %T: costs %v sloTPOT %v", pol, k.Cost.Costs, k.SLOTPOT)
	}
	if s.buildPD(cfg.PD) == nil {
		t.Fatal("buildPD built no router")
	}
	cfg.PD.SLOTPOT = -time.Second
	if err := cfg.Validate(); err == nil {
		t.Error("a negative sloTPOT validated")
	}
}

// TestLearnerConfig: the learner runs for kvmesh unless disabled, takes
// the prior given, and bad values are config errors.
func TestLearnerConfig(t *testing.T) {
	cases := []struct {
		policy, pd string
		disabled   bool
		want       bool
	}{
		{"kvmesh", "", false, true},
		{"", "", false, true}, // the default policy is kvmesh
		{"kvmesh", "", true, false},
		{"least-request", "", false, false},
		{"least-request", "kvmesh-always", false, true},
	}
	for _, tc := range cases {
		cfg := DefaultConfig()
		cfg.Scheduler.Policy, cfg.PD.Policy, cfg.Learn.Disabled = tc.policy, tc.pd, tc.disabled
		lr, err := newLearner(&cfg)
		if err != nil || (lr != nil) != tc.want {
			t.Errorf("%+v: learner %v err %v", tc, lr != nil, err)
		}
	}
	cfg := DefaultConfig()
	cfg.Learn.Prior.PrefillRate = 12345
	lr, err := newLearner(&cfg)
	if err != nil {
		t.Fatal(err)
	}
	if r := lr.Rates("x"); r.PrefillRate != 12345 || r.StepBase != learn.DefaultPrior().StepBase {
		t.Errorf("prior %+v", r)
	}
	for _, bad := range []LearnConfig{{Prior: learn.Rates{PrefillRate: math.NaN()}}, {Memory: 1}, {Clamp: -1}, {PriorWeight: math.Inf(1)}} {
		cfg := DefaultConfig()
		cfg.Learn = bad
		if err := cfg.Validate(); err == nil {
			t.Errorf("learn %+v validated", bad)
		}
	}
	if _, err := ParseConfig([]byte("learn:\n  disabled: true\n  prior:\n    prefillRate: 8000\n  unpooled: true\n  freeIntercept: true\n")); err != nil {
		t.Errorf("parse learn block: %v", err)
	}
	// The learner rules a P/D policy overrides, each on a fresh learner:
	//   - partial pooling: an engine with one sample of its own starts from
	//     what the others showed, unless learn.unpooled is set;
	//   - the prefill line's intercept prior at the step cost: three TTFTs
	//     at one prompt length, far above a prior 3× too fast, move the rate
	//     toward the engine's only with it (off with learn.freeIntercept;
	//     scheduler/learn's TestInterceptPrior).
	// A P/D policy turns both off: its engines play different parts.
	for _, tc := range []struct {
		pd             string
		unpooled, free bool
		pooled, toward bool
	}{
		{"", false, false, true, true},
		{"", true, false, false, true},
		{"", false, true, true, false},
		{"kvmesh", false, false, false, false},
	} {
		cfg := DefaultConfig()
		cfg.PD.Policy, cfg.Learn.Unpooled, cfg.Learn.FreeIntercept = tc.pd, tc.unpooled, tc.free
		fresh := func() *learn.Learner {
			lr, err := newLearner(&cfg)
			if err != nil {
				t.Fatal(err)
			}
			return lr
		}
		lr := fresh()
		const rate = 9000.0 // the prior says 30,000
		for k := 0; k < 200; k++ {
			tok := 500 + (k*977)%12000
			lr.ObservePrefill("old", tok, time.Duration((0.02+float64(tok)/rate)*float64(time.Second)))
		}
		lr.ObservePrefill("new", 2000, 242*time.Millisecond) // 0.02 s + 2,000 tokens at 9,000 tok/s
		got := lr.Rates("new").PrefillRate
		if near := math.Abs(got/rate-1) < 0.10; near != tc.pooled {
			t.Errorf("%+v: a one-sample engine's prefill rate %.0f (true %.0f): pooled %v, want %v", tc, got, rate, near, tc.pooled)
		}
		lr = fresh()
		for k := 0; k < 12; k++ {
			ctx, seqs := float64(4000+k*3000), float64(2+k%5)
			lr.ObserveDecode("e", seqs, ctx, time.Duration((0.024+3e-8*ctx+20e-6*seqs)*float64(time.Second)), 16)
		}
		for k := 0; k < 3; k++ {
			tok := 2176 + 16*k
			lr.ObservePrefill("e", tok, time.Duration((0.024+float64(tok)/10100)*float64(time.Second)))
		}
		got, prior := lr.Rates("e").PrefillRate, learn.DefaultPrior().PrefillRate
		if toward := got < prior; toward != tc.toward {
			t.Errorf("%+v: prefill rate %.0f (prior %.0f, true 10,100) after three TTFTs: moved toward %v, want %v", tc, got, prior, toward, tc.toward)
		}
	}
}

// learnHookServer is a kvmesh-policy ingress (not started) and its upstream
// for engine e0, for driving the learner hooks by hand.
func learnHookServer(t *testing.T) (*Server, *upstream) {
	t.Helper()
	cfg := testConfig(StaticEngine{ID: "e0", Model: "m", URL: "http://127.0.0.1:1"})
	cfg.Scheduler.Policy = "kvmesh"
	s, err := New(cfg, Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	up, err := s.ups.get("e0", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	return s, up
}

// TestLearnHooksAllocateNothing: once an engine is known, an attempt's
// learner bookkeeping (send, first token, streamed tokens, end) allocates
// nothing.
func TestLearnHooksAllocateNothing(t *testing.T) {
	s, up := learnHookServer(t)
	c := &call{s: s, promptTokens: 1000, block: 16}
	one := func() {
		c.startAttempt(up, 0)
		c.firstByte(up)
		c.learnFirstToken(up)
		for i := 0; i < 4; i++ {
			c.learnTokens(up, 1)
		}
		c.endAttempt(up)
	}
	one()
	if n := testing.AllocsPerRun(200, one); n != 0 {
		t.Errorf("the learner hooks allocate %v per attempt", n)
	}
	if up.lw.ctx.Load() != 0 || up.prefill.Load() != 0 || up.inflight.Load() != 0 {
		t.Errorf("left charged: ctx %d prefill %d inflight %d", up.lw.ctx.Load(), up.prefill.Load(), up.inflight.Load())
	}
	if up.lw.prefillSamples.Load() == 0 || up.lw.decodeSamples.Load() == 0 {
		t.Errorf("samples: %d prefill, %d decode", up.lw.prefillSamples.Load(), up.lw.decodeSamples.Load())
	}
}

// TestLearnerFedByPDLegs: in a real P/D cluster the prefill legs are the
// prefill engine's prefill samples, and the streamed decode legs give the
// decode engine decode samples but no prefill ones (it did not prefill).
func TestLearnerFedByPDLegs(t *testing.T) {
	_, s := startPDCluster(t, sim.Config{TimeScale: 1, Seed: 1}, 1, 1) // decode steps of ~7 ms wall: tokens arrive in separate reads
	if s.learn == nil {
		t.Fatal("no learner with the kvmesh P/D policy")
	}
	const n = 4
	for i := 0; i < n; i++ {
		body := `{"model":"m","prompt":"learn ` + strings.Repeat("word ", 60+i) + `","max_tokens":8,"stream":true}`
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", body)
		if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
			t.Fatalf("request %d: status %d engine %q body %.200s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
		}
	}
	p, d := s.learned("p0"), s.learned("d0")
	if p.PrefillSamples != n || d.PrefillSamples != 0 || d.DecodeSamples == 0 {
		t.Errorf("prefill engine %+v, decode engine %+v: want %d prefill samples on p0, none on d0, decode samples on d0", *p, *d, n)
	}
}

// clockTick waits until the clock has moved on, so the next stream read
// ends a stretch of non-zero length.
func clockTick() {
	for t0 := time.Now(); !time.Now().After(t0); {
	}
}

// TestLearnParallelSampling: a request sampling n sequences counts n
// sequences and n times its prompt's context on the engine while it runs;
// its decode sample counts a step per n tokens, and stops at the first
// sequence's finish (later steps decode fewer); nothing stays charged.
func TestLearnParallelSampling(t *testing.T) {
	s, up := learnHookServer(t)
	const n, prompt = 4, 1000
	c := &call{s: s, promptTokens: prompt, block: 16, seqs: n}
	c.req.n = n
	c.startAttempt(up, 0)
	if got, ctx := up.lw.seqs.Load(), up.lw.ctx.Load(); got != n || ctx != n*prompt {
		t.Fatalf("running: %d sequences, %d context tokens; want %d and %d", got, ctx, n, n*prompt)
	}
	c.firstByte(up)
	c.learnFirstToken(up)
	p := &proxyStream{c: c, up: up}
	chunk := func(i int, finish string) []byte {
		return []byte(`data: {"choices":[{"index":` + strconv.Itoa(i) + `,"text":"a","finish_reason":` + finish + "}]}\n\n")
	}
	for step := 0; step < 5; step++ { // five steps of four sequences
		clockTick() // each read a measurable stretch
		var ev []byte
		for i := 0; i < n; i++ {
			ev = append(ev, chunk(i, "null")...)
		}
		p.observeLearn(ev)
	}
	if _, _, _, steps, ok := c.lc.decodeSample(); !ok || steps != 5 {
		t.Fatalf("decode sample of 5 steps of %d sequences: %d steps (ok %v)", n, steps, ok)
	}
	clockTick()
	p.observeLearn(append(chunk(0, `"stop"`), chunk(1, "null")...)) // choice 0 ends
	for step := 0; step < 3; step++ {
		clockTick()
		p.observeLearn(append(chunk(1, "null"), chunk(2, "null")...))
	}
	seqs, ctx, _, steps, ok := c.lc.decodeSample()
	if !ok || steps != 5 || math.Abs(seqs-n) > 1e-9 || ctx < n*prompt { // seqs: Σ n·dt over Σ dt, in floating point
		t.Errorf("after a finish and thinner steps: %d steps, %.1f sequences, %.0f context (ok %v); want the 5 whole steps of %d sequences over ≥ %d tokens",
			steps, seqs, ctx, ok, n, n*prompt)
	}
	c.endAttempt(up)
	if up.lw.seqs.Load() != 0 || up.lw.ctx.Load() != 0 || up.lw.decodeSamples.Load() != 1 {
		t.Errorf("after the end: %d sequences, %d context tokens, %d decode samples; want 0, 0, 1", up.lw.seqs.Load(), up.lw.ctx.Load(), up.lw.decodeSamples.Load())
	}
	for ev, want := range map[string]bool{`"finish_reason":null`: false, `"finish_reason": "length"`: true, `"finish_reason":"stop"`: true, `{"x":1}`: false, `"finish_reason":`: false} {
		if finishes([]byte(ev)) != want {
			t.Errorf("finishes(%s) = %v", ev, !want)
		}
	}
}

// TestLearnKVBoundTTFTsPoolOnly is the live side of tester h-trace2's F1
// (loadtest/des TestKVBoundTTFTsKeepTheLearnedRate): a TTFT whose wait
// overlapped a snapshot showing the engine stalled on KV memory (requests
// waiting, the cache near full: learn.KVBound) — the attempt's own
// snapshot, or a later attempt's sent there before its first token — feeds
// the pooled prefill line only, not the engine's own, since it holds the
// wait for free blocks or a preemption's recompute. A stall seen after the
// first token does not touch it.
func TestLearnKVBoundTTFTsPoolOnly(t *testing.T) {
	s, up := learnHookServer(t)
	clean := scheduler.Engine{ID: "e0", Waiting: 3, KVUsage: 0.5}
	bound := scheduler.Engine{ID: "e0", Waiting: 1, KVUsage: 0.97}
	attempt := func(snap scheduler.Engine) *call {
		c := &call{s: s, promptTokens: 1000, block: 16, cands: []scheduler.Engine{snap}}
		c.startAttempt(up, 0)
		return c
	}
	first := func(c *call) {
		clockTick() // a TTFT of non-zero length
		c.firstByte(up)
		c.learnFirstToken(up)
	}
	weights := func() (own, pooled float64) {
		st, p := s.learn.Own(nil)
		for _, e := range st {
			if e.Engine == "e0" {
				own = e.Prefill[0]
			}
		}
		return own, p.Prefill[0]
	}
	// A clean snapshot throughout: the engine's own line.
	own0, pooled0 := weights()
	c := attempt(clean)
	first(c)
	c.endAttempt(up)
	own1, pooled1 := weights()
	if own1 <= own0 || pooled1 <= pooled0 {
		t.Fatalf("clean TTFT: own %v -> %v, pooled %v -> %v; want both to grow", own0, own1, pooled0, pooled1)
	}

	// Sent with a KV-bound snapshot: pooled only.
	c = attempt(bound)
	first(c)
	c.endAttempt(up)
	own2, pooled2 := weights()
	if own2 != own1 || pooled2 <= pooled1 {
		t.Errorf("KV-bound at send: own %v -> %v, pooled %v -> %v; want the pooled line alone to grow", own1, own2, pooled1, pooled2)
	}

	// Sent clean, but a later attempt to the engine saw it KV-bound before
	// this one's first token: pooled only.
	c = attempt(clean)
	later := attempt(bound)
	first(c)
	c.endAttempt(up)
	own3, pooled3 := weights()
	if own3 != own2 || pooled3 <= pooled2 {
		t.Errorf("KV-bound during the wait: own %v -> %v, pooled %v -> %v; want the pooled line alone to grow", own2, own3, pooled2, pooled3)
	}
	first(later)
	later.endAttempt(up)

	// Sent clean, first token before a stall is seen: its own line, though
	// the stall comes before its stream ends.
	own4, _ := weights()
	c = attempt(clean)
	first(c)
	stall := attempt(bound)
	c.endAttempt(up)
	own5, _ := weights()
	if own5 <= own4 {
		t.Errorf("stall after the first token: own %v -> %v; want the engine's own line to grow", own4, own5)
	}
	first(stall)
	stall.endAttempt(up)
	if up.prefill.Load() != 0 || up.inflight.Load() != 0 {
		t.Errorf("left charged: prefill %d inflight %d", up.prefill.Load(), up.inflight.Load())
	}
}
