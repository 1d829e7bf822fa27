package orchestrator

import (
	"slices"
	"strconv"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

func i32(v int32) *int32 { return &v }

func testMD(groups int32, policy v1alpha1.RecoveryPolicy, roles ...v1alpha1.Role) *v1alpha1.ModelDeployment {
	md := &v1alpha1.ModelDeployment{ObjectMeta: metav1.ObjectMeta{Name: "m", Namespace: "ns"},
		Spec: v1alpha1.ModelDeploymentSpec{Model: "x", Engine: v1alpha1.EngineVLLM, Groups: &groups, RecoveryPolicy: policy, Roles: roles}}
	md.Defaults()
	return md
}

func role(name string, replicas int32, workers int32) v1alpha1.Role {
	r := v1alpha1.Role{Name: name, Kind: v1alpha1.RoleDecode, Replicas: &replicas,
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "e", Image: "v1"}}}}}
	if workers > 0 {
		r.Workers = &v1alpha1.Workers{Count: workers, Template: r.Template}
	}
	return r
}

// existing builds the pods of md as the controller would, all ready.
func existing(md *v1alpha1.ModelDeployment) []*corev1.Pod {
	var out []*corev1.Pod
	for g := range int(*md.Spec.Groups) {
		for i := range md.Spec.Roles {
			r := &md.Spec.Roles[i]
			for rep := range int(*r.Replicas) {
				for m := range members(r) {
					p := buildPod(md, r, slot{g, r.Name, rep, m})
					p.UID = types.UID("uid-" + p.Name)
					p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}}
					out = append(out, p)
				}
			}
		}
	}
	return out
}

func names(p *plan) (del, create, gang []string) {
	for _, d := range p.Delete {
		del = append(del, d.Pod.Name)
	}
	for _, s := range p.Create {
		create = append(create, podName("m", s))
	}
	for _, ss := range p.Gang {
		for _, s := range ss {
			gang = append(gang, podName("m", s))
		}
	}
	slices.Sort(create)
	slices.Sort(gang)
	return
}

func TestPlanNewGroupIsAGang(t *testing.T) {
	r := role("d", 3, 1)
	r.GangMinimum = i32(2)
	md := testMD(1, v1alpha1.RecoverRole, r)
	del, create, gang := names(computePlan(md, nil))
	if len(del) != 0 || !slices.Equal(create, []string{"m-0-d-2", "m-0-d-2-w1"}) ||
		!slices.Equal(gang, []string{"m-0-d-0", "m-0-d-0-w1", "m-0-d-1", "m-0-d-1-w1"}) {
		t.Fatalf("delete %v create %v gang %v", del, create, gang)
	}
}

func TestPlanSteadyStateIsEmpty(t *testing.T) {
	md := testMD(2, v1alpha1.RecoverRole, role("p", 1, 0), role("d", 2, 1))
	p := computePlan(md, existing(md))
	if len(p.Delete)+len(p.Create)+len(p.Gang) != 0 {
		t.Fatalf("plan for a converged deployment: %+v", p)
	}
}

func TestPlanScaleDown(t *testing.T) {
	md := testMD(2, v1alpha1.RecoverRole, role("p", 1, 0), role("d", 2, 1))
	pods := existing(md)
	md.Spec.Groups = i32(1)
	md.Spec.Roles[1].Replicas = i32(1)
	del, create, _ := names(computePlan(md, pods))
	want := []string{"m-0-d-1", "m-0-d-1-w1", "m-1-d-0", "m-1-d-0-w1", "m-1-d-1", "m-1-d-1-w1", "m-1-p-0"}
	if !slices.Equal(del, want) || len(create) != 0 {
		t.Fatalf("delete %v (want %v) create %v", del, want, create)
	}
}

func TestPlanRecovery(t *testing.T) {
	cases := []struct {
		policy v1alpha1.RecoveryPolicy
		want   []string
	}{
		{v1alpha1.RecoverNone, []string{"m-0-d-1-w1"}},
		{v1alpha1.RecoverRole, []string{"m-0-d-1", "m-0-d-1-w1"}},
		{v1alpha1.RecoverGroup, []string{"m-0-d-0", "m-0-d-0-w1", "m-0-d-1", "m-0-d-1-w1", "m-0-p-0"}},
	}
	for _, c := range cases {
		md := testMD(2, c.policy, role("p", 1, 0), role("d", 2, 1))
		pods := existing(md)
		for _, p := range pods {
			if p.Name == "m-0-d-1-w1" {
				p.Status.Phase = corev1.PodFailed
			}
		}
		del, _, _ := names(computePlan(md, pods))
		if !slices.Equal(del, c.want) {
			t.Errorf("%s: delete %v, want %v", c.policy, del, c.want)
		}
	}
}

