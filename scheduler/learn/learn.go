// Package learn estimates each engine's prefill and decode costs online from
// what a router can observe, so that kvmesh's cost model needs no timing
// profile of the engines.
//
// Two straight lines are learned per engine, by weighted least squares with
// exponential forgetting:
//
//	prefill:  time to first token = a + (prefill tokens queued ahead + own uncached) / PrefillRate
//	decode:   one decode step     = StepBase + DecodeSecPerToken · context tokens on the engine
//
// What feeds them is what a real router sees, nothing from an engine's
// internals. A prefill sample is one request's TTFT against the prefill work
// the router itself had sent ahead of it to that engine and not yet seen a
// first token for, plus the request's own uncached prompt tokens (the
// response's usage.prompt_tokens_details.cached_tokens, or vLLM's
// prefix-cache counters): the same line kvmesh's policy prices TTFT with.
// Its slope is seconds per prefilled token, so 1/slope is the prefill rate
// under the engine's real batching. A decode sample is one stretch of pure
// decoding on an engine — no request the router sent there was awaiting its
// first token — timed from the streamed tokens (the gap between two tokens
// of one request is one step; vllm:request_decode_time_seconds / output
// tokens gives the same) against the context the router counts there: the
// prompts of its in-flight requests plus the tokens it streamed back for
// them (ContextMeter averages it over the stretch).
//
// Until samples arrive the estimate is the prior (Config.Prior): a
// conservative guess. The prior enters the regressions as PriorWeight
// pseudo-samples on its own line, so the first few samples move the estimate
// only partly and a line whose samples all sit at one x keeps the prior's
// slope. Forgetting (Config.Memory) lets the estimate follow an engine whose
// speed changes. An engine without samples of its own uses the estimate
// pooled over every engine, as does a line without (an engine with TTFTs
// but no pure-decode stretch has the pooled decode line), and an engine
// with a few starts from it: its own lines' pseudo-samples sit on the
// pooled lines, not on the prior's (partial pooling), so the cluster's
// samples teach each engine what
// replicas of one model on one GPU share, and an engine's own samples
// teach what is its alone (a slower GPU, a busier host).
//
// Routers share what they measured (share.go): each one publishes its own
// lines' sufficient statistics (Stats: the weighted sums of the normal
// equations), and every router fits on its own sums plus the latest sums
// of each peer. Least squares is additive in those sums, so the fit is the
// one over every router's samples, with no sample counted twice (a router
// publishes only its own).
package learn

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"time"
)

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("learn: invalid config")

// Rates is a cost model: the numbers kvmesh's policy prices a request with.
type Rates struct {
	// PrefillRate is prefill throughput, uncached tokens per second.
	PrefillRate float64 `json:"prefillRate" yaml:"prefillRate"`
	// StepBase is a decode step's fixed cost, seconds.
	StepBase float64 `json:"stepBase" yaml:"stepBase"`
	// DecodeSecPerToken is a decode step's cost per context token, seconds.
	DecodeSecPerToken float64 `json:"decodeSecPerToken" yaml:"decodeSecPerToken"`
}

// DefaultPrior is the live ingress's default cost model (a 7B model on an
// H100: scheduler.DefaultKVMeshConfig), not fitted to any benchmark
// profile: on the 7b-l40s benchmark engines it is 3.2× too fast at prefill,
// 3.4× too cheap per step and 2.3× too dear per context token.
func DefaultPrior() Rates {
	return Rates{PrefillRate: 30000, StepBase: 0.007, DecodeSecPerToken: 1.9e-7}
}

// Config configures a Learner.
type Config struct {
	// Prior is the estimate before any sample. Default DefaultPrior.
	Prior Rates
	// PriorWeight is how many samples the prior counts for in each line.
	// Default 4.
	PriorWeight float64
	// Memory is the forgetting horizon in samples per engine: each new
	// sample discounts the older ones by 1 − 1/Memory. Default 2,000.
	Memory float64
	// Clamp bounds each estimate to [prior/Clamp, prior·Clamp], so a burst
	// of odd samples cannot send the model somewhere absurd. Default 50.
	Clamp float64
	// Unpooled makes each engine's lines start from Prior instead of the
	// estimate pooled over every engine (no partial pooling; for
	// ablations).
	Unpooled bool
	// Shared prices every engine with the estimate pooled over all of them
	// (Rates is RatesOver every engine): the engines are taken to be
	// replicas of one model on one GPU type, and no engine's own samples
	// set its rate apart.
	Shared bool
	// FreeIntercept leaves the prefill line's intercept to its samples and
	// the pseudo-samples alone, without the prior at the decode step's
	// cost (see interceptWeight; for the P/D step and ablations).
	FreeIntercept bool
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Prior == (Rates{}) {
		c.Prior = DefaultPrior()
	}
	if c.PriorWeight == 0 {
		c.PriorWeight = 4
	}
	if c.Memory == 0 {
		c.Memory = 2000
	}
	if c.Clamp == 0 {
		c.Clamp = 50
	}
}

