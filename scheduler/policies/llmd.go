package policies

import (
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/scorers"
)

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
	w, _ := scheduler.NewWeighted("llmd",
		scheduler.WeightedScorer{Scorer: scorers.Queue{}, Weight: 2},
		scheduler.WeightedScorer{Scorer: scorers.KVUsage{}, Weight: 2},
		scheduler.WeightedScorer{Scorer: confirmedPrefix{}, Weight: 3},
	)
	w.Scale = 1.0 / 7
	return w
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
