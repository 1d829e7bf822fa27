package policies

import (
	"errors"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Kthena emulates the Kthena router's default scheduler profile
// (volcano-sh/kthena, pkg/kthena-router/scheduler/plugins: the
// least-request and kvcache-aware score plugins, both weight 1): each
// plugin scores pods 0–100 and the router picks the highest weighted sum.
//
//   - least-request: base = running + 100·waiting from the engine's
//     metrics (a snapshot); score = 100·(maxBase − base)/maxBase.
//   - kvcache-aware: 100 · matched blocks / request blocks, from the
//     engines' KV events (confirmed blocks, any tier).
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
	LeastRequestWeight float64 // default 1
	KVCacheWeight      float64 // default 1
}

var _ scheduler.Policy = Kthena{}

// KthenaConfig is the kthena block: the plugin weights.
type KthenaConfig struct {
	LeastRequestWeight float64 `yaml:"leastRequestWeight"`
	KVCacheWeight      float64 `yaml:"kvCacheWeight"`
}

// DefaultKthenaConfig is Kthena's published default.
func DefaultKthenaConfig() KthenaConfig { return KthenaConfig{LeastRequestWeight: 1, KVCacheWeight: 1} }

// Validate lists every problem, with paths under name.
func (k KthenaConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("leastRequestWeight", k.LeastRequestWeight)
	p.NonNegative("kvCacheWeight", k.KVCacheWeight)
	return errors.Join(p.Errs()...)
}

// KthenaFactory is policy kthena's scheduler.PolicyFactory.
func KthenaFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultKthenaConfig())
	if err != nil {
		return nil, err
	}
	return Kthena(c), nil
}

// NewKthena returns Kthena with its published default weights.
func NewKthena() Kthena { return Kthena(DefaultKthenaConfig()) }

// Name implements scheduler.Policy.
func (Kthena) Name() string { return "kthena" }

// Pick implements scheduler.Policy.
func (k Kthena) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	maxBase := 0.0
	for i := range cs {
		maxBase = max(maxBase, kthenaBase(&cs[i]))
	}
	blocks := float64(r.Blocks())
	for i := range cs {
		lr := 100.0
		if maxBase > 0 {
			lr = 100 * (maxBase - kthenaBase(&cs[i])) / maxBase
		}
		kv := 100 * float64(cs[i].Match.Other) / blocks
		cs[i].Score = k.LeastRequestWeight*lr + k.KVCacheWeight*kv
	}
	return scheduler.ArgMax(cs, cyc), "weighted-score"
}

func kthenaBase(c *scheduler.Candidate) float64 {
	return float64(c.Running) + 100*float64(c.Waiting)
}
