// Package registry is the one place kvmesh's scheduler plugins are
// registered: it turns a scheduler.Config into a ready Scheduler. It owns no
// logic of its own beyond the name → constructor tables.
package registry

import (
	"fmt"
	"log/slog"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/filters"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/scorers"
)

// scorerTable maps config scorer names to scorers.
var scorerTable = map[string]scheduler.Scorer{
	"prefix":           scorers.Prefix{},
	"load":             scorers.Load{},
	"queue":            scorers.Queue{},
	"kv-usage":         scorers.KVUsage{},
	"latency":          scorers.Latency{},
	"lora-affinity":    scorers.LoRA{},
	"session-affinity": scorers.Session{},
}

// Policy builds the policy cfg names, with its parameters.
func Policy(cfg *scheduler.Config) (scheduler.Policy, error) {
	switch cfg.Policy {
	case "random":
		return policies.Random{}, nil
	case "round-robin":
		return &policies.RoundRobin{}, nil
	case "least-request":
		return policies.LeastRequest{}, nil
	case "kthena":
		p := policies.NewKthena()
		if k := cfg.Kthena; k != nil {
			p.LeastRequestWeight, p.KVCacheWeight = k.LeastRequestWeight, k.KVCacheWeight
		}
		return p, nil
	case "ray":
		p := policies.NewRay()
		if r := cfg.Ray; r != nil {
			p.ImbalancedThreshold, p.MatchRateThreshold = r.ImbalancedThreshold, r.MatchRateThreshold
		}
		return p, nil
	case "sglang":
		p := policies.NewSGLang()
		if s := cfg.SGLang; s != nil {
			p = policies.SGLang{CacheThreshold: s.CacheThreshold, BalanceAbsThreshold: s.BalanceAbsThreshold, BalanceRelThreshold: s.BalanceRelThreshold}
		}
		return p, nil
	case "dynamo":
		p := policies.NewDynamo()
		if d := cfg.Dynamo; d != nil {
			p.OverlapWeight = d.OverlapWeight
		}
		return p, nil
	case "llmd":
		l := cfg.LLMD
		if l == nil {
			return policies.LLMD(), nil
		}
		p, err := policies.NewLLMD(policies.LLMDWeights{Queue: l.QueueWeight, KVUtilization: l.KVUtilizationWeight, Prefix: l.PrefixWeight})
		if err != nil {
			return nil, err
		}
		return p, nil
	case "kvmesh":
		p := policies.NewKVMesh()
		if k := cfg.KVMesh; k != nil {
			p = policies.KVMeshFrom(*k)
		}
		return p, p.Validate()
	case "weighted":
		ws := make([]scheduler.WeightedScorer, 0, len(cfg.Weighted))
		for _, s := range cfg.Weighted {
			sc, ok := scorerTable[s.Name]
			if !ok {
				return nil, fmt.Errorf("policy weighted: %w: unknown scorer %q", scheduler.ErrConfig, s.Name)
			}
			ws = append(ws, scheduler.WeightedScorer{Scorer: sc, Weight: s.Weight})
		}
		return scheduler.NewWeighted("weighted", ws...)
	}
	return nil, fmt.Errorf("policy %q: %w: unknown policy", cfg.Policy, scheduler.ErrConfig)
}

// Filters builds the filter chain: health, model, role always; LoRA and
// max-waiting as configured.
func Filters(cfg *scheduler.Config) []scheduler.Filter {
	fs := []scheduler.Filter{filters.Health{}, filters.Model{}, filters.Role{}}
	if cfg.Filters.StrictLoRA {
		fs = append(fs, filters.LoRA{Strict: true})
	}
	if cfg.Filters.MaxWaiting > 0 {
		fs = append(fs, filters.MaxWaiting{Limit: cfg.Filters.MaxWaiting})
	}
	return fs
}

// New validates cfg (after defaults) and builds a Scheduler over idx (nil
// for no prefix information).
func New(cfg scheduler.Config, idx scheduler.PrefixIndex, log *slog.Logger) (*scheduler.Scheduler, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	p, err := Policy(&cfg)
	if err != nil {
		return nil, err
	}
	return scheduler.New(Filters(&cfg), p, idx, scheduler.Options{TierWeights: cfg.Weights(), Seed: cfg.Seed, Logger: log})
}

// NewPolicy is New with only the policy name changed from the defaults.
func NewPolicy(name string, seed uint64, idx scheduler.PrefixIndex) (*scheduler.Scheduler, error) {
	cfg := scheduler.DefaultConfig()
	cfg.Policy, cfg.Seed = name, seed
	return New(cfg, idx, nil)
}
