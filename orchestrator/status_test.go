package orchestrator

import (
	"testing"

	"k8s.io/apimachinery/pkg/api/meta"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestStatusPartitionHeld: a rollout held by rollout.partition settles
// (Progressing False, PartitionHeld) once every replica at or above the
// partition is updated, so `kubectl wait` ends; before that it is
// Reconciling, and without outdated replicas Complete.
func TestStatusPartitionHeld(t *testing.T) {
	md := testMD(2, v1alpha1.RecoverRole, role("d", 3, 1))
	pods := existing(md) // at the old template
	md.Spec.Roles[0].Template.Spec.Containers[0].Image = "v2"
	md.Spec.Roles[0].Workers.Template.Spec.Containers[0].Image = "v2"
	md.Spec.Roles[0].Rollout.Partition = i32(2)
	rev := revision(md, &md.Spec.Roles[0])
	progressing := func() (bool, string) {
		c := meta.FindStatusCondition(computeStatus(md, pods, v1alpha1.ModelDeploymentStatus{}, nil, nil, nil).Conditions, v1alpha1.ConditionProgressing)
		return c.Status == "True", c.Reason
	}
	if on, reason := progressing(); !on || reason != "Reconciling" {
		t.Errorf("replica 2 outdated: progressing %v (%s), want true (Reconciling)", on, reason)
	}
	for _, p := range pods {
		if s, _ := slotOf(p); s.Replica >= 2 {
			p.Labels[v1alpha1.LabelRevision] = rev
		}
	}
	if on, reason := progressing(); on || reason != reasonPartitionHeld {
		t.Errorf("replicas 0 and 1 held: progressing %v (%s), want false (%s)", on, reason, reasonPartitionHeld)
	}
	for _, p := range pods {
		p.Labels[v1alpha1.LabelRevision] = rev
	}
	if on, reason := progressing(); on || reason != "Complete" {
		t.Errorf("all updated: progressing %v (%s), want false (Complete)", on, reason)
	}
}
