package autoscale

import (
	"math"
	"testing"
	"time"
)

func TestToInt32Saturates(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct {
		name string
		got  int32
		want int32
	}{
		{"in range", toInt32(41.9, -1), 41},
		{"negative in range", toInt32(-41.9, -1), -41},
		{"MaxInt32", toInt32(math.MaxInt32, -1), math.MaxInt32},
		{"just above MaxInt32", toInt32(math.MaxInt32+1, -1), math.MaxInt32},
		{"1e300", toInt32(1e300, -1), math.MaxInt32},
		{"+Inf", toInt32(inf, -1), math.MaxInt32},
		{"-1e300", toInt32(-1e300, -1), math.MinInt32},
		{"-Inf", toInt32(-inf, -1), math.MinInt32},
		{"NaN is the caller's", toInt32(nan, -1), -1},
		{"ceil", ceilInt32(2.1, -1), 3},
		{"ceil forgives 1e-9", ceilInt32(3+1e-10, -1), 3},
		{"ceil 3e10", ceilInt32(3e10, -1), math.MaxInt32},
		{"ceil +Inf", ceilInt32(inf, -1), math.MaxInt32},
		{"ceil NaN", ceilInt32(nan, 7), 7},
		{"floor", floorInt32(2.9, -1), 2},
		{"floor forgives 1e-9", floorInt32(3-1e-10, -1), 3},
		{"floor 1e300", floorInt32(1e300, -1), math.MaxInt32},
		{"floor NaN", floorInt32(nan, 7), 7},
		{"add", addInt32(2, 3), 5},
		{"add saturates up", addInt32(math.MaxInt32, 1), math.MaxInt32},
		{"add saturates down", addInt32(math.MinInt32, -1), math.MinInt32},
	} {
		if c.got != c.want {
			t.Errorf("%s: %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestUpLimitSaturates: a rate too large for int32 is no limit (was +1 a
// step: int32(5e9) is MinInt32 on amd64), and from zero one replica starts
// whatever the rate.
func TestUpLimitSaturates(t *testing.T) {
	for _, c := range []struct {
		current int32
		rate    float64
		want    int32
	}{
		{5, 2, 10},
		{5, 1e9, math.MaxInt32},
		{5, math.Inf(1), math.MaxInt32},
		{0, 1e9, 1},
		{0, math.Inf(1), 1}, // 0 × ∞ is NaN: the one from zero
		{math.MaxInt32, 2, math.MaxInt32},
		{math.MaxInt32, 1, math.MaxInt32}, // not MaxInt32+1 (MinInt32)
	} {
		if got := upLimit(c.current, c.rate); got != c.want {
			t.Errorf("upLimit(%d, %g) = %d, want %d", c.current, c.rate, got, c.want)
		}
	}
}

// TestStepHugeDemandGoesToMax: a demand above anything int32 holds (a
// Prometheus value of 1e300, 3e10 waiting requests, +Inf) scales the role to
// its max like any demand above it, never holds it (the report's "5 -> 5
// panic: never scale down"); a maxScaleUpRate of 1e9 reaches it in one step.
func TestStepHugeDemandGoesToMax(t *testing.T) {
	for _, c := range []struct {
		name       string
		rate, wait float64
		want       []int32
	}{
		{"3e10 waiting, rate 2", 2, 3e10, []int32{10, 20, 40, 80}},
		{"1e300 waiting, rate 2", 2, 1e300, []int32{10, 20, 40, 80}},
		{"+Inf waiting, rate 2", 2, math.Inf(1), []int32{10, 20, 40, 80}},
		{"2e4 waiting, rate 1e9", 1e9, 2e4, []int32{1000, 1000}},
		{"2e4 waiting, rate 1e308", 1e308, 2e4, []int32{1000, 1000}},
		{"3e10 waiting, rate 1e9", 1e9, 3e10, []int32{1000, 1000}},
	} {
		p := DefaultPolicy()
		p.MaxUpRate = c.rate
		p.Roles["decode"] = RolePolicy{Bounds: Bounds{Min: 1, Max: 1000}, Targets: []Target{{WaitingRequests, 10}}}
		a, err := New(p)
		if err != nil {
			t.Fatal(err)
		}
		now, cur := time.Unix(1e9, 0), int32(5)
		for i, w := range c.want {
			d := a.Step(now, map[string]Observation{"decode": {Current: cur, Metrics: map[string]float64{WaitingRequests: c.wait}}}, nil).Roles["decode"]
			if d.Desired != w {
				t.Fatalf("%s: step %d: %d -> %d (%s), want %d", c.name, i, cur, d.Desired, d.Reason, w)
			}
			cur, now = d.Desired, now.Add(15*time.Second)
		}
	}
}

// TestDemandAndRecommendNonFinite: Demand is never NaN nor negative; an
// infinite or huge value asks for the most replicas there are.
func TestDemandAndRecommendNonFinite(t *testing.T) {
	inf, nan := math.Inf(1), math.NaN()
	for _, c := range []struct {
		name          string
		metric        string
		value, target float64
		want          float64
	}{
		{"NaN value", WaitingRequests, nan, 10, 4},
		{"NaN target", WaitingRequests, 40, nan, 4},
		{"-Inf value", WaitingRequests, -inf, 10, 4},
		{"+Inf over +Inf", WaitingRequests, inf, inf, 4},
		{"+Inf over +Inf, average", KVUsage, inf, inf, 4},
		{"+Inf value", WaitingRequests, inf, 10, inf},
		{"+Inf average", KVUsage, inf, 0.8, inf},
		{"+Inf target", WaitingRequests, 40, inf, 0},
	} {
		if got := Demand(c.metric, c.value, c.target, 4); got != c.want {
			t.Errorf("Demand %s = %v, want %v", c.name, got, c.want)
		}
	}
	waiting := []Target{{WaitingRequests, 10}}
	for _, c := range []struct {
		name  string
		value float64
		want  int32
	}{
		{"1e300", 1e300, math.MaxInt32},
		{"3e10", 3e10, math.MaxInt32},
		{"+Inf", inf, math.MaxInt32},
		{"NaN keeps current", nan, 5},
	} {
		if got := Recommend(5, waiting, map[string]float64{WaitingRequests: c.value}, 0.1); got != c.want {
			t.Errorf("Recommend %s = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestSizeSLOHugeLoad: a load too large for int32 sizes the role at
// math.MaxInt32 (its max applies in the step); one that is no number (∞/∞)
// leaves it unsized, to its metrics; a NaN latency is no correction.
func TestSizeSLOHugeLoad(t *testing.T) {
	s := SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, PrefillTokensPerSecond: 10000, DecodeStreamsPerReplica: 40}
	got := SizeSLO(s, SLOObservation{PromptTokensPerSecond: 1e300, RunningStreams: 1e300})
	if got.Prefill != math.MaxInt32 || got.Decode != math.MaxInt32 || !got.PrefillSized || !got.DecodeSized {
		t.Errorf("1e300: %+v, want both sized at MaxInt32", got)
	}
	got = SizeSLO(s, SLOObservation{PromptTokensPerSecond: math.Inf(1), RunningStreams: 3e11, MeasuredTTFT: math.NaN(), MeasuredTPOT: math.NaN()})
	if got.Prefill != math.MaxInt32 || got.Decode != math.MaxInt32 || got.PrefillCorrection != 1 || got.DecodeCorrection != 1 {
		t.Errorf("+Inf tokens, NaN latencies: %+v, want MaxInt32 each and no correction", got)
	}
	learned := s
	learned.PrefillTokensPerSecond = 0
	got = SizeSLO(learned, SLOObservation{PromptTokensPerSecond: math.Inf(1), PrefillTokensPerReplica: math.Inf(1)})
	if got.PrefillSized {
		t.Errorf("∞ tokens over an ∞ measured throughput: %+v, want prefill unsized", got)
	}
}

// TestRepairRatioHugeBand: a band whose repair asks for more replicas than
// int32 holds takes the lagging role to its max (was int32(1e12): MinInt32,
// below its min).
func TestRepairRatioHugeBand(t *testing.T) {
	wide := Bounds{1, 1000}
	for _, c := range []struct {
		name         string
		num, den     int32
		r            Ratio
		wantN, wantD int32
	}{
		{"numerator lags a 1e12 band", 1, 1, Ratio{Min: 1e12, Max: 1e12}, 1000, 1},
		{"denominator lags a 1e-12 band", 5, 1, Ratio{Min: 1e-12, Max: 1e-12}, 1, 1000},
		{"numerator lags an infinite band", 1, 1, Ratio{Min: math.Inf(1), Max: math.Inf(1)}, 1000, 1},
	} {
		got := RepairRatio(c.num, c.den, wide, wide, c.r)
		if got.Num != c.wantN || got.Den != c.wantD || !got.Infeasible {
			t.Errorf("%s: %+v, want %d/%d infeasible", c.name, got, c.wantN, c.wantD)
		}
	}
}

// TestValidateRefusesNaN: NaN compares false with every bound, so a policy
// made of NaNs passed Validate.
func TestValidateRefusesNaN(t *testing.T) {
	nan := math.NaN()
	for name, set := range map[string]func(*Policy){
		"tolerance":       func(p *Policy) { p.Tolerance = nan },
		"panic threshold": func(p *Policy) { p.PanicThreshold = nan },
		"up rate":         func(p *Policy) { p.MaxUpRate = nan },
		"down rate":       func(p *Policy) { p.MaxDownRate = nan },
		"ratio min":       func(p *Policy) { p.Ratio.Min = nan },
		"ratio max":       func(p *Policy) { p.Ratio.Max = nan },
	} {
		p := DefaultPolicy()
		p.Roles = map[string]RolePolicy{"p": waitingRole(0, 4), "d": waitingRole(0, 4)}
		p.Ratio = &Ratio{Numerator: "p", Denominator: "d", Min: 0.5, Max: 2}
		if _, err := New(p); err != nil {
			t.Fatal(err)
		}
		set(&p)
		if _, err := New(p); err == nil {
			t.Errorf("%s NaN: accepted", name)
		}
	}
}

// TestProjectNonFinite: an infinite load in the trend window, or now, is no
// trend (it made the projection NaN, and SizeSLO sized the role at zero).
func TestProjectNonFinite(t *testing.T) {
	t0 := time.Unix(0, 0)
	var s series
	for i, v := range []float64{100, 200, math.Inf(1), 400, 500} {
		s = s.add(t0.Add(time.Duration(i)*10*time.Second), v, time.Minute)
	}
	if got := s.project(500, 30*time.Second, time.Minute, 2, 0.5); got != 500 {
		t.Errorf("an infinite point in the window: projected %v, want 500", got)
	}
	if got := s.project(math.Inf(1), 30*time.Second, time.Minute, 2, 0.5); !math.IsInf(got, 1) {
		t.Errorf("an infinite load now: projected %v, want +Inf", got)
	}
}
