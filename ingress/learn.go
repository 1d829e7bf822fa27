package ingress

import (
	"cmp"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/pd"
)

// Learned costs (docs/OPERATIONS.md, "Learned costs (online)"): the ingress
// owns one learn.Learner and hands it to the kvmesh policy and the P/D
// policy as their cost model, so they price each engine with what this
// replica has measured of it instead of fixed defaults. It is fed what the
// ingress sees, as the DES feeds its learner (loadtest/des):
//
//   - a prefill sample per streamed request: the time from the attempt
//     being sent to its first event against the prefill work this
//     replica had outstanding on the engine at that moment (uncached prompt
//     tokens sent there without a first byte yet) plus the request's own
//     uncached tokens: prompt − the cached tokens the engine's usage
//     reports (prompt_tokens_details.cached_tokens), or, from an engine
//     that reports none, prompt − matched blocks × block size. The sample
//     is recorded when the stream ends, where the usage comes. Non-streamed
//     answers and disaggregated decode legs give none: their first byte is
//     not the engine's first token. A P/D prefill leg (one output token, its
//     answer sent once the prefill is done) is a prefill sample of its engine.
//     A sample whose wait overlapped a KV-memory stall of the engine (the
//     snapshot this replica read of it when sending the attempt, or when
//     sending a later one before the first token, showed learn.KVBound:
//     requests waiting with the KV cache near full) goes to the pooled line
//     only (learn.Learner.ObservePrefillKVBound): its TTFT holds the wait
//     for free blocks or a preemption's recompute, not only the prefill.
//   - a decode sample when a streamed request ends: the stretches between
//     two reads of its stream during which this replica had no prefill
//     outstanding on the engine, timed per token, against the requests
//     this replica has in flight there and their context (prompts plus
//     tokens streamed back so far), both averaged over the stretches.
//
// Hot path: a few atomics and time.Now per attempt and per stream read;
// the learner's mutex once per streamed first token and once per stream
// end. Nothing allocates after an engine's first sample.

// LearnConfig is the online cost learner (scheduler/learn). Zero fields
// take the learner's defaults.
type LearnConfig struct {
	// Disabled turns learning off: the policies price with the scheduler
	// config's fixed rates. The learner runs only when the scheduler or
	// P/D policy is kvmesh's.
	Disabled bool `yaml:"disabled"`
	// Prior is the estimate before any sample (learn.DefaultPrior: a 7B
	// model on an H100); each zero rate takes the default's.
	Prior learn.Rates `yaml:"prior"`
	// PriorWeight is how many samples the prior counts for. Default 4.
	PriorWeight float64 `yaml:"priorWeight"`
	// Memory is the forgetting horizon in samples per engine. Default 2,000.
	Memory float64 `yaml:"memory"`
	// Clamp bounds every estimate to [prior/Clamp, prior·Clamp]. Default 50.
	Clamp float64 `yaml:"clamp"`
	// Unpooled starts each engine's lines from the prior instead of the
	// estimate pooled over every engine (learn.Config.Unpooled). Always
	// so with a P/D policy (pd.policy).
	Unpooled bool `yaml:"unpooled"`
	// Shared prices every engine with the costs pooled over all of them
	// (learn.Config.Shared): for a pool of identical replicas. Off by
	// default (docs/BENCHMARKS.md, "Per-engine or shared learned costs").
	Shared bool `yaml:"shared"`
	// FreeIntercept fits the prefill line's intercept without its prior at
	// the decode step's cost (learn.Config.FreeIntercept). Always so with
	// a P/D policy.
	FreeIntercept bool `yaml:"freeIntercept"`
}

// learnConfig is the learner's config: zero fields defaulted.
func (c *LearnConfig) learnConfig() learn.Config {
	d := learn.DefaultPrior()
	p := c.Prior
	p.PrefillRate = cmp.Or(p.PrefillRate, d.PrefillRate)
	p.StepBase = cmp.Or(p.StepBase, d.StepBase)
	p.DecodeSecPerToken = cmp.Or(p.DecodeSecPerToken, d.DecodeSecPerToken)
	lc := learn.Config{Prior: p, PriorWeight: c.PriorWeight, Memory: c.Memory, Clamp: c.Clamp, Unpooled: c.Unpooled, Shared: c.Shared, FreeIntercept: c.FreeIntercept}
	lc.Defaults()
	return lc
}