// Validate lists every problem.
func (c *Config) Validate() error {
	var errs []error
	if c.Prior.PrefillRate <= 0 || c.Prior.StepBase <= 0 || c.Prior.DecodeSecPerToken <= 0 {
		errs = append(errs, fmt.Errorf("%w: prior rates must be > 0 (got %+v)", ErrConfig, c.Prior))
	}
	if c.PriorWeight <= 0 {
		errs = append(errs, fmt.Errorf("%w: priorWeight %v must be > 0", ErrConfig, c.PriorWeight))
	}
	if c.Memory < 2 {
		errs = append(errs, fmt.Errorf("%w: memory %v must be ≥ 2", ErrConfig, c.Memory))
	}
	if c.Clamp < 1 {
		errs = append(errs, fmt.Errorf("%w: clamp %v must be ≥ 1", ErrConfig, c.Clamp))
	}
	return errors.Join(errs...)
}

// The prior's pseudo-samples sit at these points (tokens; context tokens
// and sequences): a typical prompt range for prefill, a typical batch for
// decode. priorSeqSec is the prior's per-sequence step cost (20 µs, vLLM's
// sampling and bookkeeping on a GPU host).
var (
	prefillAt = [][2]float64{{512, 0}, {8192, 0}, {512, 1}} // the last pins the unused x₂
	decodeAt  = [][2]float64{{0, 1}, {50_000, 1}, {50_000, 32}}
)

const priorSeqSec = 20e-6

// The decode line's per-sequence cost is not fitted: it stays at the prior
// plane's (priorSeqSec), and the samples fit the step's fixed cost and its
// cost per context token. Rates reports no per-sequence cost (the policy
// prices a step as StepBase + DecodeSecPerToken · context), so whatever
// the fit put there the policy would not see. When every request has about
// the same prompt, context is sequences × one length, and the router counts
// its sequences exactly but its context only roughly (an average over the
// stretch): fitted freely, the per-sequence coefficient took the whole
// cost and DecodeSecPerToken fell to its clamp (3.8e-9 s against 8.3e-8
// true on 7b-l40s), a decode engine's predicted TPOT no longer grew with
// its streams, and the P/D step sent one of six decode engines 263 of 512
// requests (docs/BENCHMARKS.md, "The decode line's per-sequence cost").
// An engine whose real per-sequence cost differs has the difference
// charged to its context, which is where the policy can price it.

// interceptWeight is how many samples the prefill line's intercept prior
// counts for. The prior sits at the decode line's step cost: a first token
// takes at least one step, and the router's TTFT model is exactly
// (queued + uncached) / PrefillRate + StepBase. Without it, the first
// samples, all at about one prompt length and far above a prior plane that
// is too fast, raise the intercept instead of the slope, and the rate
// briefly reads faster than the prior, not slower (on shared-prefix at
// 7b-l40s: 88,000 tok/s at 0.5 s and 20,000 at 1 s against 10,100 true),
// which is when a cluster's prefixes are placed. 16 was chosen on the
// tuning rows over 4 and over pinning the intercept at the step cost
// (docs/BENCHMARKS.md, "Cross-validation (unseen traffic)"). Pinned, the
// rate no longer converged to the engine's (TestConvergesFromTwiceOff:
// 21,780 against 8b-h100's 24,907 tok/s), and at 64 a router with its
// peers' shares stayed 10.2 % off in TestSharingConvergesFaster. As
// samples at several lengths accumulate (up to Memory of them) the data
// outweigh it.
const interceptWeight = 16

