package autoscale

import (
	"math"
)

// Metric names (AutoscalingPolicy metrics[].name).
const (
	WaitingRequests    = "waitingRequests"
	RunningRequests    = "runningRequests"
	PrefillQueueTokens = "prefillQueueTokens"
	KVUsage            = "kvUsage"
	TTFTP90            = "ttftP90Seconds"
	TPOTP90            = "tpotP90Seconds"
)

// isTotal reports metrics observed as a sum over the role's replicas whose
// target is per replica; the others are averages or percentiles compared
// with the target directly.
func isTotal(name string) bool {
	switch name {
	case WaitingRequests, RunningRequests, PrefillQueueTokens:
		return true
	}
	return false
}

// Target is one metric's per-replica target.
type Target struct {
	Name   string
	Target float64
}

// Demand is the replicas one metric asks for, unrounded: total/target for
// totals, current × value/target for averages and percentiles. A role at
// zero replicas has no averages; it asks for one replica when any total is
// positive. It is never NaN nor negative: a value or target that is NaN or
// negative (or an infinite value over an infinite target) asks for current.
// An infinite value, or one too large for the replica count, asks for +Inf
// (every conversion to replicas saturates: the role goes to its max).
func Demand(name string, value, target float64, current int32) float64 {
	if !(target > 0) || !(value >= 0) {
		return float64(current)
	}
	var d float64
	switch {
	case isTotal(name):
		d = value / target
	case current == 0:
		return 0
	default:
		d = float64(current) * value / target
	}
	if math.IsNaN(d) {
		return float64(current)
	}
	return d
}

// Recommend is HPA's recommendation: for each metric with an observation,
// the demand; within tolerance of current the metric asks for current;
// otherwise ceil(demand). The result is the maximum over metrics (current
// when no metric was observed).
func Recommend(current int32, targets []Target, observed map[string]float64, tolerance float64) int32 {
	best, seen := int32(0), false
	for _, t := range targets {
		v, ok := observed[t.Name]
		if !ok {
			continue
		}
		d := Demand(t.Name, v, t.Target, current)
		r := current
		if current == 0 || math.Abs(d/float64(current)-1) > tolerance {
			r = ceilInt32(d, current) // Demand is never NaN
		}
		if !seen || r > best {
			best, seen = r, true
		}
	}
	if !seen {
		return current
	}
	return best
}
