package scheduler

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the kvmesh_scheduler_* series: atomics on the hot path, read
// by the registry only when scraped.
type metrics struct {
	decisions     atomic.Uint64
	noCandidates  atomic.Uint64
	filtered      atomic.Uint64
	matchedBlocks atomic.Uint64 // chosen engine's tier-weighted matched blocks (rounded)
	offeredBlocks atomic.Uint64 // the most any candidate held, tier-weighted (rounded)
	requestBlocks atomic.Uint64
}

// RegisterMetrics registers the scheduler's metrics with reg. Call once.
func (s *Scheduler) RegisterMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	counter := func(name, help string, v *atomic.Uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: prometheus.Labels{"policy": s.policy.Name()}},
			func() float64 { return float64(v.Load()) })
	}
	for _, c := range []prometheus.Collector{
		counter("kvmesh_scheduler_decisions_total", "Routing decisions made.", &s.m.decisions),
		counter("kvmesh_scheduler_no_candidates_total", "Requests for which every engine was filtered out.", &s.m.noCandidates),
		counter("kvmesh_scheduler_filtered_engines_total", "Engines removed by filters, summed over decisions.", &s.m.filtered),
		counter("kvmesh_scheduler_matched_blocks_total", "Tier-weighted prefix blocks the chosen engine already held (ratio to request blocks = routed hit rate).", &s.m.matchedBlocks),
		counter("kvmesh_scheduler_offered_blocks_total", "Tier-weighted prefix blocks the candidate holding the most of each request held (matched over offered = the part of the cache hits on offer the policy took).", &s.m.offeredBlocks),
		counter("kvmesh_scheduler_request_blocks_total", "Full blocks of routed requests.", &s.m.requestBlocks),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