// Learner holds the per-engine estimates. Safe for concurrent use.
type Learner struct {
	cfg     Config
	mu      sync.Mutex
	engines map[string]*model // own samples
	pooled  model
	peers   map[string]*peer  // what other routers shared, by peer
	shared  map[string]*model // Σ over peers, by engine
	sharedP model             // Σ over peers of their pooled sums
	// prior is the planes an engine's own lines start from: the pooled
	// fit (Config.Unpooled: the prior's), refitted when stale.
	prior      [2][3]float64
	priorStale bool
	// gen counts the changes to the sums (a sample, a peer's share, an
	// engine or peer forgotten); cache holds each engine's last Rates and
	// the gen it was fitted at. A policy asks for an engine's rates several
	// times per decision, the hold twice more, and every engine's estimate
	// leans on the pooled fit, so one sample anywhere makes every cached
	// estimate stale, and one decision refits each engine at most once.
	gen   uint64
	cache map[string]cachedRates
}

type cachedRates struct {
	gen   uint64
	rates Rates
}

// model is one engine's two lines.
type model struct {
	prefill, decode reg
	n               uint64 // samples observed (own models only; not discounted)
}

func (m *model) plus(o *model) {
	m.prefill.plus(&o.prefill)
	m.decode.plus(&o.decode)
}

// New returns a Learner at its prior.
func New(cfg Config) (*Learner, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	l := &Learner{cfg: cfg, engines: make(map[string]*model), peers: make(map[string]*peer), shared: make(map[string]*model)}
	l.prior = l.priorPlanes()
	return l, nil
}

// ObservePrefill records a TTFT of d on engine for a request whose own
// uncached tokens plus those queued ahead of it there (sent by the router,
// no first token yet) were tokens.
func (l *Learner) ObservePrefill(engine string, tokens int, d time.Duration) {
	l.observePrefill(engine, tokens, d, true)
}

