// Package registry is the one place kvmesh's scheduler plugins are
// registered: Plugins names every filter block, scorer and policy, and the
// functions below build schedulers and parse SchedulerConfig files with
// that set. Each plugin owns its parameters (its config struct, defaults,
// strict decoding and Validate, and a factory) in its own package; adding
// one is that package plus one line here.
package registry

import (
	"log/slog"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/filters"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/scorers"
)

// Plugins returns a new set holding every kvmesh plugin. The policies are
// listed in display order (baselines, emulated routers, kvmesh's own, the
// generic weighted one); the default policy is kvmesh.
func Plugins() *scheduler.Plugins {
	p := &scheduler.Plugins{}
	p.RegisterFilters("filters", filters.Factory)

	p.RegisterScorer("prefix", scorers.Prefix{})
	p.RegisterScorer("load", scorers.Load{})
	p.RegisterScorer("queue", scorers.Queue{})
	p.RegisterScorer("kv-usage", scorers.KVUsage{})
	p.RegisterScorer("latency", scorers.Latency{})
	p.RegisterScorer("lora-affinity", scorers.LoRA{})
	p.RegisterScorer("session-affinity", scorers.Session{})

	p.RegisterPolicy("random", scheduler.NoParams(func() scheduler.Policy { return policies.Random{} }))
	p.RegisterPolicy("round-robin", scheduler.NoParams(func() scheduler.Policy { return &policies.RoundRobin{} }))
	p.RegisterPolicy("least-request", scheduler.NoParams(func() scheduler.Policy { return policies.LeastRequest{} }))
	p.RegisterPolicy("kthena", policies.KthenaFactory)
	p.RegisterPolicy("kthena-kvcache", policies.KthenaKVCacheFactory)
	p.RegisterPolicy("ray", policies.RayFactory)
	p.RegisterPolicy("sglang", policies.SGLangFactory)
	p.RegisterPolicy("dynamo", policies.DynamoFactory)
	p.RegisterPolicy("llmd", policies.LLMDFactory)
	p.RegisterPolicy("llmd-precise", policies.LLMDPreciseFactory)
	p.RegisterPolicy("kvmesh", policies.KVMeshFactory)
	p.RegisterPolicy("weighted", p.WeightedFactory)
	p.SetDefaultPolicy("kvmesh")
	return p
}

// all is the set the functions below use; it is only read after init.
var all = Plugins()

// PolicyNames lists every policy, in display order.
func PolicyNames() []string { return all.PolicyNames() }

// ScorerNames lists every scorer a weighted policy may use.
func ScorerNames() []string { return all.ScorerNames() }

// DefaultConfig is the configuration used when no file is given.
func DefaultConfig() scheduler.Config { return all.DefaultConfig() }

// ParseConfig decodes a SchedulerConfig strictly and validates it
// (scheduler.Plugins.ParseConfig).
func ParseConfig(data []byte) (scheduler.Config, error) { return all.ParseConfig(data) }

// LoadConfig reads and parses a SchedulerConfig file.
func LoadConfig(path string) (scheduler.Config, error) { return all.LoadConfig(path) }

// Validate lists every problem with cfg (not defaulted).
func Validate(cfg *scheduler.Config) error { return all.Validate(cfg) }

// Policy builds the policy cfg names, with its parameters.
func Policy(cfg *scheduler.Config) (scheduler.Policy, error) { return all.Policy(cfg) }

// New validates cfg (after defaults) and builds a Scheduler over idx (nil
// for no prefix information).
func New(cfg scheduler.Config, idx scheduler.PrefixIndex, log *slog.Logger) (*scheduler.Scheduler, error) {
	return all.New(cfg, idx, log)
}

// NewPolicy is New with only the policy name changed from the defaults.
func NewPolicy(name string, seed uint64, idx scheduler.PrefixIndex) (*scheduler.Scheduler, error) {
	cfg := DefaultConfig()
	cfg.Policy, cfg.Seed = name, seed
	return New(cfg, idx, nil)
}
