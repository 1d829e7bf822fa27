package orchestrator

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestPDGroupLabelIsNoControllerLabel: no label the controller writes on a
// pod (a leader's and a worker's, injected sidecar) is admitted as
// pdGroupLabel: it overwrote that label, and the pods were deleted and
// recreated forever (slot or revision label) or orphaned (deployment).
func TestPDGroupLabelIsNoControllerLabel(t *testing.T) {
	md := testMD(1, "", role("d", 1, 1))
	var keys []string
	for _, m := range []int{0, 1} {
		for k := range buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, m}).Labels {
			if k != v1alpha1.DefaultPDGroupLabel && !slices.Contains(keys, k) {
				keys = append(keys, k)
			}
		}
	}
	if !slices.Contains(keys, v1alpha1.LabelInject) || !slices.Contains(keys, v1alpha1.LabelReplica) {
		t.Fatalf("pod labels %v", keys)
	}
	for _, k := range append(keys, v1alpha1.LabelModel, "kvmesh.io/anything") {
		m := testMD(1, "", role("d", 1, 1))
		m.Spec.PDGroupLabel = k
		probs := nameProblems(m)
		if len(probs) == 0 || !strings.Contains(strings.Join(probs, ";"), "pdGroupLabel") {
			t.Errorf("pdGroupLabel %q (a controller label): problems %q", k, probs)
		}
	}
	for _, k := range []string{v1alpha1.DefaultPDGroupLabel, "example.com/pd", "pd"} {
		m := testMD(1, "", role("d", 1, 1))
		m.Spec.PDGroupLabel = k
		if probs := nameProblems(m); probs != nil {
			t.Errorf("pdGroupLabel %q: problems %q", k, probs)
		}
	}
}

// TestRevisionCoversTheDeploymentSpec: every deployment field rendered into
// a pod is in the revision, so its edit rolls the pods (they kept the old
// model, P/D protocol, group label and sidecar, while the status said
// Complete): whenever an edit changes what buildPod makes, the revision
// changes and the plan replaces replicas within maxUnavailable.
func TestRevisionCoversTheDeploymentSpec(t *testing.T) {
	for _, c := range []struct {
		what string
		edit func(*v1alpha1.ModelDeployment)
	}{
		{"model", func(md *v1alpha1.ModelDeployment) { md.Spec.Model = "m2" }},
		{"engine", func(md *v1alpha1.ModelDeployment) { md.Spec.Engine = v1alpha1.EngineSGLang }},
		{"pdGroupLabel", func(md *v1alpha1.ModelDeployment) { md.Spec.PDGroupLabel = "example.com/pd" }},
		{"sidecar mode", func(md *v1alpha1.ModelDeployment) { md.Spec.Sidecar.Mode = v1alpha1.SidecarDaemonSet }},
		{"leader template", func(md *v1alpha1.ModelDeployment) { md.Spec.Roles[0].Template.Spec.Containers[0].Image = "v2" }},
		{"workers", func(md *v1alpha1.ModelDeployment) { md.Spec.Roles[0].Workers.Count = 2 }},
	} {
		md := testMD(1, "", role("d", 3, 1))
		pods := existing(md)
		before := buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, 0})
		edited := md.DeepCopy()
		c.edit(edited)
		after := buildPod(edited, &edited.Spec.Roles[0], slot{0, "d", 0, 0})
		delete(before.Labels, v1alpha1.LabelRevision)
		delete(after.Labels, v1alpha1.LabelRevision)
		if equality.Semantic.DeepEqual(before, after) {
			t.Fatalf("%s: the edit changes no pod", c.what)
		}
		if revision(md, &md.Spec.Roles[0]) == revision(edited, &edited.Spec.Roles[0]) {
			t.Errorf("%s: the pods change, the revision does not", c.what)
			continue
		}
		del, create, _ := names(computePlan(edited, pods))
		if !slices.Equal(del, []string{"m-0-d-2", "m-0-d-2-w1"}) || len(create) != 0 {
			t.Errorf("%s: plan deletes %v creates %v, want replica 2 rolled (maxUnavailable 1)", c.what, del, create)
		}
		if st := computeStatus(edited, pods, v1alpha1.ModelDeploymentStatus{}, nil, nil, nil); st.Roles[0].UpdatedReplicas != 0 {
			t.Errorf("%s: %d updated replicas, want 0", c.what, st.Roles[0].UpdatedReplicas)
		}
	}
	// The defaults are what a pod is made from: an explicit default is no edit.
	md := testMD(1, "", role("d", 1, 0))
	explicit := md.DeepCopy()
	explicit.Spec.PDGroupLabel, explicit.Spec.Sidecar.Mode = v1alpha1.DefaultPDGroupLabel, v1alpha1.SidecarInjected
	if revision(md, &md.Spec.Roles[0]) != revision(explicit, &explicit.Spec.Roles[0]) {
		t.Error("explicit defaults change the revision")
	}
}

