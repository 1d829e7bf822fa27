package autoscale

import (
	"fmt"
	"math"
	"slices"
)

// PodBudget bounds the pods of a target's roles together: Σ replicas ×
// PerReplica ≤ Limit, over every role PerReplica names. A ModelDeployment
// has one (v1alpha1.MaxPods: its controller refuses, and freezes, a
// deployment above it), each replica of a role being groups × (1 + workers)
// pods.
type PodBudget struct {
	Limit int64
	// PerReplica are the pods one replica of each role costs. A role the
	// policy does not scale (or that has no decision this step) counts at
	// its observation's Current.
	PerReplica map[string]int64
	// Of names what holds the pods, for the reasons ("ModelDeployment h0").
	Of string
}

// BudgetResult says what the pod budget did at a step.
type BudgetResult struct {
	// Pods are the target's pods at the decided replicas.
	Pods, Limit int64
	// Limited: a role's recommendation was lowered to fit.
	Limited bool
	// Infeasible: even at their minReplicas the roles (with the ones the
	// policy does not scale) need more pods than the limit; the roles are
	// at their mins.
	Infeasible bool
	Reason     string
}

// applyBudget lowers the decisions so the target's pods fit b: first the
// growth of the roles that rise (each keeps the same share of its
// growth, so a ratio band is kept as far as integers allow), then, if the
// roles are already over the limit where they are, their replicas toward
// their mins, past the scale-down rate limit and cool-down (a target over
// its budget is frozen: nothing it runs changes until it is under). A role
// never goes below its min: when the mins do not fit, the result is
// Infeasible.
func (a *Autoscaler) applyBudget(obs map[string]Observation, b *PodBudget, res *Result) {
	if b == nil {
		return
	}
	var names []string
	for n := range res.Roles {
		if b.PerReplica[n] > 0 {
			names = append(names, n)
		}
	}
	slices.Sort(names)
	fixed := int64(0) // the pods of the roles without a decision
	for n, w := range b.PerReplica {
		if _, decided := res.Roles[n]; !decided {
			fixed = addPods(fixed, podsOf(obs[n].Current, w))
		}
	}
	limit := subPods(b.Limit, fixed)
	w := make([]int64, len(names))
	desired, lo, mins := make([]int32, len(names)), make([]int32, len(names)), make([]int32, len(names))
	for i, n := range names {
		d := res.Roles[n]
		w[i], desired[i] = b.PerReplica[n], d.Desired
		mins[i] = min(a.p.Roles[n].Min, d.Desired)
		lo[i] = max(min(d.Current, d.Desired), mins[i])
	}
	br := &BudgetResult{Limit: b.Limit}
	res.Budget = br
	got := desired
	switch {
	case pods(desired, w) <= limit:
	case pods(lo, w) <= limit:
		got = fit(lo, desired, w, limit)
	case pods(mins, w) <= limit:
		got = fit(mins, lo, w, limit)
	default:
		got, br.Infeasible = mins, true
	}
	br.Pods = addPods(pods(got, w), fixed)
	switch {
	case br.Infeasible:
		br.Reason = fmt.Sprintf("pod budget: %s holds at most %d pods, fewer than the roles need at their minReplicas", b.Of, b.Limit)
	case slices.Equal(got, desired):
		br.Reason = fmt.Sprintf("pod budget: %d of %s's %d pods", br.Pods, b.Of, b.Limit)
		return
	default:
		br.Reason = fmt.Sprintf("pod budget: %s holds at most %d pods", b.Of, b.Limit)
	}
	for i, n := range names {
		if got[i] != desired[i] {
			d := res.Roles[n]
			d.Desired, d.Reason = got[i], d.Reason+"; "+br.Reason
			res.Roles[n] = d
			br.Limited = true
		}
	}
}

// fit picks v in [lo, hi] (element-wise) with Σ v × w ≤ limit, given that
// lo fits: each role keeps the same share of its range hi-lo, rounded down,
// and any rounding excess is taken off in name order.
func fit(lo, hi []int32, w []int64, limit int64) []int32 {
	free, span := float64(limit-pods(lo, w)), float64(0)
	for i := range lo {
		span += float64(hi[i]-lo[i]) * float64(w[i])
	}
	share := 0.0
	if span > 0 {
		share = min(free/span, 1)
	}
	v := make([]int32, len(lo))
	for i := range lo {
		v[i] = min(max(addInt32(lo[i], toInt32(math.Floor(float64(hi[i]-lo[i])*share), 0)), lo[i]), hi[i])
	}
	for i := range v {
		over := pods(v, w) - limit
		if over <= 0 {
			return v
		}
		take := over / w[i]
		if over%w[i] != 0 {
			take++
		}
		v[i] -= int32(min(int64(v[i]-lo[i]), take))
	}
	if pods(v, w) > limit { // only with counts beyond int64 (saturated sums)
		return lo
	}
	return v
}

// pods is Σ n × w, saturated at math.MaxInt64.
func pods(n []int32, w []int64) int64 {
	s := int64(0)
	for i := range n {
		s = addPods(s, podsOf(n[i], w[i]))
	}
	return s
}

// podsOf is n × w (0 for n ≤ 0), saturated at math.MaxInt64.
func podsOf(n int32, w int64) int64 {
	if n <= 0 || w <= 0 {
		return 0
	}
	if w > math.MaxInt64/int64(n) {
		return math.MaxInt64
	}
	return int64(n) * w
}

// addPods is a + b for non-negative b, saturated at math.MaxInt64.
func addPods(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// subPods is a - b for non-negative b, saturated at math.MinInt64.
func subPods(a, b int64) int64 {
	if a < math.MinInt64+b {
		return math.MinInt64
	}
	return a - b
}
