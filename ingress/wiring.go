package ingress

import (
	"fmt"
	"hash/fnv"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/filters"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// defaultScheduler builds the configured policy over the index (a local one
// holding only speculative entries when no materialized index is wired, so
// routing still follows recent prefixes).
func defaultScheduler(cfg *Config, deps *Deps) (Scheduler, error) {
	s, _, err := learningScheduler(cfg, deps, nil)
	return s, err
}

// learningScheduler is defaultScheduler with lr, when not nil, as the
// kvmesh policy's cost model (learn.go); hold is that policy's router-side
// hold rule (hold.go), zero (off) for any other policy or without lr.
func learningScheduler(cfg *Config, deps *Deps, lr *learn.Learner) (_ Scheduler, hold policies.Hold, _ error) {
	if deps.Index == nil {
		idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL, ExactLookup: cfg.ExactLookup})
		if err != nil {
			return nil, hold, fmt.Errorf("local index: %w", err)
		}
		deps.Index = idx
	}
	sc := cfg.Scheduler
	sc.Seed = replicaSeed(sc.Seed, cfg.ID)
	if lr != nil {
		if s, k, ok, err := learnedKVMesh(sc, deps, lr); ok || err != nil {
			if err != nil {
				return nil, hold, err
			}
			return s, k.Hold, nil
		}
	}
	s, err := registry.New(sc, deps.Index, deps.Logger)
	if err != nil {
		return nil, hold, fmt.Errorf("scheduler: %w", err)
	}
	return s, hold, nil
}

// replicaSeed mixes the replica's id into the configured seed, so the
// random policy and every tie-break draw a different stream on each ingress
// replica: with one seed for all, N replicas make the same "random" choice
// for their k-th request, herding a cold cluster onto the same engines. A
// given seed and id still give the same stream (reproducible runs).
func replicaSeed(seed uint64, id string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	return seed ^ h.Sum64()
}

// learnedKVMesh builds the scheduler as registry.New does, with lr set as
// the kvmesh policy's Costs (the DES does the same), and the policy; ok is
// false when the policy is not kvmesh's.
func learnedKVMesh(sc scheduler.Config, deps *Deps, lr *learn.Learner) (_ *scheduler.Scheduler, k policies.KVMesh, ok bool, _ error) {
	sc.Defaults()
	if err := registry.Validate(&sc); err != nil {
		return nil, k, true, fmt.Errorf("scheduler: %w", err)
	}
	pol, err := registry.Policy(&sc)
	if err != nil {
		return nil, k, true, fmt.Errorf("scheduler: %w", err)
	}
	k, ok = pol.(policies.KVMesh)
	if !ok {
		if c, isCloser := pol.(scheduler.Closer); isCloser {
			_ = c.Close()
		}
		return nil, k, false, nil
	}
	k.Costs = lr
	var fp *yaml.Node
	if n, ok := sc.Params["filters"]; ok {
		fp = &n
	}
	fs, err := filters.Factory("filters", fp)
	if err != nil {
		return nil, k, true, fmt.Errorf("scheduler: %w", err)
	}
	s, err := scheduler.New(fs, k, deps.Index, scheduler.Options{TierWeights: sc.Weights(), Seed: sc.Seed, Logger: deps.Logger})
	if err != nil {
		return nil, k, true, fmt.Errorf("scheduler: %w", err)
	}
	return s, k, true, nil
}
