package orchestrator

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

const ownDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"own"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"a","kind":"mixed","replicas":4,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}},
  {"name":"b","kind":"mixed","replicas":2,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// userScaler creates a RoleScaler no deployment owns.
func (e *env) userScaler(t *testing.T, name, deployment, role string, replicas int64) *unstructured.Unstructured {
	t.Helper()
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": v1alpha1.SchemeGroupVersion.String(), "kind": "RoleScaler",
		"metadata": map[string]any{"name": name},
		"spec":     map[string]any{"deployment": deployment, "role": role, "replicas": replicas},
	}}
	out, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Create(e.ctx, u, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// userPod creates a pod no deployment owns with the given labels and phase.
func (e *env) userPod(t *testing.T, name string, l map[string]string, phase corev1.PodPhase) {
	t.Helper()
	p, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "user:v1"}}}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if phase != "" {
		p.Status.Phase = phase
		if _, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestForeignObjectsLeftAlone: RoleScalers and pods that carry a
// deployment's names but that it does not control are never driven,
// written, counted or deleted. A user's RoleScaler naming role a does not
// scale it; one holding role b's RoleScaler name is reported
// (RoleScalerConflict, condition and Warning event) and role b keeps the
// deployment's replicas; pods labelled as the deployment's (a stray, one
// above the replicas, a failed one in a real slot) stay, and the
// deployment's own pods are created beside them; the deployment's own
// RoleScaler scales role a; deleting the deployment leaves every user object.
func TestForeignObjectsLeftAlone(t *testing.T) {
	e := newEnv(t)
	unrelated := e.userScaler(t, "unrelated-name", "own", "a", 1)
	holder := e.userScaler(t, "own-b", "own", "b", 5)
	slotLabels := func(role, replica string) map[string]string {
		return map[string]string{v1alpha1.LabelDeployment: "own", v1alpha1.LabelGroup: "0", v1alpha1.LabelRole: role,
			v1alpha1.LabelReplica: replica, v1alpha1.LabelWorker: "0"}
	}
	userPods := []string{"user-stray", "user-above", "user-failed"}
	e.userPod(t, "user-stray", map[string]string{v1alpha1.LabelDeployment: "own"}, "")
	e.userPod(t, "user-above", slotLabels("a", "7"), "")
	e.userPod(t, "user-failed", slotLabels("a", "0"), corev1.PodFailed)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, ownDoc); err != nil {
		t.Fatal(err)
	}

	owned := func() (a, b int) {
		for _, p := range e.pods(t, labels.Set{v1alpha1.LabelDeployment: "own"}) {
			if len(p.OwnerReferences) == 1 && p.OwnerReferences[0].Kind == "ModelDeployment" {
				switch p.Labels[v1alpha1.LabelRole] {
				case "a":
					a++
				case "b":
					b++
				}
			}
		}
		return a, b
	}
	testutil.WaitFor(t, wait, "4 + 2 pods of the deployment's own, counted in its status, the conflict and a Warning event", func() bool {
		a, b := owned()
		st := e.md(t, "own").Status
		cond := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRoleScalerConflict)
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return a == 4 && b == 2 && len(st.Roles) == 2 && st.Roles[0].Replicas == 4 && st.Roles[1].Replicas == 2 &&
			cond != nil && cond.Status == metav1.ConditionTrue && err == nil &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
				return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonRoleScalerConflict
			})
	})
	md := e.md(t, "own")
	if *md.Spec.Roles[0].Replicas != 4 || *md.Spec.Roles[1].Replicas != 2 {
		t.Errorf("roles at %d and %d replicas, want 4 and 2 (the users' RoleScalers drove them)", *md.Spec.Roles[0].Replicas, *md.Spec.Roles[1].Replicas)
	}
	rs := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns)
	for _, want := range []*unstructured.Unstructured{unrelated, holder} {
		got, err := rs.Get(e.ctx, want.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatalf("user's RoleScaler %s: %v", want.GetName(), err)
		}
		if got.GetResourceVersion() != want.GetResourceVersion() {
			t.Errorf("user's RoleScaler %s was written: %v", want.GetName(), got.Object)
		}
	}
	mine, err := rs.Get(e.ctx, "own-a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if refs := mine.GetOwnerReferences(); len(refs) != 1 || refs[0].UID != md.UID {
		t.Errorf("own-a owners %v", refs)
	}
	podsLeft := func() {
		t.Helper()
		for _, n := range userPods {
			p, err := e.kube.CoreV1().Pods(e.ns).Get(e.ctx, n, metav1.GetOptions{})
			if err != nil || p.DeletionTimestamp != nil {
				t.Errorf("user's pod %s deleted: %v", n, err)
			}
		}
	}
	podsLeft()

	// The deployment's own RoleScaler drives role a.
	e.setScale(t, rs, "own-a", 3)
	testutil.WaitFor(t, wait, "role a at 3 through own-a", func() bool {
		a, _ := owned()
		return *e.md(t, "own").Spec.Roles[0].Replicas == 3 && a == 3
	})

	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	if err := mdc.Delete(e.ctx, "own", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the deployment, its pods and own-a gone", func() bool {
		_, err := mdc.Get(e.ctx, "own", metav1.GetOptions{})
		_, aErr := rs.Get(e.ctx, "own-a", metav1.GetOptions{})
		a, b := owned()
		return apierrors.IsNotFound(err) && apierrors.IsNotFound(aErr) && a+b == 0
	})
	for _, n := range []string{"unrelated-name", "own-b"} {
		if _, err := rs.Get(e.ctx, n, metav1.GetOptions{}); err != nil {
			t.Errorf("user's RoleScaler %s deleted with the deployment: %v", n, err)
		}
	}
	podsLeft()
}

