package autoscale

import "testing"

func TestSizeSLO(t *testing.T) {
	s := SLO{TTFTSeconds: 0.5, TPOTSeconds: 0.05, PrefillTokensPerSecond: 10000, DecodeStreamsPerReplica: 40}
	cases := []sloCase{
		{"on profile", SLOObservation{PromptTokensPerSecond: 25000, RunningStreams: 100}, 3, 3, false, 1, 1},
		{"measured at target: no correction", SLOObservation{PromptTokensPerSecond: 25000, RunningStreams: 100, MeasuredTTFT: 0.5, MeasuredTPOT: 0.05}, 3, 3, false, 1, 1},
		{"TTFT 1.6x the expectation", SLOObservation{PromptTokensPerSecond: 25000, RunningStreams: 80, MeasuredTTFT: 0.8}, 4, 2, true, 1.6, 1},
		{"faster than profiled", SLOObservation{PromptTokensPerSecond: 40000, RunningStreams: 80, MeasuredTTFT: 0.3, MeasuredTPOT: 0.025}, 3, 1, false, 0.6, 0.5},
		{"correction clamped at 3", SLOObservation{PromptTokensPerSecond: 10000, MeasuredTTFT: 5}, 3, 0, true, 3, 1},
		{"expected latency from the profile", SLOObservation{RunningStreams: 40, MeasuredTPOT: 0.04, ExpectedTPOT: 0.02}, 0, 2, false, 1, 2},
		{"no load", SLOObservation{}, 0, 0, false, 1, 1},
	}
	for _, c := range cases {
		got := SizeSLO(s, c.o)
		checkSLO(t, c.name, got, c.p, c.d, c.atRisk, c.pc, c.dc)
	}
	// No profiled prefill throughput: the measured one × the utilization
	// (0.8 by default), and no prefill sizing while it is unknown.
	learned := s
	learned.PrefillTokensPerSecond = 0
	for _, c := range []struct {
		name string
		util float64
		o    SLOObservation
		p    int32
	}{
		{"measured, default 0.8", 0, SLOObservation{PromptTokensPerSecond: 25000, PrefillTokensPerReplica: 10000}, 4}, // 25000 / 8000
		{"measured, 1.0", 1, SLOObservation{PromptTokensPerSecond: 25000, PrefillTokensPerReplica: 10000}, 3},
		{"measured, 0.5", 0.5, SLOObservation{PromptTokensPerSecond: 25000, PrefillTokensPerReplica: 10000}, 5},
		{"measured, corrected 1.6x", 1, SLOObservation{PromptTokensPerSecond: 25000, PrefillTokensPerReplica: 10000, MeasuredTTFT: 0.8}, 4},
		{"not measured: not sized", 0, SLOObservation{PromptTokensPerSecond: 25000}, 0},
	} {
		l := learned
		l.PrefillUtilization = c.util
		if got := SizeSLO(l, c.o); got.Prefill != c.p {
			t.Errorf("%s: prefill %d, want %d", c.name, got.Prefill, c.p)
		}
	}
	// A profiled throughput wins over a measured one.
	if got := SizeSLO(s, SLOObservation{PromptTokensPerSecond: 25000, PrefillTokensPerReplica: 1000}); got.Prefill != 3 {
		t.Errorf("profiled and measured: prefill %d, want 3 (the profile's)", got.Prefill)
	}
	// With MinCorrection 1, faster than expected never lowers a role.
	up := s
	up.MinCorrection = 1
	for _, c := range []sloCase{
		{"raise-only: faster than profiled", SLOObservation{PromptTokensPerSecond: 40000, RunningStreams: 80, MeasuredTTFT: 0.3, MeasuredTPOT: 0.025}, 4, 2, false, 1, 1},
		{"raise-only: slower still raises", SLOObservation{PromptTokensPerSecond: 25000, RunningStreams: 80, MeasuredTTFT: 0.8}, 4, 2, true, 1.6, 1},
	} {
		checkSLO(t, c.name, SizeSLO(up, c.o), c.p, c.d, c.atRisk, c.pc, c.dc)
	}
	// With an aim, the correction steers the TTFT p90 to that share of the
	// target (0.4 × 0.5 s = 0.2 s); an observation's own expectation wins.
	aim := up
	aim.TTFTAim = 0.4
	for _, c := range []sloCase{
		{"aim: p90 at the aim", SLOObservation{PromptTokensPerSecond: 25000, MeasuredTTFT: 0.2}, 3, 0, false, 1, 1},
		{"aim: p90 1.5x the aim, within the target", SLOObservation{PromptTokensPerSecond: 25000, MeasuredTTFT: 0.3}, 4, 0, false, 1.5, 1},
		{"aim: below the aim, raise-only", SLOObservation{PromptTokensPerSecond: 25000, MeasuredTTFT: 0.1}, 3, 0, false, 1, 1},
		{"aim: the observation's expectation wins", SLOObservation{PromptTokensPerSecond: 25000, MeasuredTTFT: 0.3, ExpectedTTFT: 0.3}, 3, 0, false, 1, 1},
		{"aim: clamped at 3", SLOObservation{PromptTokensPerSecond: 10000, MeasuredTTFT: 1}, 3, 0, true, 3, 1},
	} {
		checkSLO(t, c.name, SizeSLO(aim, c.o), c.p, c.d, c.atRisk, c.pc, c.dc)
	}
	// A TPOT aim does the same for decode (0.6 × 50 ms = 30 ms): a p90
	// within the target but over the aim adds decode replicas.
	taim := up
	taim.TPOTAim = 0.6
	for _, c := range []sloCase{
		{"TPOT aim: p90 1.5x the aim, within the target", SLOObservation{RunningStreams: 80, MeasuredTPOT: 0.045}, 0, 3, false, 1, 1.5},
		{"TPOT aim: below the aim, raise-only", SLOObservation{RunningStreams: 80, MeasuredTPOT: 0.02}, 0, 2, false, 1, 1},
		{"TPOT aim: the observation's expectation wins", SLOObservation{RunningStreams: 80, MeasuredTPOT: 0.045, ExpectedTPOT: 0.045}, 0, 2, false, 1, 1},
	} {
		checkSLO(t, c.name, SizeSLO(taim, c.o), c.p, c.d, c.atRisk, c.pc, c.dc)
	}
	// Without raise-only, a p90 under the aim lowers prefill (to the clamp).
	aim.MinCorrection = 0
	checkSLO(t, "aim: below the aim lowers", SizeSLO(aim, SLOObservation{PromptTokensPerSecond: 25000, MeasuredTTFT: 0.1}), 2, 0, false, 0.5, 1)
}

// sloCase is one SizeSLO input and the sizing and corrections it must give.
type sloCase struct {
	name   string
	o      SLOObservation
	p, d   int32
	atRisk bool
	pc, dc float64
}

func checkSLO(t *testing.T, name string, got SLOResult, p, d int32, atRisk bool, pc, dc float64) {
	t.Helper()
	if got.Prefill != p || got.Decode != d || got.AtRisk != atRisk ||
		abs(got.PrefillCorrection-pc) > 1e-9 || abs(got.DecodeCorrection-dc) > 1e-9 {
		t.Errorf("%s: %+v, want p=%d d=%d risk=%v corrections %v/%v", name, got, p, d, atRisk, pc, dc)
	}
}

func abs(x float64) float64 {
	if x < 0 {
		return -x
	}
	return x
}
