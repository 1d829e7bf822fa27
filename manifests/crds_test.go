package manifests

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// TestOnlyKvmeshCRDsInOverlays: no kustomization but crds/third-party (a copy
// applied on purpose) renders a CRD kvmesh does not own. A shared CRD such as
// the InferencePool's belongs to the gateway's release: applied with an
// overlay it conflicts with that release's copy, and deleted with the overlay
// it takes every InferencePool in the cluster with it.
func TestOnlyKvmeshCRDsInOverlays(t *testing.T) {
	kc := kubectl(t)
	for _, dir := range kustomizations(t) {
		if dir == "crds/third-party" {
			continue
		}
		for _, o := range render(t, kc, dir) {
			if o.GetKind() == "CustomResourceDefinition" && !strings.HasSuffix(o.GetName(), ".kvmesh.io") {
				t.Errorf("%s renders the third-party CRD %s", dir, o.GetName())
			}
		}
	}
}

// TestCRDFieldsDescribed: each kvmesh CRD describes itself, its spec and
// status, and every field directly under them, so `kubectl explain md`,
// `md.spec` and `md.spec.roles` print a field reference (k8s tester 5: every
// field said <no description>).
func TestCRDFieldsDescribed(t *testing.T) {
	files, _ := filepath.Glob(filepath.Join("crds", "kvmesh.io_*.yaml"))
	if len(files) != 4 {
		t.Fatalf("CRD files %v, want 4", files)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		var crd map[string]any
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		name, _, _ := unstructured.NestedString(crd, "metadata", "name")
		versions, _, _ := unstructured.NestedSlice(crd, "spec", "versions")
		for _, v := range versions {
			root, _, _ := unstructured.NestedMap(v.(map[string]any), "schema", "openAPIV3Schema")
			if d, _, _ := unstructured.NestedString(root, "description"); d == "" {
				t.Errorf("%s: no description", name)
			}
			for _, part := range []string{"spec", "status"} {
				s, ok, _ := unstructured.NestedMap(root, "properties", part)
				if !ok {
					continue
				}
				if d, _, _ := unstructured.NestedString(s, "description"); d == "" {
					t.Errorf("%s: .%s has no description", name, part)
				}
				props, _, _ := unstructured.NestedMap(s, "properties")
				for field, p := range props {
					if d, _, _ := unstructured.NestedString(p.(map[string]any), "description"); d == "" {
						t.Errorf("%s: .%s.%s has no description", name, part, field)
					}
				}
			}
		}
	}
}
