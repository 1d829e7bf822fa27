package policies

import (
	"errors"
	"fmt"
	"math"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/scorers"
)

// LLMDWeights are the llm-d scorer weights.
type LLMDWeights struct {
	Queue         float64 // queue-scorer
	KVUtilization float64 // kv-cache-utilization-scorer
	Prefix        float64 // prefix-cache-scorer
}

// DefaultLLMDWeights are llm-d's documented defaults: queue 2,
// kv-cache utilization 2, prefix cache 3.
func DefaultLLMDWeights() LLMDWeights {
	return LLMDWeights{Queue: 2, KVUtilization: 2, Prefix: 3}
}

// LLMDConfig is the llmd block: the scorer weights (queue-scorer,
// kv-cache-utilization-scorer, prefix-cache-scorer), each ≥ 0, not all 0,
// and the approximate prefix producer's autoTune.
type LLMDConfig struct {
	QueueWeight         float64 `yaml:"queueWeight"`
	KVUtilizationWeight float64 `yaml:"kvUtilizationWeight"`
	PrefixWeight        float64 `yaml:"prefixWeight"`
	// AutoTune sizes each server's routing-history LRU by the KV capacity
	// the server reports (vllm:cache_config_info num_gpu_blocks) instead of
	// 31,250 blocks. Unset (nil) is upstream's default, true. llmd
	// (approximate) only.
	AutoTune *bool `yaml:"autoTune"`
	// PreciseScore is how llmd-precise turns matched blocks into a score:
	// "min-max" (or unset: upstream's indexedScoresToNormalizedScoredPods,
	// min-max over the pods with a hit, 1 when they tie, 0 without a hit) or
	// "fraction" (matched / request blocks). llmd-precise only.
	PreciseScore string `yaml:"preciseScore"`
}

// DefaultLLMDConfig is llm-d's documented default profile: queue 2,
// kv-cache utilization 2, prefix cache 3 (autoTune unset: on).
func DefaultLLMDConfig() LLMDConfig {
	d := DefaultLLMDWeights()
	return LLMDConfig{QueueWeight: d.Queue, KVUtilizationWeight: d.KVUtilization, PrefixWeight: d.Prefix}
}

// Validate lists every problem, with paths under name.
func (l LLMDConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("queueWeight", l.QueueWeight)
	p.NonNegative("kvUtilizationWeight", l.KVUtilizationWeight)
	p.NonNegative("prefixWeight", l.PrefixWeight)
	if l.PreciseScore != "" && l.PreciseScore != "min-max" && l.PreciseScore != "fraction" {
		p.Addf("preciseScore", "%q is not min-max or fraction", l.PreciseScore)
	}
	if p.Len() == 0 && l.QueueWeight+l.KVUtilizationWeight+l.PrefixWeight == 0 {
		p.Addf("", "queueWeight, kvUtilizationWeight and prefixWeight are all 0")
	}
	return errors.Join(p.Errs()...)
}

// LLMDFactory is policy llmd's scheduler.PolicyFactory: llm-d's built-in
// default profile with its approximate (routing-history) prefix scorer.
func LLMDFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultLLMDConfig())
	if err != nil {
		return nil, err
	}
	p, err := NewLLMDApproximate(LLMDWeights{Queue: c.QueueWeight, KVUtilization: c.KVUtilizationWeight, Prefix: c.PrefixWeight})
	if c.AutoTune != nil {
		p.AutoTune = *c.AutoTune
	}
	return p, err
}

// DefaultLLMDPreciseConfig is llm-d's precise-prefix-cache sample profile
// (deploy/config/epp-precise-prefix-cache-config.yaml): prefix 2, KV
// utilisation 1, queue 1.
func DefaultLLMDPreciseConfig() LLMDConfig {
	return LLMDConfig{QueueWeight: 1, KVUtilizationWeight: 1, PrefixWeight: 2}
}

// LLMDPreciseFactory is policy llmd-precise's scheduler.PolicyFactory: the
// precise (KV-event) prefix scorer with the sample config's weights.
func LLMDPreciseFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultLLMDPreciseConfig())
	if err != nil {
		return nil, err
	}
	w, err := newLLMD(LLMDWeights{Queue: c.QueueWeight, KVUtilization: c.KVUtilizationWeight, Prefix: c.PrefixWeight},
		confirmedPrefix{MinMax: c.PreciseScore != "fraction"})
	if err != nil {
		return nil, err
	}
	w.PolicyName = name
	return w, nil
}

// llm-d's approximate prefix producer (approximateprefix/types.go): 16-token
// blocks (64 characters at 4 per token), at most 256 blocks of a prompt, an
// LRU of 31,250 blocks per server unless autoTune sizes it by the server's
// reported capacity (makeServer: CacheNumGPUBlocks when reported).
const (
	llmdMaxPrefixBlocks = 256
	llmdLRUPerServer    = 31_250
)

// LLMDApproximate is llm-d's default profile with the approximate prefix
// scorer: its prefix view is the router's own record of what it routed
// where (History), which it updates after every pick; it never hears of an
// engine's evictions.
type LLMDApproximate struct {
	*scheduler.Weighted
	History *History
	// AutoTune: a server's LRU holds as many blocks as the server reports
	// (Engine.GPUBlocks, from the metrics snapshot); 31,250 while it
	// reports none.
	AutoTune bool
}

