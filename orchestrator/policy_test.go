package orchestrator

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestRolesStuckAtZero: a role with minReplicas 0 comes back from zero
// only through a Prometheus metric counting its demand or a ratio band
// with a role that never goes to zero.
func TestRolesStuckAtZero(t *testing.T) {
	role := func(name string, min int32, metrics ...v1alpha1.MetricTarget) v1alpha1.RoleAutoscaling {
		return v1alpha1.RoleAutoscaling{Name: name, MinReplicas: min, MaxReplicas: 4, Metrics: metrics}
	}
	mesh := v1alpha1.MetricTarget{Name: "waitingRequests", Target: 10}
	promCount := v1alpha1.MetricTarget{Name: "waitingRequests", Target: 10, Source: "prometheus", Query: "q"}
	promAvg := v1alpha1.MetricTarget{Name: "kvUsage", Target: 0.8, Source: "prometheus", Query: "q"}
	band := &v1alpha1.RatioConstraint{NumeratorRole: "prefill", DenominatorRole: "decode", MinRatio: 0.5, MaxRatio: 2}
	cases := []struct {
		name string
		spec v1alpha1.AutoscalingPolicySpec
		prom bool
		want []string
	}{
		{"min 1", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 1, mesh)}}, true, nil},
		{"mesh only", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 0, mesh)}}, true, []string{"decode"}},
		{"no metric", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 0)}}, true, []string{"decode"}},
		{"prometheus count", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 0, mesh, promCount)}}, true, nil},
		{"prometheus not evaluated", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 0, promCount)}}, false, []string{"decode"}},
		{"prometheus average", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("decode", 0, promAvg)}}, true, []string{"decode"}},
		{"band with a role at 1", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("prefill", 1, mesh), role("decode", 0, mesh)}, Ratio: band}, false, nil},
		{"band with a role woken by prometheus", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("prefill", 0, promCount), role("decode", 0, mesh)}, Ratio: band}, true, nil},
		{"band, both at zero", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("prefill", 0, mesh), role("decode", 0, mesh)}, Ratio: band}, true, []string{"prefill", "decode"}},
		{"outside the band", v1alpha1.AutoscalingPolicySpec{Roles: []v1alpha1.RoleAutoscaling{role("prefill", 1, mesh), role("decode", 1, mesh), role("mixed", 0, mesh)}, Ratio: band}, true, []string{"mixed"}},
	}
	for _, c := range cases {
		if got := RolesStuckAtZero(&c.spec, c.prom); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}
