package ingress

import (
	"fmt"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

// defaultScheduler builds the configured policy over the index (a local one
// holding only speculative entries when no materialized index is wired, so
// routing still follows recent prefixes).
func defaultScheduler(cfg *Config, deps *Deps) (Scheduler, error) {
	if deps.Index == nil {
		idx, err := index.New(index.Config{SpeculativeTTL: cfg.SpeculativeTTL, ExactLookup: cfg.ExactLookup})
		if err != nil {
			return nil, fmt.Errorf("local index: %w", err)
		}
		deps.Index = idx
	}
	sc := cfg.Scheduler
	s, err := registry.New(sc, deps.Index, deps.Logger)
	if err != nil {
		return nil, fmt.Errorf("scheduler: %w", err)
	}
	return s, nil
}
