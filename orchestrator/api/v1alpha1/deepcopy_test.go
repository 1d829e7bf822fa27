package v1alpha1

import (
	"reflect"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// TestDeepCopyAdoptionFields: the adoption and Prometheus fields survive a
// deep copy, and the copy shares nothing with the original.
func TestDeepCopyAdoptionFields(t *testing.T) {
	stale := int32(30)
	in := &AutoscalingPolicy{Spec: AutoscalingPolicySpec{
		Prometheus: &PrometheusSource{Address: "http://prom:9090", StaleAfterSeconds: &stale},
		Roles: []RoleAutoscaling{{Name: "decode", MaxReplicas: 4, Workload: &WorkloadRef{Kind: WorkloadStatefulSet,
			Selector: &metav1.LabelSelector{MatchLabels: map[string]string{LabelRoleKind: "decode"}}}}},
	}, Status: AutoscalingPolicyStatus{Roles: []RoleAutoscalingStatus{{Name: "decode", Workload: "StatefulSet/llm"}}}}
	out := in.DeepCopy()
	if !reflect.DeepEqual(in, out) {
		t.Fatalf("copy differs:\n%+v\n%+v", in, out)
	}
	out.Spec.Roles[0].Workload.Selector.MatchLabels[LabelRoleKind] = "prefill"
	*out.Spec.Prometheus.StaleAfterSeconds = 1
	if in.Spec.Roles[0].Workload.Selector.MatchLabels[LabelRoleKind] != "decode" || *in.Spec.Prometheus.StaleAfterSeconds != 30 {
		t.Error("the copy shares memory with the original")
	}
}
