package autoscale

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// Policy is an AutoscalingPolicy resolved with its defaults.
type Policy struct {
	Tolerance      float64       // 0.1
	StableWindow   time.Duration // 180 s
	PanicWindow    time.Duration // 60 s
	PanicThreshold float64       // 2.0: panic when panic demand ≥ 2 × current
	MaxUpRate      float64       // 2: at most ceil(current × 2) (and at least +1 from 0)
	MaxDownRate    float64       // 2: at least floor(current / 2)
	DownCooldown   time.Duration // 300 s after the last scale-up
	Roles          map[string]RolePolicy
	Ratio          *Ratio
	SLO            *SLO
	// SLOPrefill and SLODecode name the roles the SLO mode sizes.
	SLOPrefill, SLODecode string
}

// RolePolicy bounds one role and lists its metric targets.
type RolePolicy struct {
	Bounds
	Targets []Target
}

// DefaultPolicy has AIBrix's and Kthena's defaults and no roles.
func DefaultPolicy() Policy {
	return Policy{
		Tolerance: 0.1, StableWindow: 180 * time.Second, PanicWindow: 60 * time.Second, PanicThreshold: 2,
		MaxUpRate: 2, MaxDownRate: 2, DownCooldown: 300 * time.Second, Roles: map[string]RolePolicy{},
	}
}

// Validate lists every problem.
func (p *Policy) Validate() error {
	var errs []error
	// Written so that NaN, which compares false with everything, fails.
	if !(p.Tolerance >= 0) || p.PanicWindow <= 0 || p.StableWindow < p.PanicWindow {
		errs = append(errs, errors.New("need tolerance ≥ 0 and stableWindow ≥ panicWindow > 0"))
	}
	if !(p.PanicThreshold > 1) || !(p.MaxUpRate >= 1) || !(p.MaxDownRate >= 1) {
		errs = append(errs, errors.New("need panicThreshold > 1 and rates ≥ 1"))
	}
	for n, r := range p.Roles {
		if r.Min < 0 || r.Max < r.Min {
			errs = append(errs, fmt.Errorf("role %s: bounds [%d, %d]", n, r.Min, r.Max))
		}
	}
	if p.Ratio != nil {
		_, okN := p.Roles[p.Ratio.Numerator]
		_, okD := p.Roles[p.Ratio.Denominator]
		if !okN || !okD || !(p.Ratio.Min > 0) || !(p.Ratio.Max >= p.Ratio.Min) {
			errs = append(errs, errors.New("ratio: both roles must be scaled and 0 < min ≤ max"))
		}
	}
	if p.SLO != nil {
		// As for the ratio: an SLO role the policy does not scale would make
		// the SLO mode silently size nothing.
		_, okP := p.Roles[p.SLOPrefill]
		_, okD := p.Roles[p.SLODecode]
		if !okP || !okD {
			errs = append(errs, fmt.Errorf("slo: prefillRole %q and decodeRole %q must both be roles the policy scales", p.SLOPrefill, p.SLODecode))
		}
		if a := p.SLO.AggregateBelow; !(a >= 0) || math.IsInf(a, 0) {
			errs = append(errs, fmt.Errorf("slo: aggregateBelow %v: need a finite number ≥ 0", a))
		}
	}
	return errors.Join(errs...)
}

// Observation is one role's state at a step.
type Observation struct {
	Current int32
	// Metrics by name: totals over the role's replicas for counts, averages
	// or percentiles otherwise (see Demand).
	Metrics map[string]float64
}

// Decision is one role's outcome.
type Decision struct {
	Current, Desired int32
	Reason           string
}

// Result is a step's outcome.
type Result struct {
	Roles       map[string]Decision
	Ratio       *RatioResult
	SLO         *SLOResult
	Panic       map[string]bool
	ScaledUpAny bool
	// Budget is what the pod budget did (StepWithin; nil without one).
	Budget *BudgetResult
}

type sample struct {
	at     time.Time
	demand float64
}

