package view

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{})) }

// installCRDs applies the kvmesh.io CRDs (manifests/crds) to srv.
func installCRDs(ctx context.Context, t *testing.T, srv *kubetest.Server) {
	t.Helper()
	crds, _ := filepath.Glob(filepath.Join("..", "..", "manifests", "crds", "kvmesh.io_*.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crds...); err != nil {
		t.Fatal(err)
	}
}

// viewEnv is the shared API server with the CRDs installed, a context of
// two minutes for the test and a namespace of its own.
func viewEnv(t *testing.T) (context.Context, *kubetest.Server, string) {
	t.Helper()
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	installCRDs(ctx, t, srv)
	return ctx, srv, srv.Namespace(t)
}

// TestDescribeShowsOnlyTheObjectsOwnEvents: the example AutoscalingPolicy is
// named after its ModelDeployment (llama-pd); describe shows each one's events,
// not the other's.
func TestDescribeShowsOnlyTheObjectsOwnEvents(t *testing.T) {
	ctx, srv, ns := viewEnv(t)
	root := filepath.Join("..", "..")
	kube := kubernetes.NewForConfigOrDie(srv.Config)
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns},
		filepath.Join(root, "examples", "pd-modeldeployment.yaml"), filepath.Join(root, "examples", "autoscalingpolicy.yaml")); err != nil {
		t.Fatal(err)
	}
	dyn := dynamic.NewForConfigOrDie(srv.Config)
	uids := map[string]types.UID{}
	for kind, res := range map[string]string{"ModelDeployment": "modeldeployments", "AutoscalingPolicy": "autoscalingpolicies"} {
		o, err := dyn.Resource(schema.GroupVersionResource{Group: "kvmesh.io", Version: "v1alpha1", Resource: res}).Namespace(ns).Get(ctx, "llama-pd", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		uids[kind] = o.GetUID()
	}
	event := func(kind, name string, uid types.UID, reason string) {
		t.Helper()
		_, err := kube.CoreV1().Events(ns).Create(ctx, &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: "e-"},
			InvolvedObject: corev1.ObjectReference{APIVersion: "kvmesh.io/v1alpha1", Kind: kind, Namespace: ns, Name: name, UID: uid},
			Reason:         reason, Message: reason, Type: corev1.EventTypeNormal, Count: 1,
		}, metav1.CreateOptions{})
		if err != nil {
			t.Fatal(err)
		}
	}
	event("ModelDeployment", "llama-pd", uids["ModelDeployment"], "FromTheDeployment")
	event("AutoscalingPolicy", "llama-pd", uids["AutoscalingPolicy"], "FromThePolicy")
	event("AutoscalingPolicy", "llama-pd", "0000-an-earlier-object-of-that-name", "FromAnEarlierPolicy")

	for res, want := range map[string]string{"autoscalingpolicies": "FromThePolicy", "modeldeployments": "FromTheDeployment"} {
		var out bytes.Buffer
		if err := Describe(ctx, srv.Config, res, ns, "llama-pd", &out); err != nil {
			t.Fatalf("describe %s: %v", res, err)
		}
		events := out.String()[strings.Index(out.String(), "events:"):]
		for _, r := range []string{"FromTheDeployment", "FromThePolicy", "FromAnEarlierPolicy"} {
			if strings.Contains(events, r) != (r == want) {
				t.Errorf("describe %s llama-pd: event %s shown %v:\n%s", res, r, r != want, events)
			}
		}
	}
}