// without drops the named pods; with replaces or adds the given ones.
func without(pods []*corev1.Pod, names ...string) []*corev1.Pod {
	var out []*corev1.Pod
	for _, p := range pods {
		if !slices.Contains(names, p.Name) {
			out = append(out, p)
		}
	}
	return out
}

func ready(p *corev1.Pod) *corev1.Pod {
	p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
	return p
}

// TestWorkersCountRollsWithinMaxUnavailable: a changed workers.count is
// applied by replacing whole replicas within rollout.maxUnavailable. Raising
// it added a -w2 slot to every replica, each then counted unavailable, so
// all were deleted at once; lowering it deleted every replica's -w2 at once.
func TestWorkersCountRollsWithinMaxUnavailable(t *testing.T) {
	md := testMD(1, "", role("d", 5, 1))
	md.Spec.Roles[0].Rollout.MaxUnavailable = i32(2)
	pods := existing(md) // one worker each, ready

	up := md.DeepCopy()
	up.Spec.Roles[0].Workers.Count = 2
	del, create, _ := names(computePlan(up, pods))
	if want := []string{"m-0-d-3", "m-0-d-3-w1", "m-0-d-4", "m-0-d-4-w1"}; !slices.Equal(del, want) || len(create) != 0 {
		t.Errorf("count 1 -> 2: delete %v (want %v), create %v (want none)", del, want, create)
	}
	st := computeStatus(up, pods, v1alpha1.ModelDeploymentStatus{}, nil, nil, nil)
	if st.Roles[0].ReadyReplicas != 5 || st.ReadyGroups != 1 || st.Roles[0].UpdatedReplicas != 0 {
		t.Errorf("count 1 -> 2 before any replacement: status %+v, want 5 ready, 0 updated", st.Roles[0])
	}
	// Replicas 3 and 4 gone: they come back whole at the new count, and
	// no other replica is touched (two are unavailable).
	next := without(pods, "m-0-d-3", "m-0-d-3-w1", "m-0-d-4", "m-0-d-4-w1")
	del, create, _ = names(computePlan(up, next))
	if want := []string{"m-0-d-3", "m-0-d-3-w1", "m-0-d-3-w2", "m-0-d-4", "m-0-d-4-w1", "m-0-d-4-w2"}; len(del) != 0 || !slices.Equal(create, want) {
		t.Errorf("count 1 -> 2, second step: delete %v create %v (want %v)", del, create, want)
	}
	// An outdated replica that lost a member it had is still unavailable
	// and replaced at no cost, beside one within the budget (1 left).
	del, _, _ = names(computePlan(up, without(pods, "m-0-d-0-w1")))
	if want := []string{"m-0-d-0", "m-0-d-4", "m-0-d-4-w1"}; !slices.Equal(del, want) {
		t.Errorf("count 1 -> 2, replica 0 lost its worker: delete %v, want %v", del, want)
	}

	down := testMD(1, "", role("d", 5, 2))
	down.Spec.Roles[0].Rollout.MaxUnavailable = i32(2)
	pods = existing(down) // two workers each
	down.Spec.Roles[0].Workers.Count = 1
	del, create, _ = names(computePlan(down, pods))
	if want := []string{"m-0-d-3", "m-0-d-3-w1", "m-0-d-3-w2", "m-0-d-4", "m-0-d-4-w1", "m-0-d-4-w2"}; !slices.Equal(del, want) || len(create) != 0 {
		t.Errorf("count 2 -> 1: delete %v (want %v), create %v", del, want, create)
	}
	// Rolled back before the rollout ends: the replicas left are current again.
	down.Spec.Roles[0].Workers.Count = 2
	if del, create, _ := names(computePlan(down, pods)); len(del)+len(create) != 0 {
		t.Errorf("count back to 2: delete %v create %v", del, create)
	}
}

