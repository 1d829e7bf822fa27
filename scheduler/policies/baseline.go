package policies

import (
	"sync/atomic"

	"github.com/kvmesh/kvmesh/scheduler"
)

var (
	_ scheduler.Policy = Random{}
	_ scheduler.Policy = (*RoundRobin)(nil)
	_ scheduler.Policy = LeastRequest{}
)

// Random picks uniformly among candidates.
type Random struct{}

// Name implements scheduler.Policy.
func (Random) Name() string { return "random" }

// Pick implements scheduler.Policy.
func (Random) Pick(_ *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	for i := range cs {
		cs[i].Score = cyc.Float()
	}
	return scheduler.ArgMax(cs, cyc), "random"
}

// RoundRobin cycles through candidates in the order given.
type RoundRobin struct{ next atomic.Uint64 }

// Name implements scheduler.Policy.
func (*RoundRobin) Name() string { return "round-robin" }

// Pick implements scheduler.Policy.
func (p *RoundRobin) Pick(_ *scheduler.Request, cs []scheduler.Candidate, _ *scheduler.Cycle) (int, string) {
	n := p.next.Add(1) - 1
	pick := int(n % uint64(len(cs)))
	for i := range cs {
		// Rank fallbacks in rotation order after the pick.
		cs[i].Score = -float64((i - pick + len(cs)) % len(cs))
	}
	return pick, "round-robin"
}

// LeastRequest picks the engine with the fewest in-flight requests (from
// every ingress), as Envoy's and most gateways' least_request does.
type LeastRequest struct{}

// Name implements scheduler.Policy.
func (LeastRequest) Name() string { return "least-request" }

// Pick implements scheduler.Policy.
func (LeastRequest) Pick(_ *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	for i := range cs {
		cs[i].Score = -float64(cs[i].InFlight)
	}
	return scheduler.ArgMax(cs, cyc), "least-in-flight"
}