// observePrefill adds a prefill sample to the pooled line, and to engine's
// own when own.
func (l *Learner) observePrefill(engine string, tokens int, d time.Duration, own bool) {
	if tokens <= 0 || d <= 0 {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := 1 - 1/l.cfg.Memory
	if own {
		m := l.model(engine)
		m.n++
		m.prefill.add(float64(tokens), 0, d.Seconds(), keep, 1)
	}
	l.pooled.prefill.add(float64(tokens), 0, d.Seconds(), keep, 1)
	l.changed()
}

// ObservePrefillKVBound records a TTFT like ObservePrefill, for a request
// whose wait overlapped a KV-memory stall of its engine (KVBound: a
// snapshot the router read between its send and its first token showed
// requests waiting with the KV cache near full). Such a TTFT holds the
// wait for free blocks, or the recompute after a preemption, on top of
// the prefill, so it goes to the pooled line only: it says how loaded the
// cluster is, not how fast this engine prefills. Fed to the engine's own
// line it made engines that stalled on memory look slow, each in its own
// way, and their estimates drifted apart while their real speed was one
// (docs/OPERATIONS.md, "Learned costs (online)"; loadtest/des
// TestKVBoundTTFTsKeepTheLearnedRate). The engine's own line
// learns only from TTFTs without such a stall; an engine with none is
// priced at the pooled estimate.
func (l *Learner) ObservePrefillKVBound(engine string, tokens int, d time.Duration) {
	l.observePrefill(engine, tokens, d, false)
}

// KVBoundUsage is the KV-cache usage at or above which an engine with
// requests waiting is taken to be waiting on memory (KVBound). A waiting
// request is admitted only with its uncached prompt's blocks free (and a
// running one preempted when a step finds none), so the usage a memory
// stall shows is 1 less about one prompt's share of the cache: above 0.99
// on an engine of 30,000 blocks, about 0.85 where a prompt and its output
// take a seventh of it (1,024 blocks of 16 tokens, 2,176-token prompts,
// where 0.9 missed most stalls: mean TTFT 0.22 / 0.17 / 0.31 s on seeds
// 1–3 against 0.15 / 0.15 / 0.21 s at 0.75, 0.8 and 0.85, which gave the
// same; TestKVBoundTTFTsKeepTheLearnedRate). A queue at a lower usage
// waits on the engine's token budget or sequence limit, which the prefill
// line prices.
const KVBoundUsage = 0.8

// KVBound reports whether an engine's snapshot (scheduler.Engine's
// Waiting and KVUsage: vLLM's num_requests_waiting and kv_cache_usage_perc,
// which the sidecar gossips) shows it stalled on KV memory: requests
// waiting with the cache at KVBoundUsage or above, where a waiting request
// is not admitted until blocks free and a running one may be preempted.
func KVBound(waiting int, kvUsage float64) bool {
	return waiting > 0 && kvUsage >= KVBoundUsage
}

// ObserveDecode records that engine took step per decode step over a
// stretch of steps while running seqs sequences holding ctx context tokens
// (every in-flight request's prompt plus its tokens generated so far,
// averaged over the stretch); steps weighs the sample.
func (l *Learner) ObserveDecode(engine string, seqs, ctx float64, step time.Duration, steps int) {
	if ctx < 0 || seqs <= 0 || step <= 0 || steps <= 0 || math.IsNaN(ctx+seqs) || math.IsInf(ctx+seqs, 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	keep := 1 - 1/l.cfg.Memory
	w := math.Sqrt(float64(steps)) // a long stretch is one observation, a little surer
	m := l.model(engine)
	m.n++
	m.decode.add(ctx, seqs, step.Seconds(), keep, w)
	l.pooled.decode.add(ctx, seqs, step.Seconds(), keep, w)
	l.changed()
}

func (l *Learner) model(engine string) *model {
	m, ok := l.engines[engine]
	if !ok {
		m = &model{}
		l.engines[engine] = m
	}
	return m
}

// Rates returns engine's current estimate from its samples, this router's
// and those its peers shared (the pooled estimate when the engine has none
// yet, the prior when nothing has).
func (l *Learner) Rates(engine string) Rates {
	l.mu.Lock()
	defer l.mu.Unlock()
	if c, ok := l.cache[engine]; ok && c.gen == l.gen {
		return c.rates
	}
	r := l.rates(engine)
	if l.cache == nil {
		l.cache = make(map[string]cachedRates)
	}
	l.cache[engine] = cachedRates{l.gen, r}
	return r
}

// changed marks a change to the sums: every cached estimate is stale
// (l.mu held).
func (l *Learner) changed() {
	l.gen++
	l.priorStale = true
}

// rates is Rates without the cache (l.mu held).
func (l *Learner) rates(engine string) Rates {
	var m model
	if !l.cfg.Shared {
		l.gather(&m, engine)
	}
	if m.prefill.w == 0 && m.decode.w == 0 {
		return l.estimate(l.orPooled(&m))
	}
	return l.estimateFrom(&m, l.enginePrior())
}

// priorPlanes is Prior as the two lines' planes (prefill, decode).
func (l *Learner) priorPlanes() [2][3]float64 {
	p := l.cfg.Prior
	return [2][3]float64{{p.StepBase, 1 / p.PrefillRate, 0}, {p.StepBase, p.DecodeSecPerToken, priorSeqSec}}
}

// enginePrior is the planes an engine's own lines start from: the fit
// pooled over every engine's samples, this router's and its peers' (the
// prior's planes where that fit has no samples), or the prior's planes with
// Config.Unpooled (l.mu held). The pooled planes are taken as fitted, even
// with a coefficient Rates would clamp: an engine whose first samples lie on
// the pooled planes then reports the rates every unsampled engine is given.
func (l *Learner) enginePrior() [2][3]float64 {
	if !l.priorStale || l.cfg.Unpooled {
		return l.prior
	}
	pp := l.priorPlanes()
	m := l.allPooled()
	θ, ok := l.planes(&m, pp)
	for i := range θ {
		if ok[i] && finite3(θ[i]) {
			pp[i] = θ[i]
		}
	}
	l.prior, l.priorStale = pp, false
	return pp
}

// finite3 reports whether every coefficient of θ is finite.
func finite3(θ [3]float64) bool { return finite(θ[0]) && finite(θ[1]) && finite(θ[2]) }

// finite reports whether v is neither NaN nor infinite.
func finite(v float64) bool { return !math.IsNaN(v) && !math.IsInf(v, 0) }

// RatesOver returns the estimate fitted on the samples of the engines
// listed, this router's and its peers', pooled (the pooled estimate over
// every engine when none of them has samples). A group's rate weighs each
// engine by its samples: an engine just started, with a sample or two
// near the prior, does not pull it as it would a mean of Rates.
func (l *Learner) RatesOver(engines []string) Rates {
	l.mu.Lock()
	defer l.mu.Unlock()
	var m model
	for _, id := range engines {
		l.gather(&m, id)
	}
	return l.estimate(l.orPooled(&m))
}

// gather adds engine id's sums, own and shared, to m (l.mu held).
func (l *Learner) gather(m *model, id string) {
	if own, ok := l.engines[id]; ok {
		m.plus(own)
	}
	if sh, ok := l.shared[id]; ok {
		m.plus(sh)
	}
}

// orPooled is m, or the pooled sums (own and shared) when m has no
// sample (l.mu held).
func (l *Learner) orPooled(m *model) *model {
	if m.prefill.w == 0 && m.decode.w == 0 {
		*m = l.allPooled()
	}
	return m
}

// allPooled is the pooled sums over every engine, this router's and its
// peers' (l.mu held).
func (l *Learner) allPooled() model {
	m := l.pooled
	m.plus(&l.sharedP)
	return m
}

// Pooled returns the estimate over every engine's samples (peers' included).
func (l *Learner) Pooled() Rates {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := l.allPooled()
	return l.estimate(&m)
}

func (l *Learner) estimate(m *model) Rates { return l.estimateFrom(m, l.priorPlanes()) }

// estimateFrom fits m's lines with their pseudo-samples on the planes pp
// (prefill, decode), each estimate clamped around Prior. A line without
// samples is pp's, not Prior's: an engine with prefill samples but no
// decode stretch of its own (one never idle of first tokens: every stretch
// it decodes, a request it was sent awaits its first token) is priced at
// the pooled step cost, as an engine with no sample at all is. Reporting
// the prior's there made the busiest engine the cheapest-looking one (the
// prior's step cost was 3.4× below the pooled estimate on 7b-l40s), so it
// got every short prompt and never decoded alone to correct it
// (docs/BENCHMARKS.md, "Unseen shapes (stop 68)").
func (l *Learner) estimateFrom(m *model, pp [2][3]float64) Rates {
	p, c := l.cfg.Prior, l.cfg.Clamp
	θ, _ := l.planes(m, pp)
	rate := clamp(1/θ[0][1], p.PrefillRate, c)
	if θ[0][1] == 1/p.PrefillRate {
		rate = p.PrefillRate // the prior's own plane: its rate exactly, not 1/(1/rate) rounded
	}
	return Rates{
		PrefillRate:       rate,
		StepBase:          clamp(θ[1][0], p.StepBase, c),
		DecodeSecPerToken: clamp(θ[1][1], p.DecodeSecPerToken, c),
	}
}

// planes fits m's lines (prefill, decode) with their pseudo-samples on the
// planes pp; ok says which line has samples (the other is pp's). The
// prefill line's intercept also has a prior, worth interceptWeight
// samples, at the decode line's step cost as Rates reports it (pp's
// when the decode line has no sample), unless Config.FreeIntercept.
func (l *Learner) planes(m *model, pp [2][3]float64) (θ [2][3]float64, ok [2]bool) {
	θ = pp
	if m.decode.w > 0 {
		θ[1], ok[1] = m.decode.fit(l.cfg.PriorWeight, decodeAt, pp[1], 2), true
	}
	if m.prefill.w > 0 {
		s := m.prefill
		if !l.cfg.FreeIntercept {
			sb := clamp(θ[1][0], l.cfg.Prior.StepBase, l.cfg.Clamp)
			s.xtx[0][0] += interceptWeight
			s.xty[0] += interceptWeight * sb
		}
		θ[0], ok[0] = s.fit(l.cfg.PriorWeight, prefillAt, pp[0], 3), true
	}
	return θ, ok
}

// clamp bounds v to [prior/c, prior·c]; a non-positive or non-finite v is
// the prior.
func clamp(v, prior, c float64) float64 {
	if !(v > 0) || math.IsInf(v, 0) {
		return prior
	}
	return min(max(v, prior/c), prior*c)
}

// reg is a weighted least-squares fit of y = θ·(1, x₁, x₂) with
// forgetting: the normal equations' sums, discounted by keep per sample.
// Prefill uses one regressor (x₂ always 0 and its coefficient pinned by the
// prior), decode two (context tokens and sequences), of which the fit
// solves for the context's coefficient only: the sequences' stays at the
// prior's (priorSeqSec). The sums keep x₂ so that shared Stats keep one
// form.
type reg struct {
	w   float64
	xtx [3][3]float64
	xty [3]float64
}

// plus adds o's sums to s's.
func (s *reg) plus(o *reg) {
	s.w += o.w
	for i := range s.xty {
		s.xty[i] += o.xty[i]
		for j := range s.xtx[i] {
			s.xtx[i][j] += o.xtx[i][j]
		}
	}
}

func (s *reg) add(x1, x2, y, keep, w float64) {
	v := [3]float64{1, x1, x2}
	s.w = s.w*keep + w
	for i := range v {
		s.xty[i] = s.xty[i]*keep + w*v[i]*y
		for j := range v {
			s.xtx[i][j] = s.xtx[i][j]*keep + w*v[i]*v[j]
		}
	}
}

// fit solves the normal equations of the samples plus the prior's
// pseudo-samples (weight pw/len(at) each, at the points at, on the prior's
// plane θ0) for the first n coefficients; the others stay θ0's. It returns
// θ0 when the system is singular.
func (s *reg) fit(pw float64, at [][2]float64, θ0 [3]float64, n int) [3]float64 {
	a, b := s.xtx, s.xty
	h := pw / float64(len(at))
	for _, p := range at {
		v := [3]float64{1, p[0], p[1]}
		y := θ0[0] + θ0[1]*p[0] + θ0[2]*p[1]
		for i := range v {
			b[i] += h * v[i] * y
			for j := range v {
				a[i][j] += h * v[i] * v[j]
			}
		}
	}
	θ := θ0
	// The fixed coefficients' part of y moves to the right-hand side.
	for i := 0; i < n; i++ {
		for k := n; k < 3; k++ {
			b[i] -= a[i][k] * θ0[k]
		}
	}
	// Gaussian elimination with partial pivoting on the n×n system.
	for c := 0; c < n; c++ {
		piv := c
		for r := c + 1; r < n; r++ {
			if math.Abs(a[r][c]) > math.Abs(a[piv][c]) {
				piv = r
			}
		}
		if math.Abs(a[piv][c]) < 1e-300 {
			return θ0
		}
		a[c], a[piv] = a[piv], a[c]
		b[c], b[piv] = b[piv], b[c]
		for r := c + 1; r < n; r++ {
			f := a[r][c] / a[c][c]
			for k := c; k < n; k++ {
				a[r][k] -= f * a[c][k]
			}
			b[r] -= f * b[c]
		}
	}
	for r := n - 1; r >= 0; r-- {
		v := b[r]
		for k := r + 1; k < n; k++ {
			v -= a[r][k] * θ[k]
		}
		θ[r] = v / a[r][r]
	}
	return θ
}

// ContextMeter integrates an engine's context (tokens held by its in-flight
// requests, as the router counts them) over time, so that a request's mean
// context over its decode is (Integral at finish − Integral at first
// token) / (finish − first token). Feed it the context whenever it is
// known (every event the router sees); between two readings it is taken to
// change linearly. Not safe for concurrent use.
type ContextMeter struct {
	t        time.Duration
	ctx      float64
	integral float64 // token·seconds
}

// At records that the context is ctx at time now (now never decreases).
func (m *ContextMeter) At(now time.Duration, ctx float64) {
	if now > m.t {
		m.integral += (m.ctx + ctx) / 2 * (now - m.t).Seconds()
		m.t = now
	}
	m.ctx = ctx
}

// Integral is ∫ context dt up to the last reading, token·seconds.
func (m *ContextMeter) Integral() float64 { return m.integral }

// OutputLength predicts a request's output length from the requests seen
// to finish: their mean, with forgetting (a router is not told the length;
// max_tokens, where clients send it, is only an upper bound). Not safe for
// concurrent use.
type OutputLength struct {
	w, sum float64
}

// outputMemory is OutputLength's forgetting horizon, in requests.
const outputMemory = 500

// Observe records a finished request's output length.
func (o *OutputLength) Observe(n int) {
	keep := 1 - 1.0/outputMemory
	o.w = o.w*keep + 1
	o.sum = o.sum*keep + float64(n)
}

// Predict is the expected output length, 0 before any request finished.
func (o *OutputLength) Predict() int {
	if o.w == 0 {
		return 0
	}
	return int(math.Round(o.sum / o.w))
}
