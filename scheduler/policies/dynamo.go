package policies

import (
	"errors"
	"sync"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Dynamo emulates NVIDIA Dynamo's KV router default worker selector
// (ai-dynamo/dynamo, lib/kv-router: scheduling/config.rs defaults
// overlap_score_credit 1, prefill_load_scale 1, temperature 0, output
// blocks not tracked, assume_kv_reuse on, host_cache_hit_weight 0.75;
// selector/default.rs; sequence.rs ActiveSequences):
//
//	logit = max(0, prefill_blocks − overlap_weight·gpu_overlap
//	               − host_weight·host_overlap) + decode_blocks
//
// where prefill_blocks = (the worker's outstanding prefill tokens + this
// request's tokens) / block size, gpu_overlap the leading blocks the worker
// holds on GPU (KV events), host_overlap the blocks that continue that
// prefix in its CPU tier (the lower-tier indexer's continuation:
// Match.CPU − Match.GPU), and decode_blocks the worker's active blocks after
// adding this request: the distinct prompt blocks of its active requests
// (a prefix shared by many counts once) plus this request's blocks not
// already among them. No output blocks are counted. Temperature 0 picks
// the lowest logit.
//
// The active sequences are the router's own (Active): Pick adds the chosen
// request's blocks, and the caller reports each request's end (Finished):
// the DES does, and so does the ingress (scheduler.Scheduler.Finished,
// called when a request finishes). With Active nil (unit tests of the
// formula) decode_blocks falls back to the caller's LocalActiveTokens /
// block size + this request's blocks (no de-duplication).
type Dynamo struct {
	OverlapWeight float64
	// HostWeight credits a CPU-tier (host-pinned) block that continues the
	// GPU prefix (host_cache_hit_weight, 0.75).
	HostWeight float64
	Active     *ActiveBlocks
}

var _ scheduler.Policy = Dynamo{}

// Finisher is a policy that tracks the requests it routed: the caller
// reports each request's end with the engine it was routed to and the
// prompt's keys (scheduler.Finisher).
type Finisher = scheduler.Finisher

var (
	_ Finisher            = Dynamo{}
	_ scheduler.Forgetter = Dynamo{}
)

// Forget implements scheduler.Forgetter: the engine's active blocks go.
func (p Dynamo) Forget(engine string) {
	if p.Active != nil {
		p.Active.Forget(engine)
	}
}

// DynamoConfig is the dynamo block: the KV router's overlap credits.
type DynamoConfig struct {
	OverlapWeight float64 `yaml:"overlapWeight"`
	// HostCacheHitWeight is host_cache_hit_weight: the credit of a CPU-tier
	// block (0 ignores the CPU tier).
	HostCacheHitWeight float64 `yaml:"hostCacheHitWeight"`
}

// DefaultDynamoConfig is Dynamo's published default.
func DefaultDynamoConfig() DynamoConfig {
	return DynamoConfig{OverlapWeight: 1, HostCacheHitWeight: 0.75}
}

// Validate lists every problem, with paths under name.
func (d DynamoConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("overlapWeight", d.OverlapWeight)
	p.Within("hostCacheHitWeight", d.HostCacheHitWeight, 0, 1)
	return errors.Join(p.Errs()...)
}

// DynamoFactory is policy dynamo's scheduler.PolicyFactory.
func DynamoFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultDynamoConfig())
	if err != nil {
		return nil, err
	}
	return DynamoFrom(c), nil
}

// DynamoFrom is the policy c configures, with a fresh active-sequence
// tracker (its caller reports finished requests: see Dynamo).
func DynamoFrom(c DynamoConfig) Dynamo {
	return Dynamo{OverlapWeight: c.OverlapWeight, HostWeight: c.HostCacheHitWeight, Active: NewActiveBlocks()}
}

// NewDynamo returns the published defaults.
func NewDynamo() Dynamo { return DynamoFrom(DefaultDynamoConfig()) }

// Name implements scheduler.Policy.
func (Dynamo) Name() string { return "dynamo" }

// Pick implements scheduler.Policy.
func (p Dynamo) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	bs := float64(max(r.BlockSize, 1))
	reqBlocks := float64(r.PromptTokens) / bs
	for i := range cs {
		c := &cs[i]
		// The overlap in the request's blocks, as the rest: an engine of
		// another block size (Request.Chains) matches in its own.
		credit := c.InRequestBlocks(r, p.OverlapWeight*float64(c.Match.GPU)+p.HostWeight*float64(c.Match.CPU-c.Match.GPU))
		prefill := max(0, float64(c.LocalPrefillTokens)/bs+reqBlocks-credit)
		var decode float64
		if p.Active != nil {
			decode = float64(p.Active.After(c.ID, r.Keys))
		} else {
			decode = float64(c.LocalActiveTokens)/bs + reqBlocks
		}
		c.Score = -(prefill + decode)
	}
	i := scheduler.ArgMax(cs, cyc)
	if p.Active != nil {
		p.Active.Add(cs[i].ID, r.Keys)
	}
	return i, "lowest-cost"
}

// Finished implements Finisher.
func (p Dynamo) Finished(engine string, keys []uint64) {
	if p.Active != nil {
		p.Active.Remove(engine, keys)
	}
}

// ActiveBlocks is Dynamo's ActiveSequences: per worker, the prompt blocks
// of its active requests, reference-counted so a shared block counts once.
// Safe for concurrent use.
type ActiveBlocks struct {
	mu sync.Mutex
	w  map[string]map[uint64]int32
}

// NewActiveBlocks returns an empty tracker.
func NewActiveBlocks() *ActiveBlocks { return &ActiveBlocks{w: make(map[string]map[uint64]int32)} }

// Blocks is the worker's distinct active blocks.
func (a *ActiveBlocks) Blocks(worker string) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.w[worker])
}

// After is the worker's distinct active blocks if keys were added.
func (a *ActiveBlocks) After(worker string, keys []uint64) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.w[worker]
	n := len(m)
	for _, k := range keys {
		if _, ok := m[k]; !ok {
			n++
		}
	}
	return n
}

// Add makes keys active on worker.
func (a *ActiveBlocks) Add(worker string, keys []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.w[worker]
	if m == nil {
		m = make(map[uint64]int32, len(keys))
		a.w[worker] = m
	}
	for _, k := range keys {
		m[k]++
	}
}

// Forget drops worker's record (the worker left the cluster).
func (a *ActiveBlocks) Forget(worker string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.w, worker)
}

// Workers is how many workers have a record.
func (a *ActiveBlocks) Workers() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.w)
}

// Remove ends one request holding keys on worker.
func (a *ActiveBlocks) Remove(worker string, keys []uint64) {
	a.mu.Lock()
	defer a.mu.Unlock()
	m := a.w[worker]
	for _, k := range keys {
		if m[k] <= 1 {
			delete(m, k)
		} else {
			m[k]--
		}
	}
}
