package autoscale

import (
	"math"
	"time"
)

// SLOAdapt are the SLO mode's stateful refinements, applied by
// Autoscaler.Step to the observation before SizeSLO sizes it. Zero values
// turn each off.
type SLOAdapt struct {
	// Lead sizes for the load expected Lead ahead (the engines' start-up
	// delay plus half the observation window, which lags): the trend of
	// prompt tokens/s and running streams over the last TrendWindow of
	// steps (least squares) is extrapolated, rises only (a scale-down
	// takes effect at once), and only when the rise is significant: the
	// fitted slope must exceed TrendSignificance standard errors (0: 2),
	// so noise alone does not add replicas. The projection adds at most
	// MaxTrendGain (0: 0.5) of the observed value.
	Lead, TrendWindow time.Duration
	TrendSignificance float64
	MaxTrendGain      float64
	// BaselineWindow learns online what the TTFT correction holds with no
	// excess: the lowest measured/expected TTFT ratio of the steps within
	// the window (at least 1). The expectation is multiplied by it, so the
	// correction acts only on the excess over that baseline (the transfer,
	// the decode leg's first step and the queueing the planned
	// utilization already allows are in every TTFT and would otherwise
	// size prefill twice for them).
	BaselineWindow time.Duration
	// CorrectionWindow remembers the corrections: each role's correction
	// is the highest of the steps within the window. A correction measures
	// how far the profile overestimates what a replica sustains within the
	// SLO at the current load; it falls back as soon as the replicas it
	// added bring the latency down, and without memory the next step
	// removes them again (and the load's next rise finds them starting).
	// The remembered factor multiplies the current load, so a role still
	// scales down as the load falls.
	CorrectionWindow time.Duration
}

// trendDefaults fills the zero knobs.
func (s SLOAdapt) trendDefaults() SLOAdapt {
	if s.TrendWindow <= 0 {
		s.TrendWindow = 5 * time.Minute
	}
	if s.TrendSignificance <= 0 {
		s.TrendSignificance = 2
	}
	if s.MaxTrendGain <= 0 {
		s.MaxTrendGain = 0.5
	}
	return s
}

type point struct {
	at time.Time
	v  float64
}

// series is a time-ordered window of observations.
type series []point

// add appends (at, v) and drops points at or before at-window.
func (s series) add(at time.Time, v float64, window time.Duration) series {
	s = append(s, point{at, v})
	cut := 0
	for cut < len(s) && !s[cut].at.After(at.Add(-window)) {
		cut++
	}
	if cut > 0 {
		s = append(s[:0], s[cut:]...)
	}
	return s
}

// Project returns v raised by the series' significant upward trend over
// lead, capped at v × (1 + gain). The series needs 4 points spanning at
// least half the window; otherwise v is returned unchanged.
func (s series) project(v float64, lead, window time.Duration, sig, gain float64) float64 {
	n := len(s)
	if n < 4 || lead <= 0 || !(v > 0) || math.IsInf(v, 1) || s[n-1].at.Sub(s[0].at) < window/2 {
		return v
	}
	t0 := s[0].at
	var mx, my float64
	for _, p := range s {
		mx += p.at.Sub(t0).Seconds()
		my += p.v
	}
	mx, my = mx/float64(n), my/float64(n)
	var sxx, sxy float64
	for _, p := range s {
		dx := p.at.Sub(t0).Seconds() - mx
		sxx += dx * dx
		sxy += dx * (p.v - my)
	}
	if sxx <= 0 {
		return v
	}
	slope := sxy / sxx
	if !(slope > 0) || math.IsInf(slope, 1) { // no rise, or no number (an infinite point in the window)
		return v
	}
	var sse float64
	for _, p := range s {
		r := p.v - (my + slope*(p.at.Sub(t0).Seconds()-mx))
		sse += r * r
	}
	if se := math.Sqrt(sse / float64(n-2) / sxx); !(slope >= sig*se) {
		return v
	}
	return min(v+slope*lead.Seconds(), v*(1+gain))
}

// sloState is what the SLO mode keeps between steps.
type sloState struct {
	prompt, streams series
	ratio           series
	pc, dc          series
}

// remember applies CorrectionWindow to a sized result.
func (a *Autoscaler) remember(now time.Time, o SLOObservation, r SLOResult) SLOResult {
	ad := a.p.SLO.Adapt
	if ad.CorrectionWindow <= 0 {
		return r
	}
	st := &a.slo
	st.pc = st.pc.add(now, r.PrefillCorrection, ad.CorrectionWindow)
	st.dc = st.dc.add(now, r.DecodeCorrection, ad.CorrectionWindow)
	r.PrefillCorrection = st.pc.highest()
	r.DecodeCorrection = st.dc.highest()
	r.size(*a.p.SLO, o)
	return r
}

// highest is the series' largest value (0 when empty).
func (s series) highest() float64 {
	v := 0.0
	for _, p := range s {
		v = max(v, p.v)
	}
	return v
}

// adapt applies the policy's SLOAdapt to an observation at now.
func (a *Autoscaler) adapt(now time.Time, o SLOObservation) SLOObservation {
	s := a.p.SLO
	if s == nil {
		return o
	}
	ad := s.Adapt
	st := &a.slo
	if ad.Lead > 0 {
		ad = ad.trendDefaults()
		st.prompt = st.prompt.add(now, o.PromptTokensPerSecond, ad.TrendWindow)
		st.streams = st.streams.add(now, o.RunningStreams, ad.TrendWindow)
		o.PromptTokensPerSecond = st.prompt.project(o.PromptTokensPerSecond, ad.Lead, ad.TrendWindow, ad.TrendSignificance, ad.MaxTrendGain)
		o.RunningStreams = st.streams.project(o.RunningStreams, ad.Lead, ad.TrendWindow, ad.TrendSignificance, ad.MaxTrendGain)
	}
	if ad.BaselineWindow > 0 && o.MeasuredTTFT > 0 {
		if exp := s.expectedTTFT(o); exp > 0 {
			st.ratio = st.ratio.add(now, o.MeasuredTTFT/exp, ad.BaselineWindow)
			base := math.Inf(1)
			for _, p := range st.ratio {
				base = min(base, p.v)
			}
			o.ExpectedTTFT = exp * min(max(base, 1), maxCorrection)
		}
	}
	return o
}
