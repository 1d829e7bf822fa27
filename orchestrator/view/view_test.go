package view

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
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

// TestDescribeShowsOnlyTheObjectsOwnEvents: the example AutoscalingPolicy is
// named after its ModelDeployment (llama-pd); describe shows each one's events,
// not the other's.
func TestDescribeShowsOnlyTheObjectsOwnEvents(t *testing.T) {
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	root := filepath.Join("..", "..")
	crds, _ := filepath.Glob(filepath.Join(root, "manifests", "crds", "kvmesh.io_*.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crds...); err != nil {
		t.Fatal(err)
	}
	kube := kubernetes.NewForConfigOrDie(srv.Config)
	ns := srv.Namespace(t)
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
	srv := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	crds, _ := filepath.Glob(filepath.Join("..", "..", "manifests", "crds", "kvmesh.io_*.yaml"))
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crds...); err != nil {
		t.Fatal(err)
	}
	ns := srv.Namespace(t)
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
