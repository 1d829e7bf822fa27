package policies

import (
	"errors"
	"math"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Kthena emulates the Kthena router (volcano-sh/kthena,
// pkg/kthena-router/scheduler/plugins) in its two common configurations,
// each plugin scoring pods 0–100 (integers, as upstream truncates) and the
// router picking the highest weighted sum:
//
//   - "kthena", as the Helm chart installs it (charts/kthena/charts/
//     networking/templates/kthena-router/component/configmap.yaml, mounted
//     as the router's configuration): least-request 1, gpu-usage 1,
//     least-latency 1, prefix-cache 1. Without a configuration file the
//     router falls back to scheduler_impl.go's list, the same without
//     gpu-usage: {gpuUsageWeight: 0} in the kthena block.
//   - "kthena-kvcache", the documented kvcache-aware setup of Kthena's
//     benchmark blog and user guide: least-request 1, kvcache-aware 1.
//
// Plugins:
//
//   - least-request (HEAD since 19dcb9b8, 2026-05-09): base = onFlight +
//     100·max(onFlight − running, 0), onFlight being the router's own count
//     of requests in flight to the pod and running the pod's metric;
//     score = 100·(maxBase − base)/maxBase.
//   - gpu-usage (plugins/gpu.go): int((1 − the pod's GPU KV cache usage)·100),
//     the usage from the pods' metrics (the 200 ms snapshot).
//   - least-latency: the pods' TTFT and TPOT from their metrics, each
//     min-max normalised (100 for the fastest), blended 0.5/0.5; a pod
//     without samples scores 100.
//   - prefix-cache: the router's own history of routed prompts (History):
//     64-byte text blocks (≈ 16 tokens, the DES's block), only the first
//     128 blocks, an LRU of 50,000 hashes per pod; a hit at block i counts
//     as i+1 matched (searched from the end); score = 100·matched/hashed
//     blocks for the top 5 pods, 0 for the rest.
//   - kvcache-aware: matched blocks from the engines' KV events (confirmed,
//     any tier), first 128 blocks; score = 100·matched/min(blocks, 128).
//
// Left out on purpose: least-request is also a filter plugin in Kthena
// (maxWaitingRequests, 10 in scheduler_impl.go's default arguments) and the
// router fails a request when every pod has 10 or more waiting ("pods have
// all been filtered out"). In the Kthena long-prompt scenario (concurrency
// 300 on 3 engines) every engine has more than 10 waiting for most of the
// run, so the emulation would reject most requests and its throughput and
// TTFT would say nothing comparable; kvmesh's own maxWaiting filter
// (filters.maxWaiting) is the equivalent, off by default.
type Kthena struct {
	name               string
	LeastRequestWeight float64
	GPUUsageWeight     float64
	LeastLatencyWeight float64
	PrefixCacheWeight  float64
	KVCacheWeight      float64
	// MaxBlocks is how many leading blocks the prefix plugins hash (128).
	MaxBlocks int
	// TopK is how many pods prefix-cache scores (5).
	TopK int
	// History is prefix-cache's store (nil when PrefixCacheWeight is 0).
	History *History
}

var (
	_ scheduler.Policy    = Kthena{}
	_ scheduler.Forgetter = Kthena{}
)

// Forget implements scheduler.Forgetter: the engine's routed history goes.
func (k Kthena) Forget(engine string) {
	if k.History != nil {
		k.History.Forget(engine)
	}
}

// KthenaConfig is the kthena (and kthena-kvcache) block: plugin weights
// and the prefix plugins' sizes.
type KthenaConfig struct {
	LeastRequestWeight float64 `yaml:"leastRequestWeight"`
	GPUUsageWeight     float64 `yaml:"gpuUsageWeight"`
	LeastLatencyWeight float64 `yaml:"leastLatencyWeight"`
	PrefixCacheWeight  float64 `yaml:"prefixCacheWeight"`
	KVCacheWeight      float64 `yaml:"kvCacheWeight"`
	MaxBlocksToMatch   int     `yaml:"maxBlocksToMatch"`
	MaxHashCacheSize   int     `yaml:"maxHashCacheSize"`
	TopKMatches        int     `yaml:"topKMatches"`
}

// DefaultKthenaConfig is Kthena's plugin set as its Helm chart installs it.
func DefaultKthenaConfig() KthenaConfig {
	return KthenaConfig{LeastRequestWeight: 1, GPUUsageWeight: 1, LeastLatencyWeight: 1, PrefixCacheWeight: 1,
		MaxBlocksToMatch: 128, MaxHashCacheSize: 50_000, TopKMatches: 5}
}

// DefaultKthenaKVCacheConfig is Kthena's kvcache-aware setup.
func DefaultKthenaKVCacheConfig() KthenaConfig {
	return KthenaConfig{LeastRequestWeight: 1, KVCacheWeight: 1, MaxBlocksToMatch: 128, MaxHashCacheSize: 50_000, TopKMatches: 5}
}

// Validate lists every problem, with paths under name.
func (k KthenaConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("leastRequestWeight", k.LeastRequestWeight)
	p.NonNegative("gpuUsageWeight", k.GPUUsageWeight)
	p.NonNegative("leastLatencyWeight", k.LeastLatencyWeight)
	p.NonNegative("prefixCacheWeight", k.PrefixCacheWeight)
	p.NonNegative("kvCacheWeight", k.KVCacheWeight)
	p.AtLeast("maxBlocksToMatch", float64(k.MaxBlocksToMatch), 1)
	p.AtLeast("maxHashCacheSize", float64(k.MaxHashCacheSize), 1)
	p.AtLeast("topKMatches", float64(k.TopKMatches), 1)
	return errors.Join(p.Errs()...)
}

// KthenaFactory is policy kthena's scheduler.PolicyFactory.
func KthenaFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultKthenaConfig())
	if err != nil {
		return nil, err
	}
	return KthenaFrom(name, c), nil
}

