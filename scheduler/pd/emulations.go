package pd

import (
	"slices"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// Emulations of the published P/D routers' pair choice with their default
// parameters (docs/PD.md lists the sources). Each adds its chosen option
// first (highest score) and, where the router has a fallback, the fallback
// options after it.

var (
	_ Policy = Kthena{}
	_ Policy = LLMD{}
	_ Policy = Dynamo{}
	_ Policy = SGLang{}
	_ Policy = AIBrix{}
)

// Kthena emulates Kthena's P/D scheduling: score the decode engines with
// least-request, least-latency and prefix-cache (weight 1 each, 0–100),
// keep the top TopK, pick the best prefill engine of the same pdGroup for
// each (least-request + prefix-cache), and try the pairs in that order.
// It never bypasses disaggregation: with no prefill engine there is no
// option.
type Kthena struct{ TopK int }

// NewKthena returns the published default (top 5).
func NewKthena() Kthena { return Kthena{TopK: 5} }

// Name implements Policy.
func (Kthena) Name() string { return "kthena" }

// Choose implements Policy.
func (k Kthena) Choose(r *scheduler.Request, v *View, cyc *scheduler.Cycle) string {
	ds := slices.Clone(v.Decoders) // emulation only: not a hot path
	score := kthenaScores(r, v, ds, true)
	slices.SortStableFunc(ds, func(a, b int) int {
		switch {
		case score[a] > score[b]:
			return -1
		case score[a] < score[b]:
			return 1
		}
		return 0
	})
	ps := kthenaScores(r, v, v.Prefillers, false)
	rank := 0.0
	for _, d := range ds[:min(len(ds), max(k.TopK, 1))] {
		best := -1
		for _, p := range v.Prefillers {
			if v.SameGroup(p, d) && (best < 0 || ps[p] > ps[best]) {
				best = p
			}
		}
		if best >= 0 {
			v.Add(best, d, -rank)
			rank++
		}
	}
	return "top-decode-then-prefill"
}

// kthenaScores scores the engines at idx (by candidate index):
// least-request 100·(maxBase − base)/maxBase with base = running +
// 100·waiting, prefix-cache 100·matched/blocks, and for decode engines
// least-latency 100·(max − x)/max over TTFT and TPOT (100 when unknown).
func kthenaScores(r *scheduler.Request, v *View, idx []int, latency bool) map[int]float64 {
	out := make(map[int]float64, len(idx))
	maxBase, maxTTFT, maxTPOT := 0.0, 0.0, 0.0
	for _, i := range idx {
		c := &v.Cands[i]
		maxBase = max(maxBase, float64(c.Running)+100*float64(c.Waiting))
		maxTTFT, maxTPOT = max(maxTTFT, c.TTFT.Seconds()), max(maxTPOT, c.TPOT.Seconds())
	}
	blocks := float64(r.Blocks())
	for _, i := range idx {
		c := &v.Cands[i]
		lr := 100.0
		if maxBase > 0 {
			lr = 100 * (maxBase - float64(c.Running) - 100*float64(c.Waiting)) / maxBase
		}
		s := lr + 100*float64(c.Match.Other)/blocks
		if latency {
			lat := 100.0
			if maxTTFT > 0 && maxTPOT > 0 {
				lat = 50*(maxTTFT-c.TTFT.Seconds())/maxTTFT + 50*(maxTPOT-c.TPOT.Seconds())/maxTPOT
			}
			s += lat
		}
		out[i] = s
	}
	return out
}

// LLMD emulates llm-d's P/D profile handler: the decode profile picks the
// decode engine first (prefix-cache scorer weight 2, queue scorer weight 1),
// then the prefix-based-pd-decider disaggregates iff promptTokens ≥
// NonCachedTokens and promptTokens − decodeHitBlocks·blockSize ≥
// NonCachedTokens; the prefill profile (same weights) picks the prefill
// engine. The routing sidecar falls back to local decode when the prefill
// leg fails, so the aggregated option follows the pair.
type LLMD struct {
	NonCachedTokens int // 0 disables disaggregation
	PrefixWeight    float64
	QueueWeight     float64
}

// NewLLMD returns the sample configuration (nonCachedTokens 16).
func NewLLMD() LLMD { return LLMD{NonCachedTokens: 16, PrefixWeight: 2, QueueWeight: 1} }

// Name implements Policy.
func (LLMD) Name() string { return "llmd" }

// Choose implements Policy.
func (l LLMD) Choose(r *scheduler.Request, v *View, cyc *scheduler.Cycle) string {
	d := l.best(r, v, v.Decoders, -1, cyc)
	if d < 0 {
		return "no-decode"
	}
	nonCached := r.PromptTokens - v.Cands[d].MatchTokens(r, v.Cands[d].Match.Other)
	if l.NonCachedTokens > 0 && r.PromptTokens >= l.NonCachedTokens && nonCached >= l.NonCachedTokens {
		if p := l.best(r, v, v.Prefillers, d, cyc); p >= 0 {
			v.Add(p, d, 2)
			v.Add(-1, d, 1)
			return "decider-disaggregate"
		}
	}
	v.Add(-1, d, 2)
	return "decider-local"
}

// best runs the weighted profile over idx (restricted to pair's group when
// pair ≥ 0) and returns the winner's candidate index, -1 when none.
func (l LLMD) best(r *scheduler.Request, v *View, idx []int, pair int, cyc *scheduler.Cycle) int {
	var in []int
	for _, i := range idx {
		if pair < 0 || v.SameGroup(i, pair) {
			in = append(in, i)
		}
	}
	if len(in) == 0 {
		return -1
	}
	cs := v.Sub(in)
	q := cyc.Floats(0, len(cs))
	policiesQueue(r, cs, q)
	blocks := float64(r.Blocks())
	for i := range cs {
		cs[i].Score = l.PrefixWeight*float64(cs[i].Match.Other)/blocks + l.QueueWeight*q[i]
	}
	return in[scheduler.ArgMax(cs, cyc)]
}

// Dynamo emulates Dynamo's disaggregated KV router with conditional
// disaggregation (policy isl_bounding, its defaults): the decode worker is
// chosen by the KV router's default selector (overlap weight 1: prefill
// blocks still to compute + active decode blocks, lowest wins; conditional
// disaggregation needs the decode workers' KV visibility), then the request
// prefills locally iff eff_isl = prompt − overlap·block < EffISLThreshold
// and eff_isl/prompt < EffISLRatio; otherwise the prefill router (overlap
// weight 1, active-block tracking off) picks the prefill worker. Dynamo
// falls back to decode-only when the prefill fails.
type Dynamo struct {
	EffISLThreshold int     // default 2048
	EffISLRatio     float64 // default 0.7
	OverlapWeight   float64 // default 1
}

// NewDynamo returns the published defaults.
func NewDynamo() Dynamo { return Dynamo{EffISLThreshold: 2048, EffISLRatio: 0.7, OverlapWeight: 1} }

// Name implements Policy.
func (Dynamo) Name() string { return "dynamo" }

// Choose implements Policy.
func (y Dynamo) Choose(r *scheduler.Request, v *View, cyc *scheduler.Cycle) string {
	bs := float64(max(r.BlockSize, 1))
	reqBlocks := float64(r.PromptTokens) / bs
	prefillBlocks := func(c *scheduler.Candidate) float64 {
		return float64(c.LocalPrefillTokens)/bs + reqBlocks - c.InRequestBlocks(r, float64(c.Match.GPU))
	}
	d, dl := -1, 0.0
	for _, i := range v.Decoders {
		c := &v.Cands[i]
		l := y.OverlapWeight*prefillBlocks(c) + float64(c.LocalActiveTokens)/bs + reqBlocks
		if d < 0 || l < dl || l == dl && cyc.Intn(2) == 0 {
			d, dl = i, l
		}
	}
	if d < 0 {
		return "no-decode"
	}
	eff := r.PromptTokens - v.Cands[d].MatchTokens(r, v.Cands[d].Match.GPU)
	local := eff < y.EffISLThreshold && float64(eff) < y.EffISLRatio*float64(max(r.PromptTokens, 1))
	p, pl := -1, 0.0
	for _, i := range v.Prefillers {
		if !v.SameGroup(i, d) {
			continue
		}
		l := y.OverlapWeight * prefillBlocks(&v.Cands[i])
		if p < 0 || l < pl || l == pl && cyc.Intn(2) == 0 {
			p, pl = i, l
		}
	}
	if local || p < 0 {
		v.Add(-1, d, 2)
		return "conditional-local"
	}
	v.Add(p, d, 2)
	v.Add(-1, d, 1)
	return "conditional-remote"
}

// SGLang emulates sgl-model-gateway's PD mode with the recommended policies:
// cache_aware for the prefill engine (policies.SGLang, its defaults) and
// power_of_two for the decode engine (two random decode engines, the one
// with fewer outstanding requests). Always disaggregated; both legs go out
// at once.
type SGLang struct{ Prefill policies.SGLang }

var _ scheduler.Forgetter = SGLang{}

// Forget implements scheduler.Forgetter: the prefill policy's routed
// history of the engine goes.
func (s SGLang) Forget(engine string) { s.Prefill.Forget(engine) }

// NewSGLang returns the defaults.
func NewSGLang() SGLang { return SGLang{Prefill: policies.NewSGLang()} }

// Name implements Policy.
func (SGLang) Name() string { return "sglang" }

// Choose implements Policy.
func (s SGLang) Choose(r *scheduler.Request, v *View, cyc *scheduler.Cycle) string {
	if len(v.Prefillers) == 0 {
		return "no-prefill"
	}
	cs := v.Sub(v.Prefillers)
	pick, _ := s.Prefill.Pick(r, cs, cyc)
	p := v.Prefillers[pick]
	var ds []int
	for _, d := range v.Decoders {
		if v.SameGroup(p, d) {
			ds = append(ds, d)
		}
	}
	if len(ds) == 0 {
		return "no-decode"
	}
	a, b := ds[cyc.Intn(len(ds))], ds[cyc.Intn(len(ds))]
	if v.Cands[b].InFlight < v.Cands[a].InFlight {
		a = b
	}
	v.Add(p, a, 1)
	return "cache-aware-power-of-two"
}

// AIBrix emulates AIBrix's pd routing within a role set: every (prefill,
// decode) pair of one group gets P/maxP + D/maxD, lowest wins, where P is
// the prefill engine's prefill work with this request (queued prefill
// tokens + the request's tokens it does not cache) and D the decode
// engine's requests (running + waiting + 1). AIBrix's imbalance fast paths
// are left out. Always disaggregated.
type AIBrix struct{}

// Name implements Policy.
func (AIBrix) Name() string { return "aibrix" }

// Choose implements Policy.
func (AIBrix) Choose(r *scheduler.Request, v *View, _ *scheduler.Cycle) string {
	pScore := func(c *scheduler.Candidate) float64 {
		return float64(max(c.QueuedPrefillTokens, c.LocalPrefillTokens) + max(0, r.PromptTokens-c.CachedTokens))
	}
	dScore := func(c *scheduler.Candidate) float64 { return float64(max(c.Running+c.Waiting, c.InFlight) + 1) }
	maxP, maxD := 0.0, 0.0
	for _, p := range v.Prefillers {
		maxP = max(maxP, pScore(&v.Cands[p]))
	}
	for _, d := range v.Decoders {
		maxD = max(maxD, dScore(&v.Cands[d]))
	}
	for _, p := range v.Prefillers {
		for _, d := range v.Decoders {
			if v.SameGroup(p, d) {
				v.Add(p, d, -(pScore(&v.Cands[p])/max(maxP, 1) + dScore(&v.Cands[d])/max(maxD, 1)))
			}
		}
	}
	return "normalized-sum"
}
