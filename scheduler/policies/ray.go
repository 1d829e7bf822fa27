package policies

import (
	"errors"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// Ray emulates Ray Serve LLM's PrefixCacheAffinityRouter with its defaults
// (ray-project/ray, python/ray/llm/_internal/serve/request_router/
// prefix_aware/prefix_aware_router.py and doc/source/serve/advanced-guides/
// prefix-aware-request-router.md: imbalanced_threshold 10,
// match_rate_threshold 0.1):
//
//   - queue length = the router's count of ongoing requests per replica;
//   - balanced (max−min ≤ imbalanced_threshold: the code's test is
//     "highest_queue_len - lowest_queue_len > imbalanced_threshold"):
//     the replicas with the highest prefix match rate (the router's tree of
//     routed text: History, unbounded because do_eviction defaults to
//     False) when it is ≥ 10%, else the replicas with the smallest trees
//     (get_smallest_tenants); of that shortlist the one with the smallest
//     queue ("a set of candidate replicas, of which the one with the
//     smallest replica queue will be chosen"), ties at random;
//   - imbalanced: Power of Two Choices over all replicas;
//   - the routed request's text is inserted into the chosen replica's tree.
//
// With History nil (unit tests of the thresholds) the tree is the index's
// routed-plus-confirmed view (Match.Spec) and tree size the KV usage.
type Ray struct {
	ImbalancedThreshold float64
	MatchRateThreshold  float64
	History             *History
	// ProbedQueue reads queue lengths as Ray's router gets them from its
	// probes: the replica's own count (running + waiting), as old as the
	// last metrics snapshot, instead of the router's fresh in-flight count.
	ProbedQueue bool
}

var (
	_ scheduler.Policy    = Ray{}
	_ scheduler.Forgetter = Ray{}
)

// Forget implements scheduler.Forgetter: the engine's routed history goes.
func (p Ray) Forget(engine string) {
	if p.History != nil {
		p.History.Forget(engine)
	}
}

// RayConfig is the ray block: PrefixCacheAffinityRouter's thresholds.
type RayConfig struct {
	ImbalancedThreshold float64 `yaml:"imbalancedThreshold"`
	MatchRateThreshold  float64 `yaml:"matchRateThreshold"`
	// ProbedQueue: queue lengths from the replicas' reported load (a probe's
	// answer, snapshot-old) instead of the router's own in-flight count.
	ProbedQueue bool `yaml:"probedQueue"`
}

// DefaultRayConfig is Ray Serve's published default.
func DefaultRayConfig() RayConfig { return RayConfig{ImbalancedThreshold: 10, MatchRateThreshold: 0.1} }

// Validate lists every problem, with paths under name.
func (r RayConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegative("imbalancedThreshold", r.ImbalancedThreshold)
	p.Within("matchRateThreshold", r.MatchRateThreshold, 0, 1)
	return errors.Join(p.Errs()...)
}

// RayFactory is policy ray's scheduler.PolicyFactory.
func RayFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, DefaultRayConfig())
	if err != nil {
		return nil, err
	}
	return RayFrom(c), nil
}

// RayFrom is the policy c configures, with a fresh (unbounded) tree.
func RayFrom(c RayConfig) Ray {
	return Ray{ImbalancedThreshold: c.ImbalancedThreshold, MatchRateThreshold: c.MatchRateThreshold, History: NewHistory(0, 0),
		ProbedQueue: c.ProbedQueue}
}

// NewRay returns the published defaults.
func NewRay() Ray { return RayFrom(DefaultRayConfig()) }

// Name implements scheduler.Policy.
func (Ray) Name() string { return "ray" }

// Pick implements scheduler.Policy.
func (p Ray) Pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	i, why := p.pick(r, cs, cyc)
	if p.History != nil {
		p.History.Insert(cs[i].ID, r.Keys)
	}
	return i, why
}

func (p Ray) pick(r *scheduler.Request, cs []scheduler.Candidate, cyc *scheduler.Cycle) (int, string) {
	q := func(i int) int { return cs[i].InFlight }
	if p.ProbedQueue {
		q = func(i int) int { return cs[i].Running + cs[i].Waiting }
	}
	lo, hi := q(0), q(0)
	for i := range cs {
		lo, hi = min(lo, q(i)), max(hi, q(i))
	}
	for i := range cs {
		cs[i].Score = -float64(q(i))
	}
	if float64(hi-lo) > p.ImbalancedThreshold {
		return powerOfTwo(cs, cyc, nil), "imbalanced-pow2"
	}
	b := float64(r.Blocks())
	rate := make([]float64, len(cs)) // per decision; Ray's own router allocates far more
	use := make([]float64, len(cs))
	best := 0.0
	for i := range cs {
		if p.History != nil {
			rate[i] = float64(p.History.Prefix(cs[i].ID, r.Keys)) / b
			use[i] = float64(p.History.Size(cs[i].ID))
		} else {
			rate[i], use[i] = float64(cs[i].Match.Spec)/b, cs[i].KVUsage
		}
		best = max(best, rate[i])
	}
	if best >= p.MatchRateThreshold {
		return leastQueued(cs, cyc, func(i int) bool { return rate[i] == best }), "prefix-match"
	}
	lowest := use[0]
	for i := range cs {
		lowest = min(lowest, use[i])
	}
	return leastQueued(cs, cyc, func(i int) bool { return use[i] == lowest }), "low-utilization"
}

// leastQueued returns the eligible candidate with the fewest in-flight
// requests (Score holds −in-flight), ties broken at random.
func leastQueued(cs []scheduler.Candidate, cyc *scheduler.Cycle, ok func(int) bool) int {
	best, n := -1, 0
	for i := range cs {
		if !ok(i) {
			continue
		}
		switch {
		case best < 0 || cs[i].Score > cs[best].Score:
			best, n = i, 1
		case cs[i].Score == cs[best].Score:
			n++
			if cyc.Intn(n) == 0 { // reservoir: each tie equally likely
				best = i
			}
		}
	}
	if best < 0 {
		return cyc.Intn(len(cs))
	}
	return best
}

// powerOfTwo samples two distinct eligible candidates at random and
// returns the one with fewer in-flight requests (Score already holds
// −in-flight). With one eligible candidate it is returned.
func powerOfTwo(cs []scheduler.Candidate, cyc *scheduler.Cycle, ok func(int) bool) int {
	n := 0
	for i := range cs {
		if ok == nil || ok(i) {
			n++
		}
	}
	if n == 0 {
		return cyc.Intn(len(cs))
	}
	a := cyc.Intn(n)
	b := a
	if n > 1 {
		b = (a + 1 + cyc.Intn(n-1)) % n
	}
	ia, ib, k := -1, -1, 0
	for i := range cs {
		if ok != nil && !ok(i) {
			continue
		}
		if k == a {
			ia = i
		}
		if k == b {
			ib = i
		}
		k++
	}
	if cs[ib].Score > cs[ia].Score {
		return ib
	}
	return ia
}
