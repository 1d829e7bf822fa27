package policies

import (
	"errors"
	"sync/atomic"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// SGLang emulates sgl-router's cache_aware policy as its launcher deploys
// it (sgl-project/sglang, sgl-router/src/policies/cache_aware.rs; the
// defaults of sgl-router/py_src/sglang_router/router_args.py RouterArgs and
// the Rust CLI: cache_threshold 0.3, balance_abs_threshold 64,
// balance_rel_threshold 1.5, max_tree_size 2^26 characters; the library's
// CacheAwareConfig::default, 0.5 / 32 / 1.1, is not what `python -m
// sglang_router.launch_router` runs):
//
//   - load = the router's own count of outstanding requests per worker;
//     the system is imbalanced when max−min > abs AND max > rel·min;
//   - imbalanced: shortest queue (fewest outstanding);
//   - balanced: prefix match rate against the router's approximate tree of
//     what it routed (History: never told of engine evictions, bounded by
//     max_tree_size with LRU leaf eviction); above cache_threshold the
//     best-matching worker wins, below it the worker with the smallest
//     tree (get_smallest_tenant);
//   - the request is inserted into the chosen worker's tree in every
//     branch.
//
// Timestamps (LRU order): an insert refreshes the chosen worker's path; a
// match refreshes the best-matching worker's matched path only when the
// tree's global epoch counter (one tick per match and per insert) is a
// multiple of 8 (sgl-model-gateway tree.rs prefix_match_with_counts: "1 in
// 8 matches", which with one insert per routed request is every 4th match).
// TimestampSampling sets that period (1: every match, as the older
// sgl-router tree.rs did; 0: never).
//
// With History nil (unit tests of the thresholds) the tree is replaced by
// the index's routed-plus-confirmed view (Match.Spec) and the smallest tree
// by the lowest KV usage.
type SGLang struct {
	CacheThreshold      float64
	BalanceAbsThreshold float64
	BalanceRelThreshold float64
	History             *History
	// TimestampSampling is the epoch period of a match's timestamp update
	// (8; 0 = never).
	TimestampSampling uint64
	epoch             *atomic.Uint64
}

var (
	_ scheduler.Policy    = SGLang{}
	_ scheduler.Forgetter = SGLang{}
)

// Forget implements scheduler.Forgetter: the engine's routed history goes.
func (p SGLang) Forget(engine string) {
	if p.History != nil {
		p.History.Forget(engine)
	}
}

// SGLangConfig is the sglang block: cache_aware's thresholds and tree size.
type SGLangConfig struct {
	CacheThreshold      float64 `yaml:"cacheThreshold"`
	BalanceAbsThreshold float64 `yaml:"balanceAbsThreshold"`
	BalanceRelThreshold float64 `yaml:"balanceRelThreshold"`
	// MaxTreeSize is the per-worker tree bound in characters (upstream
	// max_tree_size); the emulation keeps MaxTreeSize/64 blocks (16 tokens
	// of ~4 characters). 0 = unbounded.
	MaxTreeSize int `yaml:"maxTreeSize"`
	// TimestampSampling: a prefix match refreshes the matched path's LRU
	// timestamp when the tree's epoch is a multiple of this (1 = every
	// match; 0 = never). Unset (nil) is upstream's 8.
	TimestampSampling *int `yaml:"timestampSampling"`
}

// charsPerBlock is the characters one 16-token block stands for (4 per
// token, the estimate llm-d and Kthena also use).
const charsPerBlock = 64

// DefaultSGLangConfig is sgl-router's launch default (router_args.py).
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.3, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, MaxTreeSize: 1 << 26}
}

// Validate lists every problem, with paths under name.
func (s SGLangConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.Within("cacheThreshold", s.CacheThreshold, 0, 1)
	p.NonNegative("balanceAbsThreshold", s.BalanceAbsThreshold)
	p.AtLeast("balanceRelThreshold", s.BalanceRelThreshold, 1)
	p.NonNegative("maxTreeSize", float64(s.MaxTreeSize))
	if s.TimestampSampling != nil {
		p.NonNegative("timestampSampling", float64(*s.TimestampSampling))
	}
	return errors.Join(p.Errs()...)
}

// SGLangFactory is policy sglang's scheduler.PolicyFactory.
func SGLangFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultSGLangConfig())
	if err != nil {
		return nil, err
	}
	return SGLangFrom(c), nil
}

// sglangTimestampSampling is sgl-model-gateway's match timestamp period.
const sglangTimestampSampling = 8

// SGLangFrom is the policy c configures, with a fresh tree.
func SGLangFrom(c SGLangConfig) SGLang {
	sampling := sglangTimestampSampling
	if c.TimestampSampling != nil {
		sampling = *c.TimestampSampling
	}
	return SGLang{CacheThreshold: c.CacheThreshold, BalanceAbsThreshold: c.BalanceAbsThreshold,
		BalanceRelThreshold: c.BalanceRelThreshold, History: NewHistory(c.MaxTreeSize/charsPerBlock, 0),
		TimestampSampling: uint64(sampling), epoch: new(atomic.Uint64)}
}

// NewSGLang returns the launch defaults.
func NewSGLang() SGLang { return SGLangFrom(DefaultSGLangConfig()) }

// Name implements scheduler.Policy.
func (SGLang) Name() string { return "sglang" }

// Pick implements scheduler.Policy.
func (p SGLang) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	i, why := p.pick(r, cs, cyc)
	if p.History != nil {
		p.History.Insert(cs[i].ID, r.Keys)
		p.tick()
	}
	return i, why
}

func (p SGLang) pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	lo, hi := cs[0].InFlight, cs[0].InFlight
	for i := range cs {
		lo, hi = min(lo, cs[i].InFlight), max(hi, cs[i].InFlight)
	}
	if float64(hi-lo) > p.BalanceAbsThreshold && float64(hi) > p.BalanceRelThreshold*float64(lo) {
		for i := range cs {
			cs[i].Score = -float64(cs[i].InFlight)
		}
		return scheduler.ArgMax(cs, cyc), "imbalanced-shortest-queue"
	}
	b := float64(r.Blocks())
	best, at, depth := 0.0, -1, 0
	for i := range cs {
		m := p.matched(r, &cs[i])
		cs[i].Score = float64(m) / b
		if m > depth {
			best, at, depth = cs[i].Score, i, m
		}
	}
	if p.History != nil && p.tick()%max(p.TimestampSampling, 1) == 0 && p.TimestampSampling > 0 && at >= 0 {
		p.History.Touch(cs[at].ID, r.Keys[:depth])
	}
	if best > p.CacheThreshold {
		return scheduler.ArgMax(cs, cyc), "cache-match"
	}
	for i := range cs {
		if p.History != nil {
			cs[i].Score = -float64(p.History.Size(cs[i].ID))
		} else {
			cs[i].Score = -cs[i].KVUsage
		}
	}
	return scheduler.ArgMax(cs, cyc), "smallest-cache"
}

// tick advances the tree's epoch (one per match and per insert) and
// returns its previous value.
func (p SGLang) tick() uint64 {
	if p.epoch == nil {
		return 1 // no counter (a literal SGLang): never sampled
	}
	return p.epoch.Add(1) - 1
}

func (p SGLang) matched(r *scheduler.Request, c *scheduler.Candidate) int {
	if p.History != nil {
		return p.History.Prefix(c.ID, r.Keys)
	}
	return c.Match.Spec
}