// A replica that lost a member after the controller saw it whole and
// Running (its members marked complete) is recovered as a failed one is:
// under RecoverRole its other members go too and the replica is made again
// whole; RecoverGroup the group; RecoverNone makes the member alone. A
// replica never whole (a quota let only its leader in; a rollout or a
// recovery whose old member still terminates) gets its member created
// instead: judged from the pods there alone, it was recreated again and
// again. A whole Running replica's members are marked, once.
func TestPlanLostMember(t *testing.T) {
	pods := func(md *v1alpha1.ModelDeployment, drop string, mut func(*corev1.Pod)) []*corev1.Pod {
		var out []*corev1.Pod
		for _, p := range existing(md) {
			if p.Name == drop {
				continue
			}
			p.Status.Phase = corev1.PodRunning
			p.Annotations = map[string]string{v1alpha1.AnnotationReplicaComplete: "true"}
			if mut != nil {
				mut(p)
			}
			out = append(out, p)
		}
		return out
	}
	for _, c := range []struct {
		policy v1alpha1.RecoveryPolicy
		want   []string
	}{
		{v1alpha1.RecoverNone, nil},
		{v1alpha1.RecoverRole, []string{"m-0-d-1"}},
		{v1alpha1.RecoverGroup, []string{"m-0-d-0", "m-0-d-0-w1", "m-0-d-1", "m-0-p-0"}},
	} {
		md := testMD(2, c.policy, role("p", 1, 0), role("d", 2, 1))
		p := computePlan(md, pods(md, "m-0-d-1-w1", nil))
		del, create, _ := names(p)
		if !slices.Equal(del, c.want) {
			t.Errorf("%s: delete %v, want %v", c.policy, del, c.want)
		}
		if c.policy == v1alpha1.RecoverNone && !slices.Equal(create, []string{"m-0-d-1-w1"}) {
			t.Errorf("%s: create %v, want the lost member alone", c.policy, create)
		}
		if len(p.Complete) != 0 {
			t.Errorf("%s: marks %d pods already marked", c.policy, len(p.Complete))
		}
	}
	md := testMD(1, v1alpha1.RecoverRole, role("d", 2, 1))
	unmarked := func(p *corev1.Pod) { p.Annotations = nil }
	if del, create, _ := names(computePlan(md, pods(md, "m-0-d-1-w1", unmarked))); len(del) != 0 || !slices.Equal(create, []string{"m-0-d-1-w1"}) {
		t.Errorf("never whole (a quota let its leader in): delete %v create %v, want its member created", del, create)
	}
	now := metav1.Now()
	going := pods(md, "m-0-d-1-w1", func(p *corev1.Pod) {
		if p.Name == "m-0-d-1" {
			p.DeletionTimestamp = &now
		}
	})
	if del, _, _ := names(computePlan(md, going)); len(del) != 0 {
		t.Errorf("a replica going away: delete %v, want nothing more", del)
	}
	// A whole Running replica unmarked is marked; one with a member
	// Pending, or of another revision, is not.
	fresh := pods(md, "", unmarked)
	if p := computePlan(md, fresh); len(p.Complete) != 4 {
		t.Errorf("whole and Running: %d pods to mark, want 4", len(p.Complete))
	}
	fresh = pods(md, "", func(p *corev1.Pod) {
		p.Annotations = nil
		if p.Name == "m-0-d-1-w1" {
			p.Status.Phase = corev1.PodPending
		}
	})
	if p := computePlan(md, fresh); len(p.Complete) != 2 {
		t.Errorf("replica 1 not all Running: %d pods to mark, want replica 0's 2", len(p.Complete))
	}
	// A rollout: replica 1's new leader and worker run unmarked while the
	// old worker terminates, then is gone: its member is created, nothing
	// recovered.
	md.Spec.Roles[0].Template.Spec.Containers[0].Image = "v2"
	rolled := pods(md, "m-0-d-1-w1", func(p *corev1.Pod) {
		if p.Name == "m-0-d-1" {
			p.Annotations = nil
		}
	})
	for _, p := range rolled {
		if p.Name != "m-0-d-1" {
			p.Labels[v1alpha1.LabelRevision] = "old"
		}
	}
	if del, _, _ := names(computePlan(md, rolled)); slices.Contains(del, "m-0-d-1") {
		t.Errorf("a rollout's new leader, unmarked, deleted: %v", del)
	}
}