// An empty list says so as kubectl does (on stderr), not with a bare header.
func TestGetEmptyListSaysNoResources(t *testing.T) {
	ctx, srv, ns := viewEnv(t)
	var out, errOut bytes.Buffer
	if err := Get(ctx, srv.Config, "modeldeployments", ns, "", &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 || errOut.String() != "No resources found in "+ns+" namespace.\n" {
		t.Errorf("stdout %q, stderr %q; want nothing and kubectl's line", out.String(), errOut.String())
	}
	// A namespace that does not exist lists nothing too, as with kubectl.
	out.Reset()
	errOut.Reset()
	if err := Get(ctx, srv.Config, "modeldeployments", "nonexistent", "", &out, &errOut); err != nil {
		t.Fatal(err)
	}
	if out.Len() != 0 || errOut.String() != "No resources found in nonexistent namespace.\n" {
		t.Errorf("nonexistent: stdout %q, stderr %q", out.String(), errOut.String())
	}
}

// TestGetPoliciesShowReasonAndWorkloads: `kvmesh get asp` shows why a policy
// is not active (ScalingActive's reason) and what an adopting policy scales,
// every role's workload (the API server renders the first match only).
func TestGetPoliciesShowReasonAndWorkloads(t *testing.T) {
	ctx, srv, ns := viewEnv(t)
	objs, err := kubetest.Decode(strings.NewReader(`
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"adopting"},"spec":{"roles":[
 {"name":"prefill","minReplicas":1,"maxReplicas":4,"workload":{"kind":"Deployment","name":"llm-prefill"}},
 {"name":"decode","minReplicas":1,"maxReplicas":4,"workload":{"kind":"StatefulSet","selector":{"matchLabels":{"app":"llm"}}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"targeting"},"spec":{"target":"llama-pd","roles":[
 {"name":"decode","minReplicas":1,"maxReplicas":4}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns}, objs...); err != nil {
		t.Fatal(err)
	}
	asp := dynamic.NewForConfigOrDie(srv.Config).Resource(schema.GroupVersionResource{Group: "kvmesh.io", Version: "v1alpha1", Resource: "autoscalingpolicies"}).Namespace(ns)
	status := func(name, active, reason string, workloads ...string) {
		t.Helper()
		u, err := asp.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var roles []any
		for i, w := range workloads {
			r := map[string]any{"name": []string{"prefill", "decode"}[i], "currentReplicas": int64(1), "desiredReplicas": int64(1)}
			if w != "" {
				r["workload"] = w
			}
			roles = append(roles, r)
		}
		u.Object["status"] = map[string]any{"roles": roles, "conditions": []any{map[string]any{"type": "ScalingActive", "status": active,
			"reason": reason, "message": reason, "lastTransitionTime": "2026-12-06T11:23:00Z"}}}
		if _, err := asp.UpdateStatus(ctx, u, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	status("adopting", "True", "Observing", "Deployment/llm-prefill", "StatefulSet/llm-decode-x")
	status("targeting", "False", "PolicyConflict", "")

	var out, errOut bytes.Buffer
	if err := Get(ctx, srv.Config, "autoscalingpolicies", ns, "", &out, &errOut); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("get asp:\n%s", out.String())
	}
	want := [][]string{
		{"NAME", "TARGET", "WORKLOADS", "ACTIVE", "REASON", "RATIO", "SLOATRISK", "AGE"},
		{"adopting", "<none>", "Deployment/llm-prefill,StatefulSet/llm-decode-x", "True", "Observing"},
		{"targeting", "llama-pd", "<none>", "False", "PolicyConflict"},
	}
	for i, w := range want {
		if f := strings.Fields(lines[i]); len(f) < len(w) || !slices.Equal(f[:len(w)], w) {
			t.Errorf("get asp line %d: %q, want it to start with %q\n%s", i, lines[i], w, out.String())
		}
	}
	// One by name, and across namespaces, the same.
	out.Reset()
	if err := Get(ctx, srv.Config, "autoscalingpolicies", ns, "adopting", &out, &errOut); err != nil || !strings.Contains(out.String(), "Deployment/llm-prefill,StatefulSet/llm-decode-x") {
		t.Errorf("get asp adopting: %v\n%s", err, out.String())
	}
	out.Reset()
	if err := Get(ctx, srv.Config, "autoscalingpolicies", "", "", &out, &errOut); err != nil || !strings.Contains(out.String(), ns+" ") ||
		!strings.Contains(out.String(), "Deployment/llm-prefill,StatefulSet/llm-decode-x") || !strings.Contains(out.String(), "PolicyConflict") {
		t.Errorf("get asp -A: %v\n%s", err, out.String())
	}
}

// A name that does not exist is reported as kubectl reports it
// (`modeldeployments.kvmesh.io "nosuch" not found`), by get and describe
// alike. Before, the API server's Status was not decoded and both said "the
// server could not find the requested resource", which reads like a CRD that
// is not installed.
func TestMissingNameSaysNotFound(t *testing.T) {
	ctx, srv, ns := viewEnv(t)
	var out, errOut bytes.Buffer
	want := `modeldeployments.kvmesh.io "nosuch" not found`
	if err := Get(ctx, srv.Config, "modeldeployments", ns, "nosuch", &out, &errOut); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("get: %v, want %q", err, want)
	}
	if err := Describe(ctx, srv.Config, "modeldeployments", ns, "nosuch", &out); err == nil || !strings.Contains(err.Error(), want) {
		t.Errorf("describe: %v, want %q", err, want)
	}
}
