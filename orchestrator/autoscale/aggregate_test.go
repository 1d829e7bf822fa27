package autoscale

import (
	"math"
	"strings"
	"testing"
	"time"
)

// TestSizeSLOAggregateBelow: prefill is sized 0 and decode at least 1 when
// the fractional demands, corrections included, sum to at most
// AggregateBelow; above it, or with either demand unknown, the sizing is
// the usual one.
func TestSizeSLOAggregateBelow(t *testing.T) {
	s := SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, PrefillTokensPerSecond: 10000, DecodeStreamsPerReplica: 40, AggregateBelow: 0.8}
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct {
		name string
		s    func(SLO) SLO
		o    SLOObservation
		p, d int32
		agg  bool
	}{
		{"below: 0.4 + 0.3", nil, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12}, 0, 1, true},
		{"at: 0.4 + 0.4", nil, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 16}, 0, 1, true},
		{"above: 0.4 + 0.5", nil, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 20}, 1, 1, false},
		{"TTFT correction 2: 0.2×2 + 0.3", nil, SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 12, MeasuredTTFT: 1}, 0, 1, true},
		{"TTFT correction 3: 0.2×3 + 0.3", nil, SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 12, MeasuredTTFT: 1.5}, 1, 1, false},
		{"TPOT correction 2.5: 0.3 + 0.25×2.5", nil, SLOObservation{PromptTokensPerSecond: 3000, RunningStreams: 10, MeasuredTPOT: 0.125}, 1, 1, false},
		{"TPOT correction 2: 0.3 + 0.25×2", nil, SLOObservation{PromptTokensPerSecond: 3000, RunningStreams: 10, MeasuredTPOT: 0.1}, 0, 1, true},
		{"corrections below 1 lower the sum: (0.5 + 0.5)×0.5", nil, SLOObservation{PromptTokensPerSecond: 5000, RunningStreams: 20, MeasuredTTFT: 0.1, MeasuredTPOT: 0.01}, 0, 1, true},
		{"zero load: decode 1", nil, SLOObservation{}, 0, 1, true},
		{"decode at 0 demand: 1", nil, SLOObservation{PromptTokensPerSecond: 7000}, 0, 1, true},
		{"prefill at 0 demand", nil, SLOObservation{RunningStreams: 30}, 0, 1, true},
		{"decode alone above", nil, SLOObservation{RunningStreams: 60}, 0, 2, false},
		{"off", func(s SLO) SLO { s.AggregateBelow = 0; return s }, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12}, 1, 1, false},
		{"NaN threshold: off", func(s SLO) SLO { s.AggregateBelow = nan; return s }, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12}, 1, 1, false},
		{"infinite prompt load", nil, SLOObservation{PromptTokensPerSecond: inf, RunningStreams: 12}, math.MaxInt32, 1, false},
		{"infinite streams", nil, SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: inf}, 1, math.MaxInt32, false},
		{"NaN load is no load", nil, SLOObservation{PromptTokensPerSecond: nan, RunningStreams: nan}, 0, 1, true},
		{"prefill unsized (∞/∞): not aggregated", func(s SLO) SLO { s.PrefillTokensPerSecond = inf; return s },
			SLOObservation{PromptTokensPerSecond: inf, RunningStreams: 12}, 0, 1, false},
		{"prefill throughput unknown: not aggregated", func(s SLO) SLO { s.PrefillTokensPerSecond = 0; return s },
			SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12}, 0, 1, false},
	} {
		sc := s
		if c.s != nil {
			sc = c.s(s)
		}
		got := SizeSLO(sc, c.o)
		if got.Prefill != c.p || got.Decode != c.d || got.Aggregated != c.agg {
			t.Errorf("%s: prefill %d decode %d aggregated %v, want %d %d %v", c.name, got.Prefill, got.Decode, got.Aggregated, c.p, c.d, c.agg)
		}
	}
}

// aggregatePolicy has prefill [0, 4], decode [1, 4], a band prefill/decode
// in [0.5, 1] and the SLO of TestSizeSLOAggregateBelow.
func aggregatePolicy(t *testing.T) *Autoscaler {
	t.Helper()
	p := DefaultPolicy()
	p.Roles = map[string]RolePolicy{"prefill": {Bounds: Bounds{0, 4}}, "decode": {Bounds: Bounds{1, 4}}}
	p.Ratio = &Ratio{Numerator: "prefill", Denominator: "decode", Min: 0.5, Max: 1}
	p.SLO = &SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, PrefillTokensPerSecond: 10000, DecodeStreamsPerReplica: 40, AggregateBelow: 0.8}
	p.SLOPrefill, p.SLODecode = "prefill", "decode"
	a, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	return a
}

