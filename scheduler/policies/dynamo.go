package policies

import (
	"github.com/kvmesh/kvmesh/scheduler"
)

// Dynamo emulates NVIDIA Dynamo's KV router default worker selector
// (ai-dynamo/dynamo, lib/llm/src/kv_router/scheduler.rs
// DefaultWorkerSelector and docs/router/kv_cache_routing.md:
// kv-overlap-score-weight 1, router-temperature 0):
//
//	logit = overlap_weight · prefill_blocks + decode_blocks
//
// where prefill_blocks are the blocks the worker would still have to
// prefill (its outstanding prefill plus this request's blocks minus the
// overlap it already caches, from KV events) and decode_blocks its active
// blocks after adding this request (the router's own active-sequence
// tracking). Temperature 0 picks the lowest logit.
type Dynamo struct {
	OverlapWeight float64
}

var _ scheduler.Policy = Dynamo{}

// NewDynamo returns the published defaults.
func NewDynamo() Dynamo { return Dynamo{OverlapWeight: 1} }

// Name implements scheduler.Policy.
func (Dynamo) Name() string { return "dynamo" }

// Pick implements scheduler.Policy.
func (p Dynamo) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	bs := float64(max(r.BlockSize, 1))
	reqBlocks := float64(r.PromptTokens) / bs
	for i := range cs {
		c := &cs[i]
		prefill := float64(c.LocalPrefillTokens)/bs + reqBlocks - float64(c.Match.GPU)
		decode := float64(c.LocalActiveTokens)/bs + reqBlocks
		c.Score = -(p.OverlapWeight*prefill + decode)
	}
	return scheduler.ArgMax(cs, cyc), "lowest-cost"
}
