package local

import (
	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// policyFromSpec resolves an AutoscalingPolicy as the Kubernetes controller
// does, keeping only the metric targets the local backend can read (the
// mesh's; there is no Prometheus on loopback).
func policyFromSpec(s *v1alpha1.AutoscalingPolicySpec) autoscale.Policy {
	c := *s
	c.Roles = make([]v1alpha1.RoleAutoscaling, len(s.Roles))
	for i, r := range s.Roles {
		r.Metrics = nil
		for _, m := range s.Roles[i].Metrics {
			if m.Source == "" || m.Source == "mesh" {
				r.Metrics = append(r.Metrics, m)
			}
		}
		c.Roles[i] = r
	}
	return orchestrator.PolicyFromSpec(&c)
}
