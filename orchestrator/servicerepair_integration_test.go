package orchestrator

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestServiceEditedIsSetBack: the deployment's headless Service with its
// selector changed by hand (and, once, its deployment label removed, which
// takes it out of the controller's cache) is set back, with a
// ServiceRepaired event. Before, an owned Service was only checked to exist:
// every pod's DNS name stopped resolving and nothing said so (k8s tester).
func TestServiceEditedIsSetBack(t *testing.T) {
	e := newEnv(t)
	ctrl := e.newTestController(t, e.srv.Config, "a", nil)
	testutil.Run(t, "controller", ctrl.Run, nil)
	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "svcfix")); err != nil {
		t.Fatal(err)
	}
	svcs := e.kube.CoreV1().Services(e.ns)
	ours := func() (*corev1.Service, bool) {
		svc, err := svcs.Get(e.ctx, "svcfix", metav1.GetOptions{})
		return svc, err == nil && svc.Spec.Selector[v1alpha1.LabelDeployment] == "svcfix" && len(svc.Spec.Selector) == 1 &&
			svc.Labels[v1alpha1.LabelDeployment] == "svcfix" && svc.Spec.PublishNotReadyAddresses
	}
	testutil.WaitFor(t, wait, "the deployment's Service", func() bool { _, ok := ours(); return ok })
	for _, patch := range []string{
		`{"spec":{"selector":{"kvmesh.io/deployment":"other"}}}`,
		`{"metadata":{"labels":{"kvmesh.io/deployment":null}},"spec":{"selector":{"app":"x"},"publishNotReadyAddresses":false}}`,
	} {
		if _, err := svcs.Patch(e.ctx, "svcfix", types.StrategicMergePatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Fatal(err)
		}
		if _, ok := ours(); ok {
			t.Fatalf("patch %s changed nothing", patch)
		}
		testutil.WaitFor(t, wait, "the Service set back after "+patch, func() bool { _, ok := ours(); return ok })
	}
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var n int32
	for _, ev := range evs.Items {
		if ev.Reason == "ServiceRepaired" {
			n += ev.Count
		}
	}
	if n < 1 {
		t.Errorf("no ServiceRepaired event")
	}
}
