package autoscale

import (
	"math"
	"testing"
	"time"
)

func TestSeriesProject(t *testing.T) {
	t0 := time.Unix(0, 0)
	const lead, window = 90 * time.Second, 5 * time.Minute
	// mk builds one point every 15 s from vals.
	mk := func(vals ...float64) series {
		var s series
		for i, v := range vals {
			s = s.add(t0.Add(time.Duration(i)*15*time.Second), v, window)
		}
		return s
	}
	ramp := func(n int, from, step float64) []float64 {
		v := make([]float64, n)
		for i := range v {
			v[i] = from + step*float64(i)
		}
		return v
	}
	cases := []struct {
		name string
		s    series
		v    float64
		gain float64
		want float64
	}{
		// 1/s per 15 s = 1/15 per s; 90 s ahead: +6.
		{"steady rise projected one lead ahead", mk(ramp(11, 100, 1)...), 110, 0.5, 116},
		{"falling: never lowered", mk(ramp(11, 110, -1)...), 100, 0.5, 100},
		{"flat: unchanged", mk(ramp(11, 100, 0)...), 100, 0.5, 100},
		{"steep rise capped at the gain", mk(ramp(11, 100, 20)...), 200, 0.5, 300},
		{"noise without a trend: not significant", mk(100, 130, 80, 120, 90, 125, 85, 110, 95, 115, 105), 105, 0.5, 105},
		{"too few points", mk(100, 110, 120), 120, 0.5, 120},
		{"points span less than half the window", mk(ramp(5, 100, 10)...), 140, 0.5, 140},
		{"no load", mk(ramp(11, 0, 0)...), 0, 0.5, 0},
	}
	for _, c := range cases {
		got := c.s.project(c.v, lead, window, 2, c.gain)
		if math.Abs(got-c.want) > 1e-6 {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestSeriesAddDropsOld(t *testing.T) {
	t0 := time.Unix(0, 0)
	var s series
	for i := range 30 {
		s = s.add(t0.Add(time.Duration(i)*15*time.Second), float64(i), time.Minute)
	}
	// A 60 s window at 15 s steps keeps the last 4 (the one exactly 60 s old has expired).
	if len(s) != 4 || s[0].v != 26 || s[3].v != 29 {
		t.Fatalf("window: %+v", s)
	}
}

// sloPolicy is a one-prefill-one-decode policy with wide bounds and no
// windows to speak of, so Step returns SizeSLO's sizing.
func sloPolicy(ad SLOAdapt) Policy {
	p := DefaultPolicy()
	p.Tolerance, p.StableWindow, p.PanicWindow, p.PanicThreshold = 0, 15*time.Second, 15*time.Second, 100
	p.DownCooldown = 0
	p.MaxUpRate, p.MaxDownRate = 100, 100
	p.Roles = map[string]RolePolicy{"prefill": {Bounds: Bounds{Min: 0, Max: 100}}, "decode": {Bounds: Bounds{Min: 0, Max: 100}}}
	p.SLO = &SLO{TTFTSeconds: 2, TPOTSeconds: 0.05, PrefillTokensPerSecond: 1000, DecodeStreamsPerReplica: 10, Adapt: ad}
	p.SLOPrefill, p.SLODecode = "prefill", "decode"
	return p
}

func TestStepSLOAdapt(t *testing.T) {
	t0 := time.Unix(0, 0)
	type step struct {
		o                  SLOObservation
		wantP, wantD       int32
		wantPrefillCorrect float64
	}
	cases := []struct {
		name  string
		ad    SLOAdapt
		steps []step
	}{
		{"off: measured/expected corrects", SLOAdapt{}, []step{
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.6, ExpectedTTFT: 0.4}, 3, 1, 1.5},
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.6, ExpectedTTFT: 0.4}, 3, 1, 1.5},
		}},
		{"baseline: the steady no-excess ratio is learned and not corrected", SLOAdapt{BaselineWindow: 10 * time.Minute}, []step{
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.6, ExpectedTTFT: 0.4}, 2, 1, 1},
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.6, ExpectedTTFT: 0.4}, 2, 1, 1},
			// A queue: 1.2/0.4 = 3 against the baseline 1.5 corrects by 2.
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 1.2, ExpectedTTFT: 0.4}, 4, 1, 2},
		}},
		{"baseline never below 1: faster than profiled still lowers", SLOAdapt{BaselineWindow: 10 * time.Minute}, []step{
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.3, ExpectedTTFT: 0.4}, 2, 1, 0.75},
		}},
		{"correction window: the highest correction is held for the window, on the current load", SLOAdapt{CorrectionWindow: time.Minute}, []step{
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 1.2, ExpectedTTFT: 0.4, MeasuredTPOT: 0.1, ExpectedTPOT: 0.05}, 6, 2, 3},
			// The latency is back at its expectation: the replicas stay.
			{SLOObservation{PromptTokensPerSecond: 2000, RunningStreams: 10, MeasuredTTFT: 0.4, ExpectedTTFT: 0.4, MeasuredTPOT: 0.05, ExpectedTPOT: 0.05}, 6, 2, 3},
			// The load halves: the held factor multiplies the new load.
			{SLOObservation{PromptTokensPerSecond: 1000, RunningStreams: 10, MeasuredTTFT: 0.4, ExpectedTTFT: 0.4, MeasuredTPOT: 0.05, ExpectedTPOT: 0.05}, 3, 2, 3},
			{SLOObservation{PromptTokensPerSecond: 1000, RunningStreams: 10, MeasuredTTFT: 0.4, ExpectedTTFT: 0.4, MeasuredTPOT: 0.05, ExpectedTPOT: 0.05}, 3, 2, 3},
			// A minute after it, the correction has left the window.
			{SLOObservation{PromptTokensPerSecond: 1000, RunningStreams: 10, MeasuredTTFT: 0.4, ExpectedTTFT: 0.4, MeasuredTPOT: 0.05, ExpectedTPOT: 0.05}, 1, 1, 1},
		}},
		{"lead: a steady rise sizes ahead", SLOAdapt{Lead: 60 * time.Second, TrendWindow: time.Minute}, []step{
			{SLOObservation{PromptTokensPerSecond: 1000, RunningStreams: 10}, 1, 1, 1},
			{SLOObservation{PromptTokensPerSecond: 1100, RunningStreams: 10}, 2, 1, 1},
			{SLOObservation{PromptTokensPerSecond: 1200, RunningStreams: 10}, 2, 1, 1},
			// +100 per 15 s over 60 s: 1300 + 400 = 1700 → 2.
			{SLOObservation{PromptTokensPerSecond: 1300, RunningStreams: 10}, 2, 1, 1},
			{SLOObservation{PromptTokensPerSecond: 1400, RunningStreams: 10}, 2, 1, 1},
			// The last 60 s (1200…1900) fit 14.7/s: 1900 + 880 → 3 where the window alone says 2.
			{SLOObservation{PromptTokensPerSecond: 1900, RunningStreams: 10}, 3, 1, 1},
		}},
	}
	for _, c := range cases {
		a, err := New(sloPolicy(c.ad))
		if err != nil {
			t.Fatal(err)
		}
		for i, s := range c.steps {
			o := s.o
			r := a.Step(t0.Add(time.Duration(i)*15*time.Second), map[string]Observation{"prefill": {Current: 1}, "decode": {Current: 1}}, &o)
			if r.SLO.Prefill != s.wantP || r.SLO.Decode != s.wantD || math.Abs(r.SLO.PrefillCorrection-s.wantPrefillCorrect) > 1e-9 {
				t.Errorf("%s, step %d: sized %d/%d correction %v, want %d/%d %v", c.name, i, r.SLO.Prefill, r.SLO.Decode,
					r.SLO.PrefillCorrection, s.wantP, s.wantD, s.wantPrefillCorrect)
			}
		}
	}
}