type roleState struct {
	samples     []sample
	panicUntil  time.Time
	lastUp      time.Time
	lastDesired int32
}

// Autoscaler keeps the windows between steps. Not safe for concurrent use:
// one per policy, stepped by its owner.
type Autoscaler struct {
	p     Policy
	roles map[string]*roleState
	slo   sloState
}

// New returns an autoscaler for a valid policy.
func New(p Policy) (*Autoscaler, error) {
	if err := p.Validate(); err != nil {
		return nil, err
	}
	a := &Autoscaler{p: p, roles: map[string]*roleState{}}
	for n := range p.Roles {
		a.roles[n] = &roleState{}
	}
	return a, nil
}

// Step records the observations at now and returns each role's desired
// replicas. SLO, when given and configured, replaces the metric demand of
// the prefill and decode roles; the policy's SLO.Adapt refines it (trend
// lead and learned TTFT baseline before sizing, correction memory after).
func (a *Autoscaler) Step(now time.Time, obs map[string]Observation, slo *SLOObservation) Result {
	return a.StepWithin(now, obs, slo, nil)
}

// StepWithin is Step whose decisions also keep the target's pods within
// budget (nil: no budget), after the bounds and the ratio band: a role
// lowered to fit says so in its reason ("pod budget: ..."), and
// Result.Budget reports it.
func (a *Autoscaler) StepWithin(now time.Time, obs map[string]Observation, slo *SLOObservation, budget *PodBudget) Result {
	res := Result{Roles: map[string]Decision{}, Panic: map[string]bool{}}
	var sized *SLOResult
	if slo != nil && a.p.SLO != nil {
		o := a.adapt(now, *slo)
		r := a.remember(now, o, SizeSLO(*a.p.SLO, o))
		sized, res.SLO = &r, &r
	}
	for name, rp := range a.p.Roles {
		o, ok := obs[name]
		if !ok {
			continue
		}
		demand, seen := a.demand(name, rp, o, sized)
		if !seen {
			res.Roles[name] = hold(rp, o.Current)
			continue
		}
		d := a.stepRole(now, name, rp, o.Current, demand, &res)
		if sized != nil && sized.Aggregated && name == a.p.SLOPrefill && d.Desired == 0 {
			// Only when it is at zero: a min above 0, a cool-down or the
			// stable window may hold it up while the sizing says 0.
			d.Reason += "; " + aggregatedReason
		}
		res.Roles[name] = d
	}
	a.applyRatio(now, &res)
	a.applyBudget(obs, budget, &res)
	for name, d := range res.Roles {
		st := a.roles[name]
		if d.Desired > d.Current {
			st.lastUp = now
			res.ScaledUpAny = true
		}
		st.lastDesired = d.Desired
	}
	return res
}

// demand is the role's demand at this step; seen is false when neither the
// SLO mode nor any of its metrics observed it.
func (a *Autoscaler) demand(name string, rp RolePolicy, o Observation, sized *SLOResult) (d float64, seen bool) {
	if sized != nil && name == a.p.SLOPrefill && sized.PrefillSized {
		return float64(sized.Prefill), true
	}
	if sized != nil && name == a.p.SLODecode && sized.DecodeSized {
		return float64(sized.Decode), true
	}
	for _, t := range rp.Targets {
		if v, ok := o.Metrics[t.Name]; ok {
			d = math.Max(d, Demand(t.Name, v, t.Target, o.Current))
			seen = true
		}
	}
	return d, seen
}

// hold is the decision for a role nothing observed: it keeps its replicas
// (within its bounds), and the step adds no sample to its windows. A sample
// of "current" would hold a role only while nobody scales it: after a scale
// by hand the old size would read as demand (panic, from 4 down to 1, would
// take it back up).
func hold(rp RolePolicy, current int32) Decision {
	d := Decision{Current: current, Desired: current, Reason: "no metric observed: holding"}
	if c := clamp(current, rp.Bounds); c != current {
		d.Desired, d.Reason = c, d.Reason+"; bounds"
	}
	return d
}