// TestStepAggregatedSkipsRatio: a prefill role sized 0 by AggregateBelow
// stays at 0 (the band would seed it back to 1) and says why; the band
// still applies when prefill is above zero.
func TestStepAggregatedSkipsRatio(t *testing.T) {
	now := time.Unix(1000, 0)
	obs := map[string]Observation{"prefill": {Current: 1}, "decode": {Current: 1}}

	a := aggregatePolicy(t)
	res := a.Step(now, obs, &SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12})
	p, d := res.Roles["prefill"], res.Roles["decode"]
	if p.Desired != 0 || d.Desired != 1 {
		t.Fatalf("aggregated: prefill %d (%s) decode %d (%s), want 0 and 1", p.Desired, p.Reason, d.Desired, d.Reason)
	}
	if !strings.Contains(p.Reason, "aggregated on decode: prefill sized 0") {
		t.Errorf("prefill reason %q does not say it is aggregated", p.Reason)
	}
	if res.Ratio == nil || !res.Ratio.Suspended || res.Ratio.Adjusted || !strings.Contains(res.Ratio.Reason, "aggregated on decode") {
		t.Errorf("ratio %+v, want suspended for the aggregation", res.Ratio)
	}
	// At zero it stays there while the load fits.
	obs["prefill"] = Observation{Current: 0}
	if res := a.Step(now.Add(15*time.Second), obs, &SLOObservation{}); res.Roles["prefill"].Desired != 0 || res.Roles["decode"].Desired != 1 {
		t.Errorf("zero load: %+v, want prefill 0, decode 1", res.Roles)
	}

	// Without the rule the same step seeds prefill from zero.
	b := aggregatePolicy(t)
	b.p.SLO.AggregateBelow = 0
	res = b.Step(now, map[string]Observation{"prefill": {Current: 0}, "decode": {Current: 1}}, &SLOObservation{RunningStreams: 12})
	if p := res.Roles["prefill"]; p.Desired != 1 || res.Ratio == nil || res.Ratio.Suspended {
		t.Errorf("no rule: prefill %d (%s) ratio %+v, want seeded to 1", p.Desired, p.Reason, res.Ratio)
	}

	// Above the threshold, prefill > 0: the band applies (1/4 < 0.5).
	c := aggregatePolicy(t)
	res = c.Step(now, map[string]Observation{"prefill": {Current: 1}, "decode": {Current: 4}}, &SLOObservation{PromptTokensPerSecond: 5000, RunningStreams: 160})
	if p := res.Roles["prefill"]; p.Desired != 2 || !strings.HasPrefix(p.Reason, "ratio:") || res.Ratio.Suspended {
		t.Errorf("not aggregated: prefill %d (%s) ratio %+v, want raised to 2 by the band", p.Desired, p.Reason, res.Ratio)
	}
	if strings.Contains(res.Roles["prefill"].Reason, "aggregated") {
		t.Errorf("not aggregated, yet the reason says so: %q", res.Roles["prefill"].Reason)
	}

	// Aggregated, but prefill still above zero (its stable window holds
	// the earlier demand): the band applies as usual.
	e := aggregatePolicy(t)
	e.Step(now, map[string]Observation{"prefill": {Current: 2}, "decode": {Current: 2}}, &SLOObservation{PromptTokensPerSecond: 20000, RunningStreams: 80})
	res = e.Step(now.Add(15*time.Second), map[string]Observation{"prefill": {Current: 2}, "decode": {Current: 2}}, &SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12})
	if !res.SLO.Aggregated || res.Roles["prefill"].Desired == 0 || res.Ratio == nil || res.Ratio.Suspended {
		t.Errorf("aggregated with prefill > 0: %+v ratio %+v, want the band applied", res.Roles, res.Ratio)
	}
}

// TestValidateAggregateBelow: a finite number ≥ 0, with a prefill min of 0.
func TestValidateAggregateBelow(t *testing.T) {
	for _, v := range []float64{-0.1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		p := DefaultPolicy()
		p.Roles = map[string]RolePolicy{"prefill": {Bounds: Bounds{0, 4}}, "decode": {Bounds: Bounds{1, 4}}}
		p.SLO = &SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, DecodeStreamsPerReplica: 10, AggregateBelow: v}
		p.SLOPrefill, p.SLODecode = "prefill", "decode"
		if err := p.Validate(); err == nil || !strings.Contains(err.Error(), "aggregateBelow") {
			t.Errorf("aggregateBelow %v: got %v, want refused", v, err)
		}
		p.SLO.AggregateBelow = 0.8
		if err := p.Validate(); err != nil {
			t.Errorf("aggregateBelow 0.8 with prefill min 0: %v", err)
		}
	}
}

// A prefill role held above zero while the sizing says 0 (its min of 1, or
// the cool-down after a scale-up) does not say it is aggregated: it is not
// (tester h-reg6 F4).
func TestAggregatedReasonOnlyAtZero(t *testing.T) {
	now := time.Unix(1000, 0)
	obs := map[string]Observation{"prefill": {Current: 1}, "decode": {Current: 1}}
	a := aggregatePolicy(t)
	a.p.Roles["prefill"] = RolePolicy{Bounds: Bounds{1, 4}}
	res := a.Step(now, obs, &SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 12})
	if p := res.Roles["prefill"]; !res.SLO.Aggregated || p.Desired != 1 || strings.Contains(p.Reason, "aggregated") {
		t.Errorf("prefill min 1: aggregated %v, %+v; want desired 1 and no aggregation in the reason", res.SLO.Aggregated, p)
	}
}