// TestStepUnsizedRoleFollowsItsMetrics: a policy without a prefill
// throughput and no measured one yet cannot size prefill from the SLO:
// prefill follows its metric target (not zero), decode is still sized by
// the SLO; once a measured throughput arrives, the SLO sizes prefill.
func TestStepUnsizedRoleFollowsItsMetrics(t *testing.T) {
	p := sloPolicy(SLOAdapt{})
	p.SLO.PrefillTokensPerSecond = 0
	p.Roles["prefill"] = RolePolicy{Bounds: Bounds{Min: 0, Max: 100}, Targets: []Target{{Name: WaitingRequests, Target: 2}}}
	a, err := New(p)
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(0, 0)
	obs := map[string]Observation{"prefill": {Current: 2, Metrics: map[string]float64{WaitingRequests: 12}}, "decode": {Current: 1}}
	o := SLOObservation{PromptTokensPerSecond: 4000, RunningStreams: 30}
	r := a.Step(t0, obs, &o)
	if r.SLO.PrefillSized || !r.SLO.DecodeSized {
		t.Fatalf("sized flags %+v: want prefill unsized, decode sized", r.SLO)
	}
	if got := r.Roles["prefill"].Desired; got != 6 { // 12 waiting ÷ 2 per replica
		t.Errorf("prefill desired %d, want 6 from its waiting-requests target", got)
	}
	if got := r.Roles["decode"].Desired; got != 3 { // 30 streams ÷ 10
		t.Errorf("decode desired %d, want 3 from the SLO", got)
	}
	o.PrefillTokensPerReplica = 1000 // measured: 4000 ÷ (0.8 × 1000) = 5
	r = a.Step(t0.Add(15*time.Second), obs, &o)
	if !r.SLO.PrefillSized || r.SLO.Prefill != 5 {
		t.Errorf("with a measured throughput: %+v, want prefill sized 5", r.SLO)
	}
}
