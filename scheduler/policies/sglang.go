package policies

import (
	"errors"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// SGLang emulates sgl-router's cache_aware policy with its defaults
// (sgl-project/sglang, sgl-router/src/policies/cache_aware.rs:
// cache_threshold 0.5, balance_abs_threshold 32, balance_rel_threshold
// 1.1):
//
//   - load = the router's own count of outstanding requests per worker;
//     the system is imbalanced when max−min > abs AND max > rel·min;
//   - imbalanced: shortest queue (fewest outstanding);
//   - balanced: prefix match rate against the router's approximate tree of
//     what it routed (here: the index with speculative entries); above
//     cache_threshold the best-matching worker wins, below it the worker
//     with the smallest tree, i.e. the emptiest cache (here: lowest KV
//     usage).
type SGLang struct {
	CacheThreshold      float64
	BalanceAbsThreshold float64
	BalanceRelThreshold float64
}

var _ scheduler.Policy = SGLang{}

// SGLangConfig is the sglang block: cache_aware's thresholds.
type SGLangConfig struct {
	CacheThreshold      float64 `yaml:"cacheThreshold"`
	BalanceAbsThreshold float64 `yaml:"balanceAbsThreshold"`
	BalanceRelThreshold float64 `yaml:"balanceRelThreshold"`
}

// DefaultSGLangConfig is sgl-router's published default.
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.5, BalanceAbsThreshold: 32, BalanceRelThreshold: 1.1}
}

// Validate lists every problem, with paths under name.
func (s SGLangConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.Within("cacheThreshold", s.CacheThreshold, 0, 1)
	p.NonNegative("balanceAbsThreshold", s.BalanceAbsThreshold)
	p.AtLeast("balanceRelThreshold", s.BalanceRelThreshold, 1)
	return errors.Join(p.Errs()...)
}

// SGLangFactory is policy sglang's scheduler.PolicyFactory.
func SGLangFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultSGLangConfig())
	if err != nil {
		return nil, err
	}
	return SGLang(c), nil
}

// NewSGLang returns the published defaults.
func NewSGLang() SGLang { return SGLang(DefaultSGLangConfig()) }

// Name implements scheduler.Policy.
func (SGLang) Name() string { return "sglang" }

// Pick implements scheduler.Policy.
func (p SGLang) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
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
	best := 0.0
	for i := range cs {
		best = max(best, float64(cs[i].Match.Spec)/b)
	}
	if best > p.CacheThreshold {
		for i := range cs {
			cs[i].Score = float64(cs[i].Match.Spec) / b
		}
		return scheduler.ArgMax(cs, cyc), "cache-match"
	}
	for i := range cs {
		cs[i].Score = -cs[i].KVUsage
	}
	return scheduler.ArgMax(cs, cyc), "smallest-cache"
}