func (c *LearnConfig) problems(bad func(string, ...any)) {
	for _, v := range []float64{c.Prior.PrefillRate, c.Prior.StepBase, c.Prior.DecodeSecPerToken, c.PriorWeight, c.Memory, c.Clamp} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			bad("learn: every rate and weight must be a finite value ≥ 0 (0: default)")
			return
		}
	}
	lc := c.learnConfig()
	if err := lc.Validate(); err != nil {
		bad("learn: %v", err)
	}
}

// usesKVMesh reports whether a policy that prices with the cost model is
// configured: the scheduler's kvmesh policy or a kvmesh P/D choice.
func (c *Config) usesKVMesh() bool {
	pol := cmp.Or(c.Scheduler.Policy, "kvmesh") // registry's default policy
	return pol == "kvmesh" || c.PD.Policy == "kvmesh" || c.PD.Policy == "kvmesh-always"
}

// newLearner is the ingress's learner, nil when learning is off.
func newLearner(cfg *Config) (*learn.Learner, error) {
	if cfg.Learn.Disabled || !cfg.usesKVMesh() {
		return nil, nil
	}
	lc := cfg.Learn.learnConfig()
	if cfg.PD.Policy != "" {
		lc = pd.LearnConfig(lc)
	}
	lr, err := learn.New(lc)
	if err != nil {
		return nil, fmt.Errorf("%w: learn: %w", ErrConfig, err)
	}
	return lr, nil
}

// learnLoad is one upstream's counts for the learner.
type learnLoad struct {
	// ctx is the context tokens of this replica's requests on the engine:
	// their prompts plus the tokens streamed back so far.
	ctx atomic.Int64
	// seqs is the sequences of this replica's requests on the engine: a
	// request decodes prompts × n of them (call.seqs).
	seqs atomic.Int64
	// kvBoundAt is when this replica last sent the engine an attempt
	// whose snapshot of it showed a KV-memory stall (learn.KVBound), a
	// monotime reading (a wall-clock step must not reorder it with the
	// sends it is compared with); 0 never.
	kvBoundAt      atomic.Int64
	prefillSamples atomic.Uint64
	decodeSamples  atomic.Uint64
}

// noteKVBound records a snapshot of the engine read at at (a monotime
// reading) that showed a KV-memory stall.
func (w *learnLoad) noteKVBound(at int64) {
	for {
		old := w.kvBoundAt.Load()
		if old >= at || w.kvBoundAt.CompareAndSwap(old, at) {
			return
		}
	}
}

// noteSent notes an attempt sent to up at sent: when the engine's snapshot
// it was sent with showed a KV-memory stall (noteKVBound).
func (c *call) noteSent(up *upstream, sent time.Time) {
	for i := range c.cands {
		if e := &c.cands[i]; e.ID == up.id {
			if learn.KVBound(e.Waiting, e.KVUsage) {
				up.lw.noteKVBound(monotime.Of(sent))
			}
			return
		}
	}
}

// kvBoundSince reports whether an attempt sent to up at sent has since
// been sent with a snapshot showing the engine KV-bound (its own, noted
// by noteSent, or another's).
func kvBoundSince(up *upstream, sent time.Time) bool {
	return up.lw.kvBoundAt.Load() >= monotime.Of(sent)
}

// observePrefill feeds the learner a TTFT of d on up for tokens of prefill
// work: to the pooled line only when the engine was seen KV-bound between
// the send and the first token (bound).
func (c *call) observePrefill(up *upstream, tokens int, d time.Duration, bound bool) {
	if bound {
		c.s.learn.ObservePrefillKVBound(up.id, tokens, d)
	} else {
		c.s.learn.ObservePrefill(up.id, tokens, d)
	}
	up.lw.prefillSamples.Add(1)
}

