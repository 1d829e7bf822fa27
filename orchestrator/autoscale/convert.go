package autoscale

import "math"

// Replica counts are int32 (a /scale's spec.replicas); demands, rates and
// ratios are float64. Go's conversion of a float64 outside int32's range
// is implementation-defined (math.MinInt32 on amd64), so a demand of 1e300
// would read as a scale to below zero and a rate of 1e9 as no growth: every
// conversion goes through toInt32, which saturates.

// toInt32 is v truncated toward zero, saturated to int32's range: +Inf and
// anything at or above math.MaxInt32 give math.MaxInt32, -Inf and anything
// at or below math.MinInt32 give math.MinInt32. NaN has no order, so the
// caller says what it means there (nan).
func toInt32(v float64, nan int32) int32 {
	switch {
	case math.IsNaN(v):
		return nan
	case v >= math.MaxInt32:
		return math.MaxInt32
	case v <= math.MinInt32:
		return math.MinInt32
	}
	return int32(v)
}

// ceilInt32 is the smallest replica count covering v (a rounding error of
// 1e-9 forgiven: 3.0000000001 replicas are 3), saturated as toInt32.
func ceilInt32(v float64, nan int32) int32 { return toInt32(math.Ceil(v-1e-9), nan) }

// floorInt32 is the largest replica count within v (a rounding error of
// 1e-9 forgiven: 2.9999999999 replicas are 3), saturated as toInt32.
func floorInt32(v float64, nan int32) int32 { return toInt32(math.Floor(v+1e-9), nan) }

// addInt32 is a+b saturated to int32's range.
func addInt32(a, b int32) int32 {
	return int32(min(max(int64(a)+int64(b), math.MinInt32), math.MaxInt32))
}
