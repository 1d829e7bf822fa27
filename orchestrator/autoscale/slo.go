package autoscale

import "math"

// SLO is the SLO mode's configuration.
type SLO struct {
	TTFTSeconds, TPOTSeconds float64
	// PrefillTokensPerSecond one prefill replica sustains within the TTFT
	// target, and DecodeStreamsPerReplica one decode replica runs within
	// the TPOT target (both profiled, e.g. with `kvmesh bench`). With
	// PrefillTokensPerSecond 0, prefill is sized from the observation's
	// measured throughput (SLOObservation.PrefillTokensPerReplica: the
	// mesh's learned prefill rate) × PrefillUtilization.
	PrefillTokensPerSecond  float64
	DecodeStreamsPerReplica float64
	// PrefillUtilization is the share of the measured prefill throughput
	// one replica is planned for (0: 0.8). Unused with a profiled
	// PrefillTokensPerSecond.
	PrefillUtilization float64
	// MinCorrection is the lowest correction factor (0: 0.5). 1 makes
	// corrections raise only: a measured latency below the expectation
	// never sizes a role below its profiled demand, which keeps a biased
	// expectation from trading attainment for replicas.
	MinCorrection float64
	// TTFTAim is the share of TTFTSeconds the prefill correction steers the
	// measured p90 toward when the observation carries no expectation
	// (0: 1, the target itself). Below 1 it keeps headroom for the tail:
	// the SLO counts requests within the target, the correction sees the
	// p90. With MinCorrection 1 a p90 below the aim never sizes prefill
	// below its profiled demand, and one above it adds replicas in
	// proportion.
	TTFTAim float64
	// TPOTAim is the same for the decode correction: the share of
	// TPOTSeconds it steers the measured TPOT p90 toward when the
	// observation carries no expectation (0: 1, the target itself). With
	// MinCorrection 1, a p90 above the aim adds decode replicas before the
	// target itself is missed.
	TPOTAim float64
	// Adapt are the stateful refinements Autoscaler.Step applies before
	// SizeSLO (trend lead, learned TTFT baseline); SizeSLO ignores them.
	Adapt SLOAdapt
	// AggregateBelow (0: off) lets the decode role serve whole requests at
	// low load: when the prefill role's fractional demand (prompt tokens/s
	// ÷ per-replica throughput × correction, before the ceil) plus the
	// decode role's (streams ÷ streams per replica × correction) is at most
	// AggregateBelow replicas' worth, prefill is sized 0 and decode
	// max(its size, 1) (SLOResult.Aggregated): the P/D router prices the
	// aggregated option on decode engines and takes it when the prefill
	// role has none. The prefill role's min must be 0 for it to act; the
	// ratio band is not applied while prefill is sized 0 by this rule.
	AggregateBelow float64
}

// SLOObservation is the mesh's view of the last interval.
type SLOObservation struct {
	// PromptTokensPerSecond arriving (uncached prefill work).
	PromptTokensPerSecond float64
	// RunningStreams on decode engines.
	RunningStreams float64
	// MeasuredTTFT and MeasuredTPOT are the interval's p90 (0: unknown).
	MeasuredTTFT, MeasuredTPOT float64
	// ExpectedTTFT and ExpectedTPOT are what the profile predicts at the
	// interval's load (0: TTFTAim or TPOTAim × the target, or the target).
	ExpectedTTFT, ExpectedTPOT float64
	// PrefillTokensPerReplica is the prefill throughput one replica of the
	// prefill role was measured to have (0: unknown, and the SLO does not
	// size prefill: its metric targets do): the routers' learned prefill
	// rate, one fit on the role's engines' samples.
	PrefillTokensPerReplica float64
}

// DefaultPrefillUtilization is SLO.PrefillUtilization's default.
const DefaultPrefillUtilization = 0.8

// prefillRate is the throughput one prefill replica is planned for: the
// profiled one, else the measured one × the utilization (0: neither).
func (s SLO) prefillRate(o SLOObservation) float64 {
	if s.PrefillTokensPerSecond > 0 {
		return s.PrefillTokensPerSecond
	}
	u := s.PrefillUtilization
	if u <= 0 {
		u = DefaultPrefillUtilization
	}
	return u * o.PrefillTokensPerReplica
}

