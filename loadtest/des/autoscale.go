package des

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// Autoscaler decides the P/D role sizes at each sync period from what a
// real autoscaler sees (Signals). Called from the run's goroutine only.
type Autoscaler interface {
	Name() string
	// Setting describes the configuration (for reports).
	Setting() string
	// Decide returns the prefill and decode engines wanted (requested,
	// including ones still starting).
	Decide(now time.Duration, sig *Signals) (prefill, decode int)
}

// RunScale simulates reqs on cfg's cluster with as deciding its size.
func RunScale(ctx context.Context, cfg ScaleConfig, reqs []workload.Request, as Autoscaler) (ScaleResult, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return ScaleResult{}, err
	}
	if err := cfg.CheckTransfers(reqs); err != nil {
		return ScaleResult{}, err
	}
	s, err := newScaleSim(&cfg, reqs, as)
	if err != nil {
		return ScaleResult{}, err
	}
	res := s.run(ctx)
	if err := ctx.Err(); err != nil {
		return ScaleResult{}, fmt.Errorf("des: %w", err)
	}
	return res, nil
}

// Static keeps the cluster at its starting size.
type Static struct{}

// Name implements Autoscaler.
func (Static) Name() string { return "static" }

// Setting implements Autoscaler.
func (Static) Setting() string { return "" }

// Decide implements Autoscaler: no change.
func (Static) Decide(_ time.Duration, sig *Signals) (int, int) {
	return sig.Prefill.Replicas, sig.Decode.Replicas
}

// Role names the SLO mode's policy uses.
const (
	rolePrefill = "prefill"
	roleDecode  = "decode"
)

// SLOScalerConfig configures kvmesh's SLO mode in the DES.
type SLOScalerConfig struct {
	// Policy is the AutoscalingPolicy as the controller resolves it; its
	// Roles must be "prefill" and "decode" (SLO fields are filled here).
	Policy autoscale.Policy
	// Profile is the profiling run's result.
	Profile EngineProfile
	// Utilization is the share of the profiled capacity the SLO mode
	// plans for (its target knob): prefill tokens/s = Utilization ×
	// profiled throughput; decode streams = DecodeUtilization (default
	// Utilization) × the streams whose profiled TPOT meets the target.
	Utilization, DecodeUtilization float64
	SLOTTFT, SLOTP                 float64 // seconds
	// TTFTExpectation sets the TTFT the prefill correction divides by:
	// 0 means the profile's (the window's p90 prompt prefilled with no
	// queue, Dynamo's interpolation); f > 0 is the policy's TTFTAim: f ×
	// the TTFT target, as the controller divides (it has no profile), so
	// the correction steers the measured p90 toward that share of the
	// SLO (below 1 it lowers the sizing, down to the clamp of 0.5, or to
	// the profiled demand with RaiseOnly).
	TTFTExpectation float64
	// TPOTExpectation sets the TPOT the decode correction divides by: 0
	// means the profile's TPOT at the window's streams per ready decode
	// engine (Dynamo's interpolation); f > 0 is the policy's TPOTAim: f ×
	// the TPOT target, as the controller divides (it has no profile; f = 1:
	// the target itself), so with RaiseOnly a TPOT p90 below that share of
	// the target never adds decode engines.
	TPOTExpectation float64
	// RaiseOnly sets the policy's MinCorrection to 1: corrections only
	// add replicas.
	RaiseOnly bool
	// Adapt are the policy's stateful SLO refinements (trend lead,
	// learned TTFT baseline), as autoscale.SLO.Adapt.
	Adapt autoscale.SLOAdapt
	// LearnedPrefill plans prefill from the router's learned prefill rate
	// of the ready prefill engines (Signals.PrefillTokensPerReplica) ×
	// Utilization instead of the profile's throughput, as the controller
	// does for a policy without prefillTokensPerSecond.
	LearnedPrefill bool
	// AggregateBelow is the policy's SLO.AggregateBelow (0: off): at most
	// this many replicas' worth of fractional prefill plus decode demand
	// sizes prefill 0 and decode at least 1, and the router serves whole
	// requests on decode engines (the prefill role's min must be 0).
	AggregateBelow float64
}

// SLOScaler is kvmesh's SLO mode: orchestrator/autoscale's Autoscaler
// (the code the controller steps) with SizeSLO demand, windows, rate
// limits and the ratio band.
type SLOScaler struct {
	cfg SLOScalerConfig
	a   *autoscale.Autoscaler
}

// NewSLOScaler validates the policy.
func NewSLOScaler(c SLOScalerConfig) (*SLOScaler, error) {
	if c.DecodeUtilization == 0 {
		c.DecodeUtilization = c.Utilization
	}
	if !(c.Utilization > 0) || !(c.DecodeUtilization > 0) || c.Profile.PrefillTokensPerSecond <= 0 {
		return nil, fmt.Errorf("%w: slo mode: utilizations %v/%v and a profile are required", ErrConfig, c.Utilization, c.DecodeUtilization)
	}
	p := c.Policy
	p.SLO = &autoscale.SLO{TTFTSeconds: c.SLOTTFT, TPOTSeconds: c.SLOTP,
		PrefillTokensPerSecond:  c.Utilization * c.Profile.PrefillTokensPerSecond,
		DecodeStreamsPerReplica: c.DecodeUtilization * c.Profile.StreamsWithin(c.SLOTP)}
	if c.LearnedPrefill {
		p.SLO.PrefillTokensPerSecond, p.SLO.PrefillUtilization = 0, c.Utilization
	}
	if c.RaiseOnly {
		p.SLO.MinCorrection = 1
	}
	p.SLO.TTFTAim = c.TTFTExpectation
	p.SLO.TPOTAim = c.TPOTExpectation
	p.SLO.Adapt = c.Adapt
	p.SLO.AggregateBelow = c.AggregateBelow
	p.SLOPrefill, p.SLODecode = rolePrefill, roleDecode
	if p.SLO.DecodeStreamsPerReplica <= 0 {
		return nil, fmt.Errorf("%w: slo mode: no stream count meets TPOT %vs in the profile", ErrConfig, c.SLOTP)
	}
	a, err := autoscale.New(p)
	if err != nil {
		return nil, fmt.Errorf("%w: slo mode: %w", ErrConfig, err)
	}
	c.Policy = p
	return &SLOScaler{cfg: c, a: a}, nil
}