// TestTemplateThatDoesNotDecode: a role template the schema admits (it keeps
// a template's unknown fields) but that is no pod template turns Available
// and Progressing False (InvalidTemplate) with a Warning event; the
// deployment's pods stay as they were, and deleting it still deletes them and
// releases the finalizer.
func TestTemplateThatDoesNotDecode(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	const doc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"tmpl"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"a","kind":"mixed","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "tmpl"}
	testutil.WaitFor(t, wait, "the pod and the finalizer", func() bool {
		return len(e.pods(t, sel)) == 1 && slices.Contains(e.md(t, "tmpl").Finalizers, Finalizer)
	})
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	patch := []byte(`[{"op":"replace","path":"/spec/roles/0/template/spec/containers","value":"notalist"}]`)
	if _, err := mdc.Patch(e.ctx, "tmpl", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "Available and Progressing False (InvalidTemplate) and a Warning event", func() bool {
		u, err := mdc.Get(e.ctx, "tmpl", metav1.GetOptions{})
		if err != nil {
			return false
		}
		var st v1alpha1.ModelDeploymentStatus
		if s, ok := u.Object["status"].(map[string]any); !ok || runtime.DefaultUnstructuredConverter.FromUnstructured(s, &st) != nil {
			return false
		}
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		for _, ct := range []string{v1alpha1.ConditionAvailable, v1alpha1.ConditionProgressing} {
			if c := meta.FindStatusCondition(st.Conditions, ct); c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonInvalidTemplate {
				return false
			}
		}
		return st.ObservedGeneration == u.GetGeneration() && err == nil && slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
			return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonInvalidTemplate
		})
	})
	if n := len(e.pods(t, sel)); n != 1 {
		t.Errorf("%d pods after the template broke, want the 1 as it was", n)
	}
	if err := mdc.Delete(e.ctx, "tmpl", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the deployment and its pod gone", func() bool {
		_, err := mdc.Get(e.ctx, "tmpl", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(e.pods(t, sel)) == 0
	})
}
