package autoscale

import (
	"math"
	"testing"
	"time"
)

// FuzzStep: whatever the observations (NaN, ±Inf, 1e300, negative), the
// rate limits and the pod budget, every step's decision is within the
// role's [min, max] and the budget (or at the mins, said infeasible); and
// on the metric path alone a higher load never asks for fewer replicas, and
// a rate that allows it takes a load above max to max in one step (a
// conversion that wraps, int32(3e10) = MinInt32 on amd64, breaks both).
func FuzzStep(f *testing.F) {
	f.Add(3e10, 0.5, 1e4, 20.0, 2.0, 2.0, int32(5), int32(5), uint16(1), uint16(999), uint16(11), uint16(11), int64(10000), uint8(0))
	f.Add(2e4, 0.5, 1e4, 20.0, 1e9, 2.0, int32(5), int32(1), uint16(1), uint16(999), uint16(11), uint16(11), int64(10000), uint8(0))
	f.Add(1e300, math.Inf(1), 1e300, 1e300, 1e308, 2.0, int32(950), int32(1), uint16(1), uint16(949), uint16(11), uint16(11), int64(10000), uint8(7))
	f.Add(math.NaN(), math.NaN(), math.NaN(), math.NaN(), 2.0, math.Inf(1), int32(0), int32(0), uint16(0), uint16(10), uint16(1), uint16(3), int64(-5), uint8(6))
	f.Add(math.Inf(1), -1.0, math.Inf(1), math.Inf(-1), math.Inf(1), 1.0, int32(-3), int32(math.MaxInt32), uint16(2), uint16(0), uint16(100), uint16(1), int64(math.MaxInt64), uint8(5))
	f.Fuzz(func(t *testing.T, wait, kv, tokens, streams, upRate, downRate float64, curP, curD int32, lo16, span16, wP, wD uint16, limit int64, mode uint8) {
		useRatio, useSLO, useBudget := mode&1 != 0, mode&2 != 0, mode&4 != 0
		b := Bounds{Min: int32(lo16 % 2000), Max: int32(lo16%2000) + int32(span16%2000)}
		p := DefaultPolicy()
		p.StableWindow, p.PanicWindow, p.DownCooldown = 30*time.Second, 10*time.Second, 20*time.Second
		p.MaxUpRate, p.MaxDownRate = upRate, downRate
		p.Roles = map[string]RolePolicy{
			"p": {Bounds: b, Targets: []Target{{WaitingRequests, 10}, {KVUsage, 0.8}}},
			"d": {Bounds: b, Targets: []Target{{WaitingRequests, 10}}},
		}
		if useRatio {
			p.Ratio = &Ratio{Numerator: "p", Denominator: "d", Min: 0.5, Max: 2}
		}
		var slo *SLOObservation
		if useSLO {
			p.SLO = &SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, DecodeStreamsPerReplica: 10,
				Adapt: SLOAdapt{Lead: 30 * time.Second, TrendWindow: 40 * time.Second, BaselineWindow: time.Minute, CorrectionWindow: time.Minute}}
			p.SLOPrefill, p.SLODecode = "p", "d"
			slo = &SLOObservation{PromptTokensPerSecond: tokens, RunningStreams: streams, MeasuredTTFT: kv, MeasuredTPOT: wait, PrefillTokensPerReplica: tokens}
		}
		var budget *PodBudget
		if useBudget {
			budget = &PodBudget{Limit: limit, PerReplica: map[string]int64{"p": int64(wP%100) + 1, "d": int64(wD%100) + 1, "other": 3}, Of: "ModelDeployment f"}
		}
		a, err := New(p)
		if err != nil {
			return // an invalid rate (NaN, < 1): refused, nothing to step
		}
		cur := map[string]int32{"p": curP, "d": curD}
		t0 := time.Unix(1e9, 0)
		for i := range 8 {
			load := wait
			if i >= 5 {
				load = 0 // the load goes: scale-down, rate limits, cool-down
			}
			obs := map[string]Observation{
				"p":     {Current: cur["p"], Metrics: map[string]float64{WaitingRequests: load, KVUsage: kv}},
				"d":     {Current: cur["d"], Metrics: map[string]float64{WaitingRequests: load}},
				"other": {Current: 2},
			}
			if i == 3 {
				obs["d"] = Observation{Current: cur["d"]} // unobserved: held
			}
			res := a.StepWithin(t0.Add(time.Duration(i)*7*time.Second), obs, slo, budget)
			total := int64(6) // "other": 2 replicas × 3
			for r, c := range cur {
				d, ok := res.Roles[r]
				if !ok {
					t.Fatalf("step %d: no decision for %s", i, r)
				}
				if d.Desired < b.Min || d.Desired > b.Max {
					t.Fatalf("step %d: %s %d -> %d (%s), outside [%d, %d]", i, r, c, d.Desired, d.Reason, b.Min, b.Max)
				}
				if budget != nil {
					total += int64(d.Desired) * budget.PerReplica[r]
				}
				cur[r] = d.Desired
			}
			if budget == nil {
				continue
			}
			if res.Budget == nil || res.Budget.Pods != total {
				t.Fatalf("step %d: budget %+v, want %d pods", i, res.Budget, total)
			}
			if res.Budget.Infeasible {
				if cur["p"] != b.Min || cur["d"] != b.Min {
					t.Fatalf("step %d: infeasible budget with %v, want both at their min %d", i, cur, b.Min)
				}
			} else if total > limit {
				t.Fatalf("step %d: %d pods over the budget of %d (%v)", i, total, limit, cur)
			}
		}
		if useRatio || useSLO || useBudget || math.IsNaN(wait) || wait < 0 {
			return
		}
		// The metric path alone, one step of a fresh autoscaler from the
		// same replicas: monotone in the load, and a load above max with a
		// rate that allows it goes to max.
		one := func(w float64) Decision {
			q := p
			q.Roles = map[string]RolePolicy{"d": p.Roles["d"]}
			a, _ := New(q)
			return a.Step(t0, map[string]Observation{"d": {Current: curD, Metrics: map[string]float64{WaitingRequests: w}}}, nil).Roles["d"]
		}
		lower, higher := one(wait/3), one(wait)
		if higher.Desired < lower.Desired {
			t.Fatalf("from %d: %g waiting ask for %d (%s), fewer than %g's %d (%s)", curD, wait, higher.Desired, higher.Reason, wait/3, lower.Desired, lower.Reason)
		}
		if curD >= 1 && curD < b.Max && float64(curD)*upRate >= float64(b.Max) && wait/10 >= float64(b.Max) && wait/10 > 1.1*float64(curD) && higher.Desired != b.Max {
			t.Fatalf("from %d at rate %g: %g waiting ask for %d (%s), want the max %d", curD, upRate, wait, higher.Desired, higher.Reason, b.Max)
		}
	})
}
