package autoscale

// Bounds are a role's min and max replicas.
type Bounds struct{ Min, Max int32 }

// Ratio is the band numerator/denominator must stay in.
type Ratio struct {
	Numerator, Denominator string
	Min, Max               float64
}

// RatioResult says what RepairRatio did.
type RatioResult struct {
	Num, Den int32
	// Adjusted is true when either value changed.
	Adjusted bool
	// Infeasible is true when the bounds leave no value in the band; the
	// result is then the closest pair within bounds.
	Infeasible bool
	// Suspended is true when the band was not applied: the SLO mode sized
	// the prefill role 0 to aggregate on decode (SLO.AggregateBelow).
	Suspended bool
	Reason    string
}

// RepairRatio brings num/den into [r.Min, r.Max] within the bounds. It
// raises the lagging role first and lowers the other only when the lagging
// one is at its max; a role at zero beside a non-zero one is seeded to one
// (or its min). Both at zero stay at zero (scaled to zero together). The
// result is a fixed point: repairing it again changes nothing, so the band
// alone never makes replicas oscillate. It is always within the bounds, for
// any band (a huge one saturates: the lagging role goes to its max).
func RepairRatio(num, den int32, nb, db Bounds, r Ratio) RatioResult {
	res := RatioResult{Num: clamp(num, nb), Den: clamp(den, db)}
	if res.Num == 0 && res.Den == 0 {
		return res.done(num, den, "both roles at zero")
	}
	if res.Num == 0 {
		res.Num = clamp(1, nb)
		res.Reason = "numerator seeded from zero"
	}
	if res.Den == 0 {
		res.Den = clamp(1, db)
		res.Reason = "denominator seeded from zero"
	}
	if res.Num == 0 || res.Den == 0 { // a max of zero: nothing to pair with
		res.Infeasible = true
		return res.done(num, den, "a role's max is zero")
	}
	ratio := float64(res.Num) / float64(res.Den)
	switch {
	case ratio < r.Min-1e-9: // numerator lags
		want := ceilInt32(r.Min*float64(res.Den), nb.Max) // saturated: a huge band asks for the max
		if want <= nb.Max {
			res.Num = clamp(want, nb)
			res.Reason = "numerator raised to the band"
		} else {
			res.Num = nb.Max
			res.Den = clamp(floorInt32(float64(res.Num)/r.Min, db.Min), db)
			res.Reason = "numerator at max: denominator lowered to the band"
		}
	case ratio > r.Max+1e-9: // denominator lags
		want := ceilInt32(float64(res.Num)/r.Max, db.Max)
		if want <= db.Max {
			res.Den = clamp(want, db)
			res.Reason = "denominator raised to the band"
		} else {
			res.Den = db.Max
			res.Num = clamp(floorInt32(r.Max*float64(res.Den), nb.Min), nb)
			res.Reason = "denominator at max: numerator lowered to the band"
		}
	}
	q := float64(res.Num) / float64(res.Den)
	if q < r.Min-1e-9 || q > r.Max+1e-9 {
		res.Infeasible = true
		res.Reason = "bounds leave no value in the band"
	}
	return res.done(num, den, res.Reason)
}

func (res RatioResult) done(num, den int32, reason string) RatioResult {
	res.Adjusted = res.Num != num || res.Den != den
	if reason == "" {
		reason = "within the band"
	}
	res.Reason = reason
	return res
}

func clamp(v int32, b Bounds) int32 {
	return min(max(v, b.Min), b.Max)
}