// TestPartitionKeepsReplicasWhole: below rollout.partition an outdated
// replica is kept, but one that lost a pod is replaced whole at the current
// revision (the old template is kept nowhere), never completed with a member
// of the current one; the status counts a replica as updated only when all
// of its members are.
func TestPartitionKeepsReplicasWhole(t *testing.T) {
	md := testMD(1, "", role("d", 5, 1))
	old := existing(md)
	md.Spec.Roles[0].Template.Spec.Containers[0].Image = "v2"
	md.Spec.Roles[0].Rollout.Partition = i32(3)
	updated := existing(md)
	var pods []*corev1.Pod // replicas 0-2 old, 3-4 updated
	for i, p := range old {
		if s, _ := slotOf(p); s.Replica >= 3 {
			p = updated[i]
		}
		pods = append(pods, p)
	}
	st := computeStatus(md, pods, v1alpha1.ModelDeploymentStatus{}, nil, nil, nil)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgressing); st.Roles[0].UpdatedReplicas != 2 || c.Reason != reasonPartitionHeld {
		t.Fatalf("partition held: updated %d, %s", st.Roles[0].UpdatedReplicas, c.Reason)
	}
	if del, create, _ := names(computePlan(md, pods)); len(del)+len(create) != 0 {
		t.Fatalf("partition held: delete %v create %v", del, create)
	}

	// Replica 0 loses its leader: its worker goes too, nothing is created
	// from the new template beside it.
	lost := without(pods, "m-0-d-0")
	del, create, _ := names(computePlan(md, lost))
	if !slices.Equal(del, []string{"m-0-d-0-w1"}) || len(create) != 0 {
		t.Errorf("leader below the partition lost: delete %v create %v, want its worker deleted, nothing created", del, create)
	}
	// Then the replica comes back whole, at the current revision.
	_, create, _ = names(computePlan(md, without(pods, "m-0-d-0", "m-0-d-0-w1")))
	if !slices.Equal(create, []string{"m-0-d-0", "m-0-d-0-w1"}) {
		t.Errorf("replica 0 gone: create %v", create)
	}
	// A worker going away (deleted, terminating): the same.
	term := without(pods)
	for i, p := range term {
		if p.Name == "m-0-d-1-w1" {
			p = p.DeepCopy()
			p.DeletionTimestamp = &metav1.Time{}
			term[i] = p
		}
	}
	if del, create, _ := names(computePlan(md, term)); !slices.Equal(del, []string{"m-0-d-1"}) || len(create) != 0 {
		t.Errorf("worker below the partition terminating: delete %v create %v", del, create)
	}

	// A replica an older controller left mixed (leader at the new revision,
	// worker at the old one) is not counted as updated, nor held: it is
	// replaced.
	mixed := without(pods, "m-0-d-0")
	mixed = append(mixed, ready(buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, 0})))
	st = computeStatus(md, mixed, v1alpha1.ModelDeploymentStatus{}, nil, nil, nil)
	if c := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionProgressing); st.Roles[0].UpdatedReplicas != 2 || c.Status != metav1.ConditionTrue {
		t.Errorf("mixed replica 0: updated %d, progressing %s (%s), want 2, True", st.Roles[0].UpdatedReplicas, c.Status, c.Reason)
	}
	if del, _, _ := names(computePlan(md, mixed)); !slices.Equal(del, []string{"m-0-d-0", "m-0-d-0-w1"}) {
		t.Errorf("mixed replica 0: delete %v", del)
	}
}
