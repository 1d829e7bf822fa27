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
// kv-cache-utilization-scorer, prefix-cache-scorer), each ≥ 0, not all 0.
type LLMDConfig struct {
	QueueWeight         float64 `yaml:"queueWeight"`
	KVUtilizationWeight float64 `yaml:"kvUtilizationWeight"`
	PrefixWeight        float64 `yaml:"prefixWeight"`
}

// DefaultLLMDConfig is llm-d's documented default profile: queue 2,
// kv-cache utilization 2, prefix cache 3.
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
	if p.Len() == 0 && l.QueueWeight+l.KVUtilizationWeight+l.PrefixWeight == 0 {
		p.Addf("", "queueWeight, kvUtilizationWeight and prefixWeight are all 0")
	}
	return errors.Join(p.Errs()...)
}

// LLMDFactory is policy llmd's scheduler.PolicyFactory.
func LLMDFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultLLMDConfig())
	if err != nil {
		return nil, err
	}
	w, err := NewLLMD(LLMDWeights{Queue: c.QueueWeight, KVUtilization: c.KVUtilizationWeight, Prefix: c.PrefixWeight})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// LLMD emulates the llm-d inference scheduler's default scoring profile
// (llm-d/llm-d-inference-scheduler, deploy/config: queue-scorer weight 2,
// kv-cache-utilization-scorer weight 2, prefix-cache-scorer weight 3, then
// the max-score picker). Scores are in [0,1] and the weighted sum is
// divided by the weight total so the result stays in [0,1].
//
//   - queue-scorer: min-max normalised waiting queue (metrics snapshot).
//   - kv-cache-utilization-scorer: 1 − KV usage (metrics snapshot).
//   - prefix-cache-scorer (precise mode, from KV events): confirmed matched
//     blocks / request blocks.
func LLMD() *scheduler.Weighted {
	w, _ := NewLLMD(DefaultLLMDWeights())
	return w
}

// NewLLMD is LLMD with other scorer weights: each finite and ≥ 0, not all 0.
func NewLLMD(w LLMDWeights) (*scheduler.Weighted, error) {
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
		scheduler.WeightedScorer{Scorer: confirmedPrefix{}, Weight: w.Prefix},
	)
	if err != nil {
		return nil, err
	}
	p.Scale = 1 / total
	return p, nil
}

// confirmedPrefix scores confirmed (event-backed, any tier) matched blocks
// over request blocks: what a router without speculation sees.
type confirmedPrefix struct{}

var _ scheduler.Scorer = confirmedPrefix{}

func (confirmedPrefix) Name() string { return "prefix-cache" }

func (confirmedPrefix) Score(r *scheduler.Request, cs []scheduler.Candidate, out []float64) {
	b := float64(r.Blocks())
	for i := range cs {
		out[i] = float64(cs[i].Match.Other) / b
	}
}
