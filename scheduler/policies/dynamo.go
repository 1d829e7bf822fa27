package policies

import (
	"errors"

	"go.yaml.in/yaml/v3"

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

// DynamoConfig is the dynamo block: the KV router's overlap weight.
type DynamoConfig struct {
	OverlapWeight float64 `yaml:"overlapWeight"`
}

// DefaultDynamoConfig is Dynamo's published default.
func DefaultDynamoConfig() DynamoConfig { return DynamoConfig{OverlapWeight: 1} }

// Validate lists every problem, with paths under name.
func (d DynamoConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("overlapWeight", d.OverlapWeight)
	return errors.Join(p.Errs()...)
}

// DynamoFactory is policy dynamo's scheduler.PolicyFactory.
func DynamoFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultDynamoConfig())
	if err != nil {
		return nil, err
	}
	return Dynamo(c), nil
}

// NewDynamo returns the published defaults.
func NewDynamo() Dynamo { return Dynamo(DefaultDynamoConfig()) }

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