var _ scheduler.Forgetter = LLMDApproximate{}

// Forget implements scheduler.Forgetter: the server's routed history goes.
func (l LLMDApproximate) Forget(engine string) {
	if l.History != nil {
		l.History.Forget(engine)
	}
}

// NewLLMDApproximate is LLMDApproximate with the given weights, autoTune on
// (upstream's default) and a fresh history.
func NewLLMDApproximate(w LLMDWeights) (LLMDApproximate, error) {
	h := NewHistory(llmdLRUPerServer, llmdMaxPrefixBlocks)
	p, err := newLLMD(w, historyPrefix{h})
	if err != nil {
		return LLMDApproximate{}, err
	}
	return LLMDApproximate{Weighted: p, History: h, AutoTune: true}, nil
}

// Pick implements scheduler.Policy: the weighted pick, then the chosen
// server records the prompt (the producer's PreRequest hook).
func (l LLMDApproximate) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	i, why := l.Weighted.Pick(r, cs, cyc)
	capacity := l.History.Capacity
	if l.AutoTune && cs[i].GPUBlocks > 0 {
		capacity = cs[i].GPUBlocks
	}
	l.History.InsertCap(cs[i].ID, r.Keys, capacity)
	return i, why
}

// historyPrefix scores a server's contiguous routed-history match over the
// request's first 256 blocks.
type historyPrefix struct{ h *History }

func (historyPrefix) Name() string { return "prefix-cache" }

func (p historyPrefix) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	n := r.Blocks()
	if p.h.MaxBlocks > 0 {
		n = min(n, p.h.MaxBlocks)
	}
	b := float64(n)
	for i := range cs {
		out[i] = float64(p.h.Prefix(cs[i].ID, r.Keys)) / b
	}
}

// LLMD is the llm-d inference scheduler's scoring (llm-d/llm-d-inference-
// scheduler @520af47, pkg/epp/config/loader/defaults.go: queue-scorer weight
// 2, kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3, then
// the max-score picker) with a precise prefix view. Scores are in [0,1] and
// the weighted sum is divided by the weight total so the result stays in
// [0,1] (the argmax is unchanged).
//
//   - queue-scorer: min-max normalised waiting queue (metrics snapshot).
//   - kv-cache-utilization-scorer: 1 − KV usage (metrics snapshot).
//   - prefix-cache-scorer, precise (KV events): confirmed matched blocks /
//     request blocks.
//
// The registry's "llmd" is the shipped default, whose prefix scorer is the
// approximate one (LLMDApproximate); "llmd-precise" is the precise sample
// config's weights (prefix 2, KV 1, queue 1) over this view.
func LLMD() *scheduler.Weighted {
	w, _ := NewLLMD(DefaultLLMDWeights())
	return w
}

// NewLLMD is LLMD with other scorer weights: each finite and ≥ 0, not all
// 0. Its prefix view is precise (KV events, confirmed blocks).
func NewLLMD(w LLMDWeights) (*scheduler.Weighted, error) { return newLLMD(w, confirmedPrefix{}) }

func newLLMD(w LLMDWeights, prefix scheduler.Scorer) (*scheduler.Weighted, error) {
	total := w.Queue + w.KVUtilization + w.Prefix
	for _, v := range []float64{w.Queue, w.KVUtilization, w.Prefix} {
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 {
			return nil, fmt.Errorf("policy llmd: %w: weight %v is not a finite number ≥ 0", scheduler.ErrConfig, v)
		}
	}
	if total <= 0 || math.IsInf(total, 0) {
		return nil, fmt.Errorf("policy llmd: %w: weights sum to %v", scheduler.ErrConfig, total)
	}
	p, err := scheduler.NewWeighted("llmd",
		scheduler.WeightedScorer{Scorer: scorers.Queue{}, Weight: w.Queue},
		scheduler.WeightedScorer{Scorer: scorers.KVUsage{}, Weight: w.KVUtilization},
		scheduler.WeightedScorer{Scorer: prefix, Weight: w.Prefix},
	)
	if err != nil {
		return nil, err
	}
	p.Scale = 1 / total
	return p, nil
}

// confirmedPrefix scores confirmed (event-backed, any tier) matched blocks:
// what a router without speculation sees. By default over request blocks;
// MinMax as llm-d's precise scorer normalises its per-pod longest-prefix
// counts (utils.go indexedScoresToNormalizedScoredPods): min-max over the
// pods with a hit, 1 for each when they tie (or only one has a hit), 0 for
// a pod without one.
type confirmedPrefix struct{ MinMax bool }

var _ scheduler.Scorer = confirmedPrefix{}

func (confirmedPrefix) Name() string { return "prefix-cache" }

func (p confirmedPrefix) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	if !p.MinMax {
		b := float64(r.Blocks())
		for i := range cs {
			out[i] = float64(cs[i].Match.Other) / b
		}
		return
	}
	lo, hi := math.MaxInt, 0
	for i := range cs {
		if m := cs[i].Match.Other; m > 0 {
			lo, hi = min(lo, m), max(hi, m)
		}
	}
	for i := range cs {
		m := cs[i].Match.Other
		switch {
		case m == 0:
			out[i] = 0
		case hi == lo:
			out[i] = 1
		default:
			out[i] = float64(m-lo) / float64(hi-lo)
		}
	}
}