func TestPlanRolloutBudgetAndPartition(t *testing.T) {
	md := testMD(1, v1alpha1.RecoverRole, role("d", 5, 0))
	pods := existing(md)
	md.Spec.Roles[0].Template.Spec.Containers[0].Image = "v2"
	md.Spec.Roles[0].Rollout = v1alpha1.RolloutSpec{MaxUnavailable: i32(2), Partition: i32(1)}
	del, _, _ := names(computePlan(md, pods))
	if !slices.Equal(del, []string{"m-0-d-3", "m-0-d-4"}) {
		t.Fatalf("first step deletes %v, want the two highest", del)
	}
	// One replaced and not ready yet, one missing: no budget left.
	var next []*corev1.Pod
	for _, p := range pods {
		switch p.Name {
		case "m-0-d-4":
			n := buildPod(md, &md.Spec.Roles[0], slot{0, "d", 4, 0})
			next = append(next, n)
		case "m-0-d-3":
		default:
			next = append(next, p)
		}
	}
	p := computePlan(md, next)
	if del, create, _ := names(p); len(del) != 0 || !slices.Equal(create, []string{"m-0-d-3"}) {
		t.Fatalf("second step: delete %v create %v", del, create)
	}
	// Everything updated but replica 0 (below the partition): nothing to do.
	var done []*corev1.Pod
	for _, q := range existing(md) {
		if q.Name == "m-0-d-0" {
			q.Labels[v1alpha1.LabelRevision] = "old"
		}
		done = append(done, q)
	}
	if del, _, _ := names(computePlan(md, done)); len(del) != 0 {
		t.Fatalf("partition ignored: delete %v", del)
	}
}

func TestBuildPodWiresWorkers(t *testing.T) {
	md := testMD(1, v1alpha1.RecoverRole, role("d", 1, 2))
	p := buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, 2})
	env := map[string]string{}
	for _, e := range p.Spec.Containers[0].Env {
		env[e.Name] = e.Value
	}
	if env[EnvLeaderAddress] != "m-0-d-0.m.ns.svc" || env[EnvGroupSize] != "3" || env[EnvWorkerIndex] != "2" || env["LWS_LEADER_ADDRESS"] != env[EnvLeaderAddress] {
		t.Fatalf("worker env %v", env)
	}
	if p.Labels[v1alpha1.LabelInject] != "" || p.Spec.Subdomain != "m" || p.Labels[v1alpha1.LabelWorker] != strconv.Itoa(2) {
		t.Fatalf("worker labels %v subdomain %q", p.Labels, p.Spec.Subdomain)
	}
	if s, ok := slotOf(p); !ok || s != (slot{0, "d", 0, 2}) {
		t.Fatalf("slotOf = %v %v", s, ok)
	}
}

// TestBuildPodTellsTheWebhookPDWiring: an SGLang deployment's pods carry the
// P/D protocol, and a custom group label is named for the sidecar webhook.
func TestBuildPodTellsTheWebhookPDWiring(t *testing.T) {
	md := testMD(1, v1alpha1.RecoverRole, role("d", 1, 0))
	p := buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, 0})
	if _, ok := p.Annotations[AnnotationPDProtocol]; ok {
		t.Errorf("vLLM pod annotated with a P/D protocol: %v", p.Annotations)
	}
	if _, ok := p.Annotations[AnnotationPDGroupLabel]; ok {
		t.Errorf("default group label named: %v", p.Annotations)
	}
	md.Spec.Engine, md.Spec.PDGroupLabel = v1alpha1.EngineSGLang, "team/pairs"
	p = buildPod(md, &md.Spec.Roles[0], slot{0, "d", 0, 0})
	if p.Annotations[AnnotationPDProtocol] != "sglang" || p.Annotations[AnnotationPDGroupLabel] != "team/pairs" || p.Labels["team/pairs"] != "m-0" {
		t.Errorf("sglang pod with a custom group label: annotations %v labels %v", p.Annotations, p.Labels)
	}
}
