package local

import (
	"time"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// policyFromSpec resolves an AutoscalingPolicy with its defaults. It is the
// adapter the Kubernetes controller has unexported (orchestrator's
// policyFromSpec), kept field for field the same until that one is exported.
func policyFromSpec(s *v1alpha1.AutoscalingPolicySpec) autoscale.Policy {
	p := autoscale.DefaultPolicy()
	secs := func(v *int32, d *time.Duration) {
		if v != nil {
			*d = time.Duration(*v) * time.Second
		}
	}
	if s.TolerancePercent != nil {
		p.Tolerance = float64(*s.TolerancePercent) / 100
	}
	secs(s.StableWindowSeconds, &p.StableWindow)
	secs(s.PanicWindowSeconds, &p.PanicWindow)
	secs(s.ScaleDownCooldownSeconds, &p.DownCooldown)
	if s.PanicThresholdPercent != nil {
		p.PanicThreshold = float64(*s.PanicThresholdPercent) / 100
	}
	if s.MaxScaleUpRate != nil {
		p.MaxUpRate = *s.MaxScaleUpRate
	}
	if s.MaxScaleDownRate != nil {
		p.MaxDownRate = *s.MaxScaleDownRate
	}
	for _, r := range s.Roles {
		rp := autoscale.RolePolicy{Bounds: autoscale.Bounds{Min: r.MinReplicas, Max: r.MaxReplicas}}
		for _, m := range r.Metrics {
			if m.Source == "" || m.Source == "mesh" {
				rp.Targets = append(rp.Targets, autoscale.Target{Name: m.Name, Target: m.Target})
			}
		}
		p.Roles[r.Name] = rp
	}
	if s.Ratio != nil {
		p.Ratio = &autoscale.Ratio{Numerator: s.Ratio.NumeratorRole, Denominator: s.Ratio.DenominatorRole, Min: s.Ratio.MinRatio, Max: s.Ratio.MaxRatio}
	}
	if s.SLO != nil {
		p.SLO = &autoscale.SLO{
			TTFTSeconds: float64(max(s.SLO.TTFTMilliseconds, 1)) / 1000, TPOTSeconds: float64(max(s.SLO.TPOTMilliseconds, 1)) / 1000,
			PrefillTokensPerSecond: s.SLO.PrefillTokensPerSecond, DecodeStreamsPerReplica: s.SLO.DecodeStreamsPerReplica,
		}
		p.SLOPrefill, p.SLODecode = s.SLO.PrefillRole, s.SLO.DecodeRole
	}
	return p
}
