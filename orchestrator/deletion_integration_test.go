package orchestrator

import (
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

const twoDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"two"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"a","kind":"mixed","replicas":2,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestOrphanDeletionKeepsChildren: a deployment deleted with propagation
// Orphan (kubectl delete --cascade=orphan) keeps its pods and RoleScaler:
// the controller drops its finalizer without deleting them, and leaves the
// orphan finalizer to the garbage collector (which does not run here).
func TestOrphanDeletionKeepsChildren(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, twoDoc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "two"}
	testutil.WaitFor(t, wait, "2 pods and the finalizer", func() bool {
		return len(e.pods(t, sel)) == 2 && slices.Contains(e.md(t, "two").Finalizers, Finalizer)
	})
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	orphan := metav1.DeletePropagationOrphan
	if err := mdc.Delete(e.ctx, "two", metav1.DeleteOptions{PropagationPolicy: &orphan}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the controller's finalizer dropped, the orphan one left, an Orphaned event", func() bool {
		fin := e.md(t, "two").Finalizers
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return !slices.Contains(fin, Finalizer) && slices.Contains(fin, metav1.FinalizerOrphanDependents) && err == nil &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return ev.Reason == "Orphaned" })
	})
	pods := e.pods(t, sel)
	if n := count(pods, func(p *corev1.Pod) bool { return p.DeletionTimestamp == nil }); n != 2 {
		t.Errorf("%d of %d pods left undeleted, want 2", n, len(pods))
	}
	if _, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, "two-a", metav1.GetOptions{}); err != nil {
		t.Errorf("RoleScaler two-a: %v", err)
	}
	// Play the garbage collector's last step so the namespace can go.
	if _, err := mdc.Patch(e.ctx, "two", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

// TestRelabelledPodReleased: a pod relabelled away from its deployment
// (kubectl label pod two-0-a-0 kvmesh.io/deployment-) is released as a
// ReplicaSet releases one: the owner reference goes, with a Warning event,
// and it stays when the deployment goes. Its name holds the slot until it
// is deleted; then the slot is created again, and the deployment cleans up.
func TestRelabelledPodReleased(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, twoDoc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "two"}
	testutil.WaitFor(t, wait, "2 pods", func() bool { return len(e.pods(t, sel)) == 2 })
	pods := e.kube.CoreV1().Pods(e.ns)
	const name = "two-0-a-0"
	if _, err := pods.Patch(e.ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"kvmesh.io/deployment":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, name+" released with a PodReleased event", func() bool {
		p, err := pods.Get(e.ctx, name, metav1.GetOptions{})
		evs, eerr := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && len(p.OwnerReferences) == 0 && eerr == nil &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return ev.Type == corev1.EventTypeWarning && ev.Reason == "PodReleased" })
	})
	if err := pods.Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	md := e.md(t, "two")
	testutil.WaitFor(t, wait, name+" created again, the deployment's", func() bool {
		p, err := pods.Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && p.Labels[v1alpha1.LabelDeployment] == "two" && metav1.IsControlledBy(p, md)
	})
	// Released again, then the deployment goes: the released pod stays.
	if _, err := pods.Patch(e.ctx, name, types.MergePatchType, []byte(`{"metadata":{"labels":{"kvmesh.io/deployment":null}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, name+" released again", func() bool {
		p, err := pods.Get(e.ctx, name, metav1.GetOptions{})
		return err == nil && len(p.OwnerReferences) == 0
	})
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	if err := mdc.Delete(e.ctx, "two", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the deployment and its labelled pod gone", func() bool {
		_, err := mdc.Get(e.ctx, "two", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(e.pods(t, sel)) == 0
	})
	if _, err := pods.Get(e.ctx, name, metav1.GetOptions{}); err != nil {
		t.Errorf("the released pod went with the deployment: %v", err)
	}
}
