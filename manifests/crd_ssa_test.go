package manifests

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"sigs.k8s.io/yaml"

	"github.com/kvmesh/kvmesh/internal/kubetest"
)

// TestModelDeploymentReapplyAfterRoleScale: .spec.roles is a map list keyed by
// name, so after the controller scales one role (its field manager then owns
// that role's replicas) the user's server-side re-apply of the same manifest,
// which leaves replicas to the controller, does not conflict; with an atomic
// list the controller would own all of .spec.roles and the re-apply would fail.
func TestModelDeploymentReapplyAfterRoleScale(t *testing.T) {
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, filepath.Join("crds", "kvmesh.io_modeldeployments.yaml")); err != nil {
		t.Fatal(err)
	}
	ns := srv.Namespace(t)
	var manifest unstructured.Unstructured
	if err := yaml.Unmarshal([]byte(`apiVersion: kvmesh.io/v1alpha1
kind: ModelDeployment
metadata: {name: md}
spec:
  model: m
  engine: vllm
  roles:
    - name: prefill
      kind: prefill
      template: {spec: {containers: [{name: engine, image: vllm}]}}
    - name: decode
      kind: decode
      template: {spec: {containers: [{name: engine, image: vllm}]}}
`), &manifest.Object); err != nil {
		t.Fatal(err)
	}
	mds := dynamic.NewForConfigOrDie(srv.Config).Resource(schema.GroupVersionResource{Group: "kvmesh.io", Version: "v1alpha1", Resource: "modeldeployments"}).Namespace(ns)
	apply := func() error {
		_, err := mds.Apply(ctx, "md", &manifest, metav1.ApplyOptions{FieldManager: "kubectl"})
		return err
	}
	if err := apply(); err != nil {
		t.Fatal(err)
	}
	// The controller scales decode to 3 (an update under its own field manager).
	md, err := mds.Get(ctx, "md", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roles, _, _ := unstructured.NestedSlice(md.Object, "spec", "roles")
	roles[1].(map[string]any)["replicas"] = int64(3)
	if err := unstructured.SetNestedSlice(md.Object, roles, "spec", "roles"); err != nil {
		t.Fatal(err)
	}
	if _, err := mds.Update(ctx, md, metav1.UpdateOptions{FieldManager: "kvmesh-orchestrator"}); err != nil {
		t.Fatal(err)
	}
	// The user re-applies, changing the prefill image: no conflict, decode keeps 3.
	mroles, _, _ := unstructured.NestedSlice(manifest.Object, "spec", "roles")
	mroles[0].(map[string]any)["template"] = map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "engine", "image": "vllm:2"}}}}
	if err := unstructured.SetNestedSlice(manifest.Object, mroles, "spec", "roles"); err != nil {
		t.Fatal(err)
	}
	if err := apply(); err != nil {
		t.Fatalf("re-apply after a role scale: %v", err)
	}
	md, err = mds.Get(ctx, "md", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	roles, _, _ = unstructured.NestedSlice(md.Object, "spec", "roles")
	if len(roles) != 2 {
		t.Fatalf("roles %v", roles)
	}
	if r := roles[1].(map[string]any); r["name"] != "decode" || r["replicas"] != int64(3) {
		t.Errorf("decode after re-apply: %v, want replicas 3", r)
	}
	if img, _, _ := unstructured.NestedSlice(roles[0].(map[string]any), "template", "spec", "containers"); len(img) != 1 || img[0].(map[string]any)["image"] != "vllm:2" {
		t.Errorf("prefill after re-apply: %v, want image vllm:2", roles[0])
	}
}
