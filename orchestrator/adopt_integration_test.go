package orchestrator

import (
	"errors"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

func engineTemplate(app, roleKind string) corev1.PodTemplateSpec {
	return corev1.PodTemplateSpec{
		ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": app, v1alpha1.LabelRoleKind: roleKind}},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "engine:v1"}}},
	}
}

// enginePod plays the workload controller (kube-controller-manager does not
// run here): a pod the workload's selector selects.
func (e *env) enginePod(t *testing.T, name, app, roleKind string) {
	t.Helper()
	if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, podFrom(name, engineTemplate(app, roleKind)), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

func podFrom(name string, tpl corev1.PodTemplateSpec) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: tpl.Labels}, Spec: tpl.Spec}
}

func (e *env) policy(t *testing.T, name string) *v1alpha1.AutoscalingPolicy {
	t.Helper()
	u, err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ap := &v1alpha1.AutoscalingPolicy{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, ap); err != nil {
		t.Fatal(err)
	}
	return ap
}

func (e *env) applyDoc(t *testing.T, doc string) error {
	t.Helper()
	objs, err := kubetest.Decode(stringsReader(doc))
	if err != nil {
		t.Fatal(err)
	}
	return kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...)
}

const adoptDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"adopt"},
 "spec":{"stableWindowSeconds":1,"panicWindowSeconds":1,"scaleDownCooldownSeconds":0,"prometheus":{"address":"PROM"},
  "roles":[
   {"name":"prefill","minReplicas":1,"maxReplicas":8,
    "workload":{"kind":"Deployment","selector":{"matchLabels":{"kvmesh.io/role-kind":"prefill","tier":"llm"}}},
    "metrics":[{"name":"prefillQueueTokens","target":1000,"source":"prometheus","query":"sum(prefill_queue_tokens)"}]},
   {"name":"decode","minReplicas":1,"maxReplicas":8,
    "workload":{"kind":"StatefulSet","selector":{"matchLabels":{"kvmesh.io/role-kind":"decode","tier":"llm"}}},
    "metrics":[{"name":"waitingRequests","target":10}]}]}}`

// TestAdoptExistingWorkloads: a plain Deployment (prefill) and StatefulSet
// (decode), labelled by role kind, are adopted by an AutoscalingPolicy's
// selectors. Decode's load comes from the mesh (a sidecar gossips 40 waiting
// requests on the StatefulSet's pod; target 10), prefill's from a Prometheus
// stand-in (3000 queued prefill tokens; target 1000): each workload's /scale
// goes to what the recommendation asks (4 and 3), and the status names the
// workloads. Malformed targets end as a ScalingActive=False condition.
func TestAdoptExistingWorkloads(t *testing.T) {
	e := newEnv(t)
	prom := newPromStandIn(t)
	prom.setVector("sum(prefill_queue_tokens)", 3000)
	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	side := gossipNode(t, "sidecar", gossip.RoleSidecar, orch.Addr())

	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "llm-prefill", Labels: map[string]string{v1alpha1.LabelRoleKind: "prefill", "tier": "llm"}},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llm-prefill"}},
			Template: engineTemplate("llm-prefill", "prefill")},
	}
	sts := &appsv1.StatefulSet{
		ObjectMeta: metav1.ObjectMeta{Name: "llm-decode", Labels: map[string]string{v1alpha1.LabelRoleKind: "decode", "tier": "llm"}},
		Spec: appsv1.StatefulSetSpec{Replicas: &one, ServiceName: "llm-decode", Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llm-decode"}},
			Template: engineTemplate("llm-decode", "decode")},
	}
	if _, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.kube.AppsV1().StatefulSets(e.ns).Create(e.ctx, sts, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.enginePod(t, "llm-prefill-7d9f-abcde", "llm-prefill", "prefill")
	e.enginePod(t, "llm-decode-0", "llm-decode", "decode")
	side.SetEngine(gossip.EngineState{ID: "llm-decode-0", Model: "m", EngineRole: "decode", Waiting: 40, Running: 8})
	side.SetEngine(gossip.EngineState{ID: "llm-prefill-7d9f-abcde", Model: "m", EngineRole: "prefill"})
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to see both engines", func() bool { return len(orch.Engines()) == 2 })

	e.startAutoscaler(t, orch)

	if err := e.applyDoc(t, replaceAll(adoptDoc, "PROM", prom.srv.URL)); err != nil {
		t.Fatal(err)
	}
	scales := func() (int32, int32) {
		d, err1 := e.kube.AppsV1().Deployments(e.ns).GetScale(e.ctx, "llm-prefill", metav1.GetOptions{})
		s, err2 := e.kube.AppsV1().StatefulSets(e.ns).GetScale(e.ctx, "llm-decode", metav1.GetOptions{})
		if err := errors.Join(err1, err2); err != nil {
			t.Fatal(err)
		}
		return d.Spec.Replicas, s.Spec.Replicas
	}
	testutil.WaitFor(t, wait, "prefill Deployment at 3 and decode StatefulSet at 4 through /scale", func() bool {
		p, d := scales()
		return p == 3 && d == 4
	})
	var ap *v1alpha1.AutoscalingPolicy
	testutil.WaitFor(t, wait, "the policy's status to name the adopted workloads", func() bool {
		ap = e.policy(t, "adopt")
		return len(ap.Status.Roles) == 2 && ap.Status.Roles[0].Workload == "Deployment/llm-prefill" &&
			ap.Status.Roles[1].Workload == "StatefulSet/llm-decode" && conditionTrue(ap.Status.Conditions, v1alpha1.ConditionScalingActive) &&
			conditionTrue(ap.Status.Conditions, v1alpha1.ConditionMetricsAvailable)
	})

	// Load gone: both come back to their minimum.
	prom.setVector("sum(prefill_queue_tokens)")
	side.SetEngine(gossip.EngineState{ID: "llm-decode-0", Model: "m", EngineRole: "decode"})
	testutil.WaitFor(t, wait, "both workloads back at 1", func() bool {
		p, d := scales()
		return p == 1 && d == 1
	})
	testutil.WaitFor(t, wait, "a Scaled event on the policy naming a workload", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=adopt,reason=Scaled"})
		return err == nil && len(evs.Items) > 0 && strings.Contains(evs.Items[0].Message, "(")
	})

	// Malformed targets: each ends as ScalingActive=False with its reason.
	bad := map[string]string{
		"InvalidTarget":           `{"kind":"Deployment","selector":{"matchExpressions":[{"key":"tier","operator":"In","values":[]}]}}`,
		"TargetNotFound":          `{"kind":"StatefulSet","selector":{"matchLabels":{"tier":"nothing"}}}`,
		"WorkloadKindUnavailable": `{"kind":"LeaderWorkerSet","name":"lws"}`,
	}
	// A second prefill Deployment outside the good policy's selector (tier).
	extra := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: "llm-prefill-b", Labels: map[string]string{v1alpha1.LabelRoleKind: "prefill", "tier": "batch"}}, Spec: dep.Spec}
	if _, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, extra, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	bad["AmbiguousTarget"] = `{"kind":"Deployment","selector":{"matchLabels":{"kvmesh.io/role-kind":"prefill"}}}`
	for reason, w := range bad {
		name := "bad-" + lower(reason)
		doc := `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"` + name + `"},
		 "spec":{"roles":[{"name":"r","minReplicas":1,"maxReplicas":2,"workload":` + w + `}]}}`
		if err := e.applyDoc(t, doc); err != nil {
			t.Fatalf("%s: %v", reason, err)
		}
		testutil.WaitFor(t, wait, name+": ScalingActive False, reason "+reason, func() bool {
			c := meta.FindStatusCondition(e.policy(t, name).Status.Conditions, v1alpha1.ConditionScalingActive)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reason
		})
	}
	// The good policy kept working beside the bad ones.
	if p, d := scales(); p != 1 || d != 1 || !conditionTrue(e.policy(t, "adopt").Status.Conditions, v1alpha1.ConditionScalingActive) {
		t.Errorf("adopted workloads moved to %d/%d or the policy stopped: %+v", p, d, e.policy(t, "adopt").Status.Conditions)
	}
}

// TestAdoptionSchema: the API server rejects a policy that mixes a target
// ModelDeployment with workloads, a role without a workload in the adoption
// mode, and a workload with both a name and a selector.
func TestAdoptionSchema(t *testing.T) {
	e := newEnv(t)
	for name, spec := range map[string]string{
		"target and workload":   `{"target":"md","roles":[{"name":"r","minReplicas":1,"maxReplicas":2,"workload":{"kind":"Deployment","name":"x"}}]}`,
		"no target no workload": `{"roles":[{"name":"r","minReplicas":1,"maxReplicas":2}]}`,
		"name and selector":     `{"roles":[{"name":"r","minReplicas":1,"maxReplicas":2,"workload":{"kind":"Deployment","name":"x","selector":{"matchLabels":{"a":"b"}}}}]}`,
		"unknown kind":          `{"roles":[{"name":"r","minReplicas":1,"maxReplicas":2,"workload":{"kind":"DaemonSet","name":"x"}}]}`,
		"bad prometheus":        `{"target":"md","prometheus":{"address":"prom:9090"},"roles":[{"name":"r","minReplicas":1,"maxReplicas":2}]}`,
	} {
		err := e.applyDoc(t, `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"s"},"spec":`+spec+`}`)
		if err == nil || !apierrors.IsInvalid(errors.Unwrap(err)) {
			t.Errorf("%s: got %v, want Invalid", name, err)
		}
	}
}