// Name implements Autoscaler.
func (*SLOScaler) Name() string { return "kvmesh-slo" }

// Setting implements Autoscaler.
func (s *SLOScaler) Setting() string {
	r := ""
	if b := s.cfg.Policy.Ratio; b != nil {
		r = fmt.Sprintf(", ratio %.2g–%.2g", b.Min, b.Max)
	}
	p := s.cfg.Policy
	e := "profile"
	if s.cfg.TTFTExpectation > 0 {
		e = fmt.Sprintf("%.2g×SLO", s.cfg.TTFTExpectation)
	}
	if s.cfg.TPOTExpectation > 0 {
		e += fmt.Sprintf(", TPOT expected %.2g×SLO", s.cfg.TPOTExpectation)
	}
	if s.cfg.RaiseOnly {
		e += ", raise-only"
	}
	if ad := s.cfg.Adapt; ad.BaselineWindow > 0 {
		e += fmt.Sprintf(" × learned baseline (%v)", ad.BaselineWindow)
	}
	if ad := s.cfg.Adapt; ad.Lead > 0 {
		e += fmt.Sprintf(", trend lead %v", ad.Lead)
	}
	if ad := s.cfg.Adapt; ad.CorrectionWindow > 0 {
		e += fmt.Sprintf(", corrections held %v", ad.CorrectionWindow)
	}
	if s.cfg.AggregateBelow > 0 {
		e += fmt.Sprintf(", aggregated on decode below %.2g replicas", s.cfg.AggregateBelow)
	}
	pre := fmt.Sprintf("%.0f tok/s", p.SLO.PrefillTokensPerSecond)
	if s.cfg.LearnedPrefill {
		pre = "of the learned prefill rate"
	}
	return fmt.Sprintf("util P %.2f D %.2f (%s, %.1f streams), TTFT expected %s, stable %v, cool-down %v%s", s.cfg.Utilization,
		s.cfg.DecodeUtilization, pre, p.SLO.DecodeStreamsPerReplica, e, p.StableWindow, p.DownCooldown, r)
}

// Decide implements Autoscaler: the mesh's gossip as the controller sums
// it (orchestrator's observe), the ingress window as SLOObservation.
func (s *SLOScaler) Decide(now time.Duration, sig *Signals) (int, int) {
	obs := map[string]autoscale.Observation{rolePrefill: observation(sig.Prefill), roleDecode: observation(sig.Decode)}
	streams := 0.0
	for _, l := range sig.Decode.Loads {
		streams += float64(l.Running + l.Waiting)
	}
	uncached := 1 - sig.CachedFraction
	so := autoscale.SLOObservation{
		PromptTokensPerSecond: sig.PromptTokensPerSecond * uncached,
		RunningStreams:        streams,
		MeasuredTTFT:          sig.TTFTP90,
		MeasuredTPOT:          sig.TPOTP90,
		// Expected TPOT at the window's load from the profile, as
		// Dynamo's planner interpolates it: the TPOT at the streams per
		// ready replica.
		ExpectedTPOT: s.cfg.Profile.TPOTAt(streams / math.Max(float64(sig.Decode.Ready), 1)),
	}
	if s.cfg.TPOTExpectation > 0 {
		so.ExpectedTPOT = 0 // the policy's TPOTAim, as in the controller
	}
	if s.cfg.LearnedPrefill {
		so.PrefillTokensPerReplica = sig.PrefillTokensPerReplica
	}
	if s.cfg.TTFTExpectation == 0 {
		// The p90 prompt's prefill with no queue (otherwise the policy's
		// TTFTAim, as in the controller).
		so.ExpectedTTFT = sig.P90Prompt * uncached / s.cfg.Profile.PrefillTokensPerSecond
	}
	res := s.a.Step(epoch.Add(now), obs, &so)
	return int(res.Roles[rolePrefill].Desired), int(res.Roles[roleDecode].Desired)
}

// observation is what the controller's observe builds from gossip:
// totals of waiting, running and queued prefill tokens, mean KV usage.
func observation(r RoleSignals) autoscale.Observation {
	o := autoscale.Observation{Current: int32(r.Replicas), Metrics: map[string]float64{}}
	if len(r.Loads) == 0 {
		return o
	}
	var w, run, q, kv float64
	for _, l := range r.Loads {
		w += float64(l.Waiting)
		run += float64(l.Running)
		q += float64(l.QueuedPrefillTokens)
		kv += l.KVUsage
	}
	o.Metrics[autoscale.WaitingRequests] = w
	o.Metrics[autoscale.RunningRequests] = run
	o.Metrics[autoscale.PrefillQueueTokens] = q
	o.Metrics[autoscale.KVUsage] = kv / float64(len(r.Loads))
	return o
}