// learnCall is one attempt's learner state (call.lc).
type learnCall struct {
	sent  time.Time // attempt sent
	ahead int64     // prefill tokens outstanding on the engine, own included
	own   int64     // of ahead, the attempt's own uncached tokens as the index predicted them
	ttft  time.Duration
	// first: the first token came (at sent+ttft); the prefill sample waits
	// for the stream's end and its usage (learnEnd).
	first bool
	// kvBound: the engine was seen stalled on KV memory between the send
	// and the first token (learnLoad.kvBoundAt).
	kvBound bool
	ctx     int64     // tokens this attempt added to learnLoad.ctx
	seqs    int64     // sequences this attempt added to learnLoad.seqs
	last    time.Time // last stream read after the first token; zero before
	pure    bool      // no prefill outstanding at the last read
	// thinned: one of several sequences has finished, so later steps decode
	// fewer than seqs and the stretches stop (their tokens over seqs would
	// undercount the steps).
	thinned bool
	// The pure-decode stretches so far: time, tokens (over all of the
	// attempt's sequences), ∫seqs dt, ∫ctx dt.
	dur          time.Duration
	tokens       int
	seqsS, ctxTS float64
}

// learnStart records an attempt sent to up (at c.sentAt) with prefill
// tokens now outstanding there (its own included).
func (c *call) learnStart(up *upstream, prefill int64) {
	if c.s.learn == nil {
		return
	}
	// Every sequence reads its prompt's context (n samples of one prompt
	// read it n times per step, shared blocks or not).
	c.lc = learnCall{sent: c.sentAt, ahead: prefill, own: c.prefillCharge, ctx: int64(c.promptTokens) * int64(max(1, c.req.n)), seqs: int64(c.seqs)}
	c.noteSent(up, c.sentAt)
	up.lw.ctx.Add(c.lc.ctx)
	up.lw.seqs.Add(c.lc.seqs)
}

// learnFirstToken records a streamed attempt's first event: its TTFT, a
// prefill sample at the stream's end (learnEnd), unless the prefill ran on
// another engine (P/D).
func (c *call) learnFirstToken(up *upstream) {
	if c.s.learn == nil || c.lc.sent.IsZero() {
		return
	}
	now := time.Now()
	if c.pd.prefill == "" {
		c.lc.ttft, c.lc.first = now.Sub(c.lc.sent), true
		c.lc.kvBound = kvBoundSince(up, c.lc.sent)
	}
	c.lc.last, c.lc.pure = now, up.prefill.Load() == 0
}

// prefillTokens is the prefill sample's work: the tokens outstanding at
// send (ahead), with the attempt's own uncached tokens as the engine's
// usage reported them when it did. The index's prediction misses what
// the engine cached that this replica has not heard of yet: a prefix
// another ingress has just sent there, whose KV events are still on their
// way. Counted as uncached, such a hit's whole prompt seemed prefilled in
// a cache hit's TTFT, the engine looked many times faster than it is, the
// cost model sent it more new prefixes, and it drew more such hits: with
// 64 identical engines and 3 ingresses the learned rates spread from
// 12,600 to 442,000 tokens/s and new prefixes piled onto a few engines
// (TestLearnCountsCacheHitsTheIndexMissed). An engine that reports no
// cached tokens (vLLM without --enable-prompt-tokens-details) still gives
// the prediction.
func (c *call) prefillTokens() int64 {
	if !c.engCachedOK {
		return c.lc.ahead
	}
	prompt := c.promptTokens
	if c.engPrompt > 0 {
		prompt = c.engPrompt
	}
	return max(0, c.lc.ahead-c.lc.own) + int64(max(0, prompt-c.engCached))
}

// learnPrefillLeg records a P/D prefill leg's answer (one output token,
// not streamed: its headers come once the prefill is done) as a prefill
// sample of the prefill engine.
func (c *call) learnPrefillLeg(up *upstream, prefill int64, d time.Duration) {
	if c.s.learn == nil {
		return
	}
	sent := time.Now().Add(-d)
	c.noteSent(up, sent)
	c.observePrefill(up, int(prefill), d, kvBoundSince(up, sent))
}

// learnTokens records k tokens streamed from up after the first: the gap
// since the last read is a pure-decode stretch when this replica had no
// prefill outstanding on the engine at both ends.
func (c *call) learnTokens(up *upstream, k int) {
	if c.s.learn == nil || k <= 0 {
		return
	}
	up.lw.ctx.Add(int64(k))
	c.lc.ctx += int64(k)
	if c.lc.last.IsZero() || c.lc.thinned {
		return // the first event's read: the prefill's, not decode
	}
	now := time.Now()
	pure := up.prefill.Load() == 0
	if pure && c.lc.pure {
		dt := now.Sub(c.lc.last)
		c.lc.dur += dt
		c.lc.tokens += k
		c.lc.seqsS += float64(up.lw.seqs.Load()) * dt.Seconds()
		c.lc.ctxTS += float64(up.lw.ctx.Load()) * dt.Seconds()
	}
	c.lc.last, c.lc.pure = now, pure
}