// stepRole applies windows, tolerance, panic, rate limits, cool-down and bounds.
func (a *Autoscaler) stepRole(now time.Time, name string, rp RolePolicy, current int32, demand float64, res *Result) Decision {
	st := a.roles[name]
	st.samples = append(st.samples, sample{now, demand})
	cut := now.Add(-a.p.StableWindow)
	for len(st.samples) > 0 && !st.samples[0].at.After(cut) {
		st.samples = st.samples[1:]
	}
	stable, panicD := average(st.samples, now.Add(-a.p.StableWindow)), average(st.samples, now.Add(-a.p.PanicWindow))
	d := Decision{Current: current}
	want, reason := ceilInt32(stable, current), "stable window"
	if current > 0 && math.Abs(stable/float64(current)-1) <= a.p.Tolerance {
		want, reason = current, "within tolerance"
	}
	if (current == 0 && panicD > 0 && panicD >= a.p.PanicThreshold) || (current > 0 && panicD >= a.p.PanicThreshold*float64(current)) {
		st.panicUntil = now.Add(a.p.StableWindow)
	}
	if now.Before(st.panicUntil) {
		res.Panic[name] = true
		want, reason = max(current, ceilInt32(panicD, current), st.lastDesired), "panic: never scale down"
	}
	if up := upLimit(current, a.p.MaxUpRate); want > up {
		want, reason = up, reason+"; scale-up rate limit"
	}
	if down := toInt32(math.Floor(float64(current)/a.p.MaxDownRate), current); want < down {
		want, reason = down, reason+"; scale-down rate limit"
	}
	if want < current && !st.lastUp.IsZero() && now.Sub(st.lastUp) < a.p.DownCooldown {
		want, reason = current, "scale-down cool-down"
	}
	if c := clamp(want, rp.Bounds); c != want {
		want, reason = c, reason+"; bounds"
	}
	d.Desired, d.Reason = want, reason
	return d
}

// aggregatedReason is said of a prefill role SLO.AggregateBelow sized 0.
const aggregatedReason = "aggregated on decode: prefill sized 0"

func (a *Autoscaler) applyRatio(now time.Time, res *Result) {
	r := a.p.Ratio
	if r == nil {
		return
	}
	n, okN := res.Roles[r.Numerator]
	d, okD := res.Roles[r.Denominator]
	if !okN || !okD {
		return
	}
	// A prefill role the SLO sized 0 to aggregate on decode is where it
	// should be: the band would seed it back to one.
	if res.SLO != nil && res.SLO.Aggregated {
		if p, ok := res.Roles[a.p.SLOPrefill]; ok && p.Desired == 0 && (r.Numerator == a.p.SLOPrefill || r.Denominator == a.p.SLOPrefill) {
			res.Ratio = &RatioResult{Num: n.Desired, Den: d.Desired, Suspended: true, Reason: "not applied: " + aggregatedReason}
			return
		}
	}
	rr := RepairRatio(n.Desired, d.Desired, a.p.Roles[r.Numerator].Bounds, a.p.Roles[r.Denominator].Bounds, *r)
	res.Ratio = &rr
	if rr.Num != n.Desired {
		n.Desired, n.Reason = rr.Num, "ratio: "+rr.Reason
	}
	if rr.Den != d.Desired {
		d.Desired, d.Reason = rr.Den, "ratio: "+rr.Reason
	}
	res.Roles[r.Numerator], res.Roles[r.Denominator] = n, d
}

func average(s []sample, since time.Time) float64 {
	sum, n := 0.0, 0
	for _, x := range s {
		if x.at.After(since) {
			sum += x.demand
			n++
		}
	}
	if n == 0 {
		return 0
	}
	return sum / float64(n)
}

// upLimit is the most replicas one step may reach: ceil(current × rate),
// saturated (a rate of 1e9 is no limit), and at least one more (so a role
// at zero can start; 0 × an infinite rate is that one).
func upLimit(current int32, rate float64) int32 {
	return max(ceilInt32(float64(current)*rate, 0), addInt32(current, 1))
}