// KthenaKVCacheFactory is policy kthena-kvcache's scheduler.PolicyFactory.
func KthenaKVCacheFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultKthenaKVCacheConfig())
	if err != nil {
		return nil, err
	}
	return KthenaFrom(name, c), nil
}

// KthenaFrom is the policy c configures, named name, with a fresh store.
func KthenaFrom(name string, c KthenaConfig) Kthena {
	k := Kthena{name: name, LeastRequestWeight: c.LeastRequestWeight, GPUUsageWeight: c.GPUUsageWeight, LeastLatencyWeight: c.LeastLatencyWeight,
		PrefixCacheWeight: c.PrefixCacheWeight, KVCacheWeight: c.KVCacheWeight, MaxBlocks: c.MaxBlocksToMatch, TopK: c.TopKMatches}
	if c.PrefixCacheWeight > 0 {
		k.History = NewHistory(c.MaxHashCacheSize, c.MaxBlocksToMatch)
	}
	return k
}

// NewKthena returns Kthena as its Helm chart installs it.
func NewKthena() Kthena { return KthenaFrom("kthena", DefaultKthenaConfig()) }

// NewKthenaKVCache returns Kthena's kvcache-aware setup.
func NewKthenaKVCache() Kthena { return KthenaFrom("kthena-kvcache", DefaultKthenaKVCacheConfig()) }

// Name implements scheduler.Policy.
func (k Kthena) Name() string {
	if k.name == "" {
		return "kthena"
	}
	return k.name
}

