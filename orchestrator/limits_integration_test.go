package orchestrator

import (
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/rest"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestLargeDeploymentInterrupted: at client-go's default rate limit (5 per
// second) the 1000 pods of 200 groups take minutes to create; deleting the
// deployment stops the creation at once (the step checks the cache before
// each pod), its pods are cleaned up and it goes. A deployment above
// MaxPods is refused (TooManyPods) and creates nothing.
func TestLargeDeploymentInterrupted(t *testing.T) {
	e := newEnv(t)
	slow := rest.CopyConfig(e.srv.Config)
	slow.QPS, slow.Burst = 5, 10
	e.startController(t, slow)
	const doc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"big"},
 "spec":{"model":"m","engine":"vllm","groups":200,"roles":[
  {"name":"a","kind":"mixed","replicas":5,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"huge"},
 "spec":{"model":"m","engine":"vllm","groups":1000,"roles":[
  {"name":"a","kind":"mixed","replicas":1000,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	big := labels.Set{v1alpha1.LabelDeployment: "big"}
	testutil.WaitFor(t, wait, "big's first pods and huge refused (TooManyPods)", func() bool {
		c := meta.FindStatusCondition(e.md(t, "huge").Status.Conditions, v1alpha1.ConditionProgressing)
		return len(e.pods(t, big)) >= 10 && c != nil && c.Status == metav1.ConditionFalse && c.Reason == reasonTooManyPods
	})
	if n := len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "huge"})); n != 0 {
		t.Errorf("huge has %d pods, want none", n)
	}
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	if err := mdc.Delete(e.ctx, "big", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	// Creating the other ~1000 pods first would take over 3 minutes.
	testutil.WaitFor(t, wait, "big and its pods gone", func() bool {
		_, err := mdc.Get(e.ctx, "big", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(e.pods(t, big)) == 0
	})
}
