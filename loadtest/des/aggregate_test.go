package des

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// TestSLOScalerAggregateBelow: the policy's aggregateBelow reaches the SLO
// mode: a load within it sizes prefill 0 (its min 0, the ratio band not
// seeding it back) and decode 1; without it the same load keeps a prefill
// replica.
func TestSLOScalerAggregateBelow(t *testing.T) {
	prof := EngineProfile{PrefillTokensPerSecond: 10000, Streams: []int{1, 64, 128}, TPOT: []float64{0.02, 0.04, 0.08}}
	for _, c := range []struct {
		agg  float64
		p, d int
	}{{0.8, 0, 1}, {0, 1, 1}} {
		p := autoscale.DefaultPolicy()
		p.Roles = map[string]autoscale.RolePolicy{"prefill": {Bounds: autoscale.Bounds{Min: 0, Max: 20}}, "decode": {Bounds: autoscale.Bounds{Min: 1, Max: 20}}}
		p.Ratio = &autoscale.Ratio{Numerator: "prefill", Denominator: "decode", Min: 0.25, Max: 2}
		s, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: 0.5, DecodeUtilization: 0.5, SLOTTFT: 2, SLOTP: 0.05, AggregateBelow: c.agg})
		if err != nil {
			t.Fatal(err)
		}
		// 2,000 uncached tok/s ÷ 5,000 = 0.4 prefill; 10 streams ÷ 40 = 0.25 decode.
		sig := Signals{Prefill: RoleSignals{Replicas: 1, Ready: 1, Loads: make([]EngineLoad, 1)},
			Decode:                RoleSignals{Replicas: 1, Ready: 1, Loads: []EngineLoad{{Running: 10}}},
			PromptTokensPerSecond: 4000, CachedFraction: 0.5}
		if pr, de := s.Decide(0, &sig); pr != c.p || de != c.d {
			t.Errorf("aggregateBelow %v: P/D %d/%d, want %d/%d", c.agg, pr, de, c.p, c.d)
		}
		if got := strings.Contains(s.Setting(), "aggregated on decode"); got != (c.agg > 0) {
			t.Errorf("aggregateBelow %v: setting %q", c.agg, s.Setting())
		}
	}
}

// TestSLOScalerTPOTExpectation: with TPOTExpectation f the decode
// correction divides the measured TPOT p90 by f × the target (the
// controller's division at f = 1), not by the profile's TPOT at the streams
// per ready engine.
func TestSLOScalerTPOTExpectation(t *testing.T) {
	prof := EngineProfile{PrefillTokensPerSecond: 10000, Streams: []int{1, 64, 128}, TPOT: []float64{0.02, 0.04, 0.08}}
	for _, c := range []struct {
		name   string
		f      float64
		tpot   float64
		decode int
	}{
		// 80 streams ÷ 40 = 2 replicas before the correction; the profile
		// expects 30 ms at 40 streams per ready engine (20 + 20 × 39/63 ms).
		{"profile: 45 ms ÷ 32.4 ms", 0, 0.045, 3},
		{"target: 45 ms ÷ 50 ms, raise-only", 1, 0.045, 2},
		{"0.8 × target: 45 ÷ 40 ms", 0.8, 0.045, 3},
		{"target: 75 ms ÷ 50 ms", 1, 0.075, 3},
	} {
		p := autoscale.DefaultPolicy()
		p.Roles = map[string]autoscale.RolePolicy{"prefill": {Bounds: autoscale.Bounds{Min: 1, Max: 20}}, "decode": {Bounds: autoscale.Bounds{Min: 1, Max: 20}}}
		s, err := NewSLOScaler(SLOScalerConfig{Policy: p, Profile: prof, Utilization: 0.5, DecodeUtilization: 0.5, SLOTTFT: 2, SLOTP: 0.05,
			TPOTExpectation: c.f, RaiseOnly: true})
		if err != nil {
			t.Fatal(err)
		}
		sig := Signals{Prefill: RoleSignals{Replicas: 1, Ready: 1, Loads: make([]EngineLoad, 1)},
			Decode:                RoleSignals{Replicas: 2, Ready: 2, Loads: []EngineLoad{{Running: 40}, {Running: 40}}},
			PromptTokensPerSecond: 1000, TPOTP90: c.tpot}
		if _, de := s.Decide(0, &sig); de != c.decode {
			t.Errorf("%s: decode %d, want %d", c.name, de, c.decode)
		}
		if got := strings.Contains(s.Setting(), "TPOT expected"); got != (c.f > 0) {
			t.Errorf("%s: setting %q", c.name, s.Setting())
		}
	}
}

// TestPrefillAtZeroServedOnDecode: with the prefill role scaled to zero,
// the P/D router serves every later request whole on a decode engine, and
// every request completes.
func TestPrefillAtZeroServedOnDecode(t *testing.T) {
	reqs := smallTrace(t, 3)
	const at = 30 * time.Second
	s, _ := runScripted(t, smallScaleConfig(1, 1), reqs, &scripted{steps: []scriptStep{{at: at, p: 0, d: 1}}})
	after := 0
	for i, f := range s.flights {
		if f.sent <= at {
			continue
		}
		after++
		if f.prefill >= 0 {
			t.Fatalf("request %d sent at %v with prefill on %s, after the prefill role went to zero", i, f.sent, s.view[f.prefill].ID)
		}
	}
	if after == 0 {
		t.Fatal("no request after the prefill role went to zero")
	}
}

// TestKthenaRatioFinite: a ratio band with a NaN or infinite bound is
// refused (NaN compared false with every check).
func TestKthenaRatioFinite(t *testing.T) {
	nan, inf := math.NaN(), math.Inf(1)
	role := KthenaRole{Min: 1, Max: 4, Targets: map[string]float64{KthenaRunning: 10}}
	for _, r := range []KthenaRatio{{Min: 1, Max: nan}, {Min: nan, Max: 1}, {Min: nan, Max: nan}, {Min: 1, Max: inf}, {Min: inf, Max: inf}} {
		rr := r
		if _, err := NewKthena(KthenaConfig{Behavior: DefaultKthenaBehavior(), Prefill: role, Decode: role, Ratio: &rr}); !errors.Is(err, ErrConfig) {
			t.Errorf("ratio [%v, %v]: %v, want ErrConfig", r.Min, r.Max, err)
		}
	}
	if _, err := NewKthena(KthenaConfig{Behavior: DefaultKthenaBehavior(), Prefill: role, Decode: role, Ratio: &KthenaRatio{Min: 0, Max: 4}}); err != nil {
		t.Errorf("ratio [0, 4]: %v", err)
	}
}