// Pick implements scheduler.Policy.
func (k Kthena) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	for i := range cs {
		cs[i].Score = 0
	}
	if k.LeastRequestWeight > 0 {
		k.leastRequest(cs)
	}
	if k.GPUUsageWeight > 0 {
		for i := range cs {
			cs[i].Score += k.GPUUsageWeight * kthenaGPUUsage(cs[i].KVUsage)
		}
	}
	if k.LeastLatencyWeight > 0 {
		kthenaLeastLatency(cs, k.LeastLatencyWeight)
	}
	hashed := r.Blocks()
	if k.MaxBlocks > 0 {
		hashed = min(hashed, k.MaxBlocks)
	}
	if k.KVCacheWeight > 0 {
		for i := range cs {
			m := min(cs[i].Match.Other, hashed)
			cs[i].Score += k.KVCacheWeight * float64(int(100*float64(m)/float64(hashed)))
		}
	}
	if k.PrefixCacheWeight > 0 && k.History != nil {
		k.prefixCache(r, cs, hashed)
	}
	pick := scheduler.ArgMax(cs, cyc)
	if k.History != nil {
		k.History.Insert(cs[pick].ID, r.Keys) // PostSchedule: the chosen pod gets the hashes
	}
	return pick, "weighted-score"
}

func (k Kthena) leastRequest(cs []scheduler.Candidate) {
	maxBase := 0.0
	for i := range cs {
		maxBase = max(maxBase, kthenaBase(&cs[i]))
	}
	for i := range cs {
		lr := 100.0
		if maxBase > 0 {
			lr = 100 * (maxBase - kthenaBase(&cs[i])) / maxBase
		}
		cs[i].Score += k.LeastRequestWeight * float64(int(lr))
	}
}

// kthenaBase is least-request's base: onFlight + 100·max(onFlight −
// running, 0) (least_request.go at HEAD).
func kthenaBase(c *scheduler.Candidate) float64 {
	on := c.InFlight
	return float64(on) + 100*float64(max(on-c.Running, 0))
}

// kthenaGPUUsage is gpu-usage's score: int((1 − usage)·100) (gpu.go).
func kthenaGPUUsage(usage float64) float64 { return float64(int((1 - usage) * 100)) }

// kthenaLeastLatency adds least-latency's score times w.
func kthenaLeastLatency(cs []scheduler.Candidate, w float64) {
	const f = 0.5 // TTFTTPOTWeightFactor default
	minTTFT, maxTTFT, minTPOT, maxTPOT := math.MaxFloat64, 0.0, math.MaxFloat64, 0.0
	for i := range cs {
		a, b := cs[i].TTFT.Seconds(), cs[i].TPOT.Seconds()
		if a <= 0 || b <= 0 {
			continue
		}
		minTTFT, maxTTFT = min(minTTFT, a), max(maxTTFT, a)
		minTPOT, maxTPOT = min(minTPOT, b), max(maxTPOT, b)
	}
	for i := range cs {
		a, b := cs[i].TTFT.Seconds(), cs[i].TPOT.Seconds()
		if a <= 0 || b <= 0 {
			cs[i].Score += w * 100
			continue
		}
		sa, sb := 100.0, 100.0
		if maxTTFT > minTTFT {
			sa = 100 * (maxTTFT - a) / (maxTTFT - minTTFT)
		}
		if maxTPOT > minTPOT {
			sb = 100 * (maxTPOT - b) / (maxTPOT - minTPOT)
		}
		cs[i].Score += w * float64(int(sa*f+sb*(1-f)))
	}
}

// prefixCache adds prefix-cache's score: the top K pods by match depth
// score 100·depth/hashed, the rest 0.
func (k Kthena) prefixCache(r *scheduler.Request, cs []scheduler.Candidate, hashed int) {
	type hit struct{ i, depth int }
	var top [8]hit
	hits := top[:0]
	for i := range cs {
		if d := k.History.Deepest(cs[i].ID, r.Keys); d > 0 {
			hits = append(hits, hit{i, d})
		}
	}
	// Upstream walks from the deepest block and stops at K pods, so the K
	// deepest matches score (ties at one depth in map order: here by
	// candidate order).
	slices.SortStableFunc(hits, func(a, b hit) int { return b.depth - a.depth })
	if len(hits) > k.TopK {
		hits = hits[:k.TopK]
	}
	for _, h := range hits {
		cs[h.i].Score += k.PrefixCacheWeight * float64(int(100*float64(h.depth)/float64(hashed)))
	}
}