// learnEnd ends an attempt on up: its context leaves the engine's count
// and its decode stretches, if any, become one decode sample.
func (c *call) learnEnd(up *upstream) {
	if c.s.learn == nil {
		return
	}
	l := &c.lc
	up.lw.ctx.Add(-l.ctx)
	up.lw.seqs.Add(-l.seqs)
	if l.first {
		c.observePrefill(up, int(c.prefillTokens()), l.ttft, l.kvBound)
	}
	if seqs, ctx, step, steps, ok := l.decodeSample(); ok {
		c.s.learn.ObserveDecode(up.id, seqs, ctx, step, steps)
		up.lw.decodeSamples.Add(1)
	}
	*l = learnCall{}
}

// decodeSample is the attempt's pure-decode stretches as one decode
// sample: the engine's mean sequences and context over them, the time a
// step took and the steps (ok false with fewer than two). A step decodes
// one token of each of the attempt's sequences, so its tokens over its
// sequences are the steps it saw (the stretches stop when one of several
// sequences finishes: thinned).
func (l *learnCall) decodeSample() (seqs, ctx float64, step time.Duration, steps int, ok bool) {
	steps = l.tokens / int(max(1, l.seqs))
	if steps < 2 || l.dur <= 0 {
		return 0, 0, 0, 0, false
	}
	sec := l.dur.Seconds()
	return l.seqsS / sec, l.ctxTS / sec, l.dur / time.Duration(steps), steps, true
}

// learnedRates is one engine's learned cost model as /debug/engines shows it.
type learnedRates struct {
	learn.Rates
	// This replica's own samples of the engine.
	PrefillSamples uint64 `json:"prefillSamples"`
	DecodeSamples  uint64 `json:"decodeSamples"`
	// Peers is how many other replicas' shares (learn_gossip.go) the
	// estimates include.
	Peers int `json:"peers"`
}

// learned returns engine id's learned rates, nil when learning is off.
func (s *Server) learned(id string) *learnedRates {
	if s.learn == nil {
		return nil
	}
	r := &learnedRates{Rates: s.learn.Rates(id), Peers: s.learn.Peers()}
	s.ups.mu.RLock()
	if up := s.ups.m[id]; up != nil {
		r.PrefillSamples, r.DecodeSamples = up.lw.prefillSamples.Load(), up.lw.decodeSamples.Load()
	}
	s.ups.mu.RUnlock()
	return r
}

// learnCollector exports the learned prefill rate per live engine (the
// cardinality is the engines').
type learnCollector struct {
	s    *Server
	desc *prometheus.Desc
}

func newLearnCollector(s *Server) *learnCollector {
	return &learnCollector{s: s, desc: prometheus.NewDesc("kvmesh_ingress_learned_prefill_tokens_per_second",
		"Prefill throughput this replica's cost learner estimates per engine (uncached tokens/s).",
		[]string{"engine"}, prometheus.Labels{"ingress": s.cfg.ID})}
}

func (lc *learnCollector) Describe(ch chan<- *prometheus.Desc) { ch <- lc.desc }

func (lc *learnCollector) Collect(ch chan<- prometheus.Metric) {
	for _, e := range lc.s.deps.Membership.Engines(nil) {
		ch <- prometheus.MustNewConstMetric(lc.desc, prometheus.GaugeValue, lc.s.learn.Rates(e.ID).PrefillRate, e.ID)
	}
}

// observeLearn is observe that also hands the tokens counted to the learner.
func (p *proxyStream) observeLearn(events []byte) {
	n := p.c.outTokens
	p.observe(events)
	p.c.learnTokens(p.up, p.c.outTokens-n)
	if p.c.seqs > 1 && !p.c.lc.thinned && finishes(events) {
		p.c.lc.thinned = true
	}
}

var finishMarker = []byte(`"finish_reason":`)

// finishes reports whether events end a choice (a finish_reason that is a
// string, not null).
func finishes(events []byte) bool { return memberStarts(events, finishMarker, '"') }
