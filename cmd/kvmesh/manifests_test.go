package main

import (
	"bytes"
	"errors"
	"io"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"

	"go.yaml.in/yaml/v3"
)

// TestManifestsUseRealFlags renders every kustomize overlay and parses the
// arguments of each kvmesh container with the binary's own flag sets, so a
// renamed or removed flag breaks this test instead of a deployment.
func TestManifestsUseRealFlags(t *testing.T) {
	kubectl := testutil.RequireTool(t, "kubectl", "it renders the kustomize overlays")
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, dir := range []string{"base", "install", "overlays/sidecar-container", "overlays/daemonset"} {
		t.Run(dir, func(t *testing.T) {
			out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", "manifests", dir)).Output()
			if err != nil {
				t.Fatalf("kubectl kustomize %s: %v", dir, err)
			}
			dec := yaml.NewDecoder(bytes.NewReader(out))
			checked := 0
			for {
				var doc map[string]any
				if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
					break
				} else if err != nil {
					t.Fatalf("decode rendered manifests: %v", err)
				}
				for _, c := range containers(doc) {
					image, _ := c["image"].(string)
					if !strings.Contains(image, "kvmesh/kvmesh") {
						continue
					}
					var args []string
					for _, a := range c["args"].([]any) {
						// Kubernetes expands $(VAR) from the container's env; any value will do here.
						args = append(args, envRef.ReplaceAllString(a.(string), "10.0.0.1"))
					}
					var stdout, stderr bytes.Buffer
					if code := run(append(args, "-h"), &stdout, &stderr); code != 0 {
						t.Errorf("%s: kvmesh %s rejects its manifest arguments (exit %d): %s", dir, strings.Join(args, " "), code, stderr.String())
					}
					checked++
				}
			}
			if checked == 0 {
				t.Fatalf("%s: no kvmesh container found", dir)
			}
		})
	}
}

// containers returns the containers of a workload document (Deployment,
// StatefulSet, DaemonSet), or nil.
func containers(doc map[string]any) []map[string]any {
	spec, _ := doc["spec"].(map[string]any)
	tmpl, _ := spec["template"].(map[string]any)
	podSpec, _ := tmpl["spec"].(map[string]any)
	list, _ := podSpec["containers"].([]any)
	var out []map[string]any
	for _, c := range list {
		if m, ok := c.(map[string]any); ok {
			out = append(out, m)
		}
	}
	return out
}
