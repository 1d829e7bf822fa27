package manifests

import (
	"context"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"

	"github.com/kvmesh/kvmesh/internal/kubetest"
)

// TestHPATargetsHaveNoReplicas: a workload an HPA scales leaves .spec.replicas
// out of every kustomization, so a server-side re-apply (an upgrade) never
// conflicts with the HPA's writes to /scale.
func TestHPATargetsHaveNoReplicas(t *testing.T) {
	kc := kubectl(t)
	hpas := 0
	for _, dir := range kustomizations(t) {
		objs := render(t, kc, dir)
		for _, h := range objs {
			if h.GetKind() != "HorizontalPodAutoscaler" {
				continue
			}
			hpas++
			kind, _, _ := unstructured.NestedString(h.Object, "spec", "scaleTargetRef", "kind")
			name, _, _ := unstructured.NestedString(h.Object, "spec", "scaleTargetRef", "name")
			target := find(t, objs, kind, name)
			if r, ok, _ := unstructured.NestedFieldNoCopy(target.Object, "spec", "replicas"); ok {
				t.Errorf("%s: %s %s, which HPA %s scales, sets replicas: %v", dir, kind, name, h.GetName(), r)
			}
		}
	}
	if hpas == 0 {
		t.Fatal("no HPA rendered: the ingress's is gone")
	}
}

// TestIngressReapplyAfterHPAScale: the install applied, the HPA scales the
// ingress (kube-controller-manager writes /scale), and the same manifests
// applied again (the documented upgrade) succeed without --force-conflicts
// and keep the HPA's count.
func TestIngressReapplyAfterHPAScale(t *testing.T) {
	ctx, d, deps := ingressDeployment(t)
	apply := func() error {
		_, err := deps.Apply(ctx, d.GetName(), d, metav1.ApplyOptions{FieldManager: "kubectl"})
		return err
	}
	if err := apply(); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Patch(ctx, d.GetName(), types.MergePatchType, []byte(`{"spec":{"replicas":5}}`),
		metav1.PatchOptions{FieldManager: "kube-controller-manager"}, "scale"); err != nil {
		t.Fatal(err)
	}
	if err := apply(); err != nil {
		t.Fatalf("re-apply after the HPA scaled the ingress: %v", err)
	}
	got, err := deps.Get(ctx, d.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas"); r != 5 {
		t.Errorf("replicas after re-apply: %d, want the HPA's 5", r)
	}
}

// TestIngressReplicasHandoverToHPA: the upgrade from a manifest that set the
// ingress's replicas, as docs/INSTALL.md gives it: a field manager of its own
// applies only replicas, then the new manifest (without them) is applied and
// the count stays where it was instead of falling to the default 1.
func TestIngressReplicasHandoverToHPA(t *testing.T) {
	ctx, d, deps := ingressDeployment(t)
	ns := d.GetNamespace()
	old := d.DeepCopy()
	if err := unstructured.SetNestedField(old.Object, int64(2), "spec", "replicas"); err != nil {
		t.Fatal(err)
	}
	if _, err := deps.Apply(ctx, d.GetName(), old, metav1.ApplyOptions{FieldManager: "kubectl"}); err != nil {
		t.Fatal(err)
	}
	handover := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "apps/v1", "kind": "Deployment",
		"metadata": map[string]any{"name": d.GetName(), "namespace": ns},
		"spec":     map[string]any{"replicas": int64(2)},
	}}
	if _, err := deps.Apply(ctx, d.GetName(), handover, metav1.ApplyOptions{FieldManager: "handover-to-hpa"}); err != nil {
		t.Fatal(err)
	}
	got, err := deps.Apply(ctx, d.GetName(), d, metav1.ApplyOptions{FieldManager: "kubectl"})
	if err != nil {
		t.Fatal(err)
	}
	if r, _, _ := unstructured.NestedInt64(got.Object, "spec", "replicas"); r != 2 {
		t.Errorf("replicas after the upgrade: %d, want 2", r)
	}
}

// ingressDeployment renders the install's ingress Deployment into a fresh
// namespace of the shared test API server (not yet applied) and returns it
// with a client for Deployments there and a context ending with the test.
func ingressDeployment(t *testing.T) (context.Context, *unstructured.Unstructured, dynamic.ResourceInterface) {
	t.Helper()
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	ns := srv.Namespace(t)
	d := find(t, render(t, kubectl(t), "base"), "Deployment", "kvmesh-ingress")
	d.SetNamespace(ns)
	deps := dynamic.NewForConfigOrDie(srv.Config).Resource(schema.GroupVersionResource{Group: "apps", Version: "v1", Resource: "deployments"}).Namespace(ns)
	return ctx, d, deps
}