// SLOResult sizes both roles.
type SLOResult struct {
	Prefill, Decode int32
	// PrefillSized and DecodeSized: the role had what sizing it needs (a
	// prefill throughput, profiled or measured; streams per decode
	// replica). A role the SLO cannot size is left to its metric targets.
	PrefillSized, DecodeSized bool
	// PrefillCorrection and DecodeCorrection are measured/expected, clamped.
	PrefillCorrection, DecodeCorrection float64
	// AtRisk: a measured latency is above its target.
	AtRisk bool
	// Aggregated: the load fits SLO.AggregateBelow, so prefill is sized 0
	// and the decode role serves whole requests.
	Aggregated bool
}

// Correction factors are clamped to [minCorrection, maxCorrection] so one
// noisy interval cannot scale a role by more than 3× or less than half
// (SLO.MinCorrection may raise the floor).
const (
	minCorrection = 0.5
	maxCorrection = 3
)

// expectedTTFT is what the prefill correction divides the measured p90 by.
func (s SLO) expectedTTFT(o SLOObservation) float64 {
	return expected(o.ExpectedTTFT, s.TTFTAim, s.TTFTSeconds)
}

// expectedTPOT is what the decode correction divides the measured p90 by.
func (s SLO) expectedTPOT(o SLOObservation) float64 {
	return expected(o.ExpectedTPOT, s.TPOTAim, s.TPOTSeconds)
}

// expected is a correction's divisor: the observation's own expectation
// (a profile's), else the aim's share of the target, else the target.
func expected(observed, aim, target float64) float64 {
	if observed > 0 {
		return observed
	}
	if aim > 0 {
		return aim * target
	}
	return target
}

func correction(measured, expected, target, floor float64) float64 {
	if expected <= 0 {
		expected = target
	}
	if !(floor > 0) {
		floor = minCorrection
	}
	floor = min(floor, maxCorrection)
	q := measured / expected
	if !(measured > 0) || !(expected > 0) || math.IsNaN(q) { // unknown (NaN, or ∞/∞): no correction
		return max(1, floor)
	}
	return min(max(q, floor), maxCorrection)
}

// SizeSLO sizes prefill as ceil(prompt tokens/s ÷ per-replica throughput ×
// TTFT correction) and decode as ceil(running streams ÷ streams per replica
// × TPOT correction). A role with no load gets zero (bounds apply later).
// With SLO.AggregateBelow, a load whose fractional demands sum to at most
// it sizes prefill 0 and decode at least 1 (SLOResult.Aggregated).
func SizeSLO(s SLO, o SLOObservation) SLOResult {
	res := SLOResult{
		PrefillCorrection: correction(o.MeasuredTTFT, s.expectedTTFT(o), s.TTFTSeconds, s.MinCorrection),
		DecodeCorrection:  correction(o.MeasuredTPOT, s.expectedTPOT(o), s.TPOTSeconds, s.MinCorrection),
	}
	res.size(s, o)
	res.AtRisk = (s.TTFTSeconds > 0 && o.MeasuredTTFT > s.TTFTSeconds) || (s.TPOTSeconds > 0 && o.MeasuredTPOT > s.TPOTSeconds)
	return res
}

// size sets Prefill and Decode from the load and the result's corrections.
// A load too large for the replica count saturates (math.MaxInt32: the
// role's max applies later); a size that is no number (an infinite load
// over an infinite throughput) leaves the role unsized, to its metrics.
func (res *SLOResult) size(s SLO, o SLOObservation) {
	res.Prefill, res.Decode, res.Aggregated = 0, 0, false
	rate := s.prefillRate(o)
	res.PrefillSized, res.DecodeSized = rate > 0, s.DecodeStreamsPerReplica > 0
	var vp, vd float64 // the fractional demands, before the ceil
	if rate > 0 && o.PromptTokensPerSecond > 0 {
		vp = o.PromptTokensPerSecond / rate * res.PrefillCorrection
		res.Prefill, res.PrefillSized = ceilInt32(vp, 0), !math.IsNaN(vp)
	}
	if s.DecodeStreamsPerReplica > 0 && o.RunningStreams > 0 {
		vd = o.RunningStreams / s.DecodeStreamsPerReplica * res.DecodeCorrection
		res.Decode, res.DecodeSized = ceilInt32(vd, 0), !math.IsNaN(vd)
	}
	// Both roles must be sized (a NaN demand is not, an infinite one is
	// above any threshold); a NaN threshold compares false: off.
	if s.AggregateBelow > 0 && res.PrefillSized && res.DecodeSized && vp+vd <= s.AggregateBelow {
		res.Prefill, res.Decode, res.Aggregated = 0, max(res.Decode, 1), true
	}
}
