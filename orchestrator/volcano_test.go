package orchestrator

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// podGroupCRD is the served shape of Volcano's PodGroup (schema trimmed to
// what the orchestrator writes; Volcano itself cannot run here).
const podGroupCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"podgroups.scheduling.volcano.sh"},
 "spec":{"group":"scheduling.volcano.sh","scope":"Namespaced",
  "names":{"kind":"PodGroup","plural":"podgroups","singular":"podgroup","listKind":"PodGroupList"},
  "versions":[{"name":"v1beta1","served":true,"storage":true,"subresources":{"status":{}},
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

// TestVolcanoPodGroupPerGroup: with the PodGroup CRD served, each group
// gets a PodGroup whose minMember is its gang, and its pods name it and the
// volcano scheduler; scaling groups down removes the surplus PodGroup, and
// never a user's PodGroup that merely carries the deployment's labels.
func TestVolcanoPodGroupPerGroup(t *testing.T) {
	s := kubetest.StartT(t, kubetest.Options{})
	installCRDs(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	objs, _ := kubetest.Decode(stringsReader(podGroupCRD))
	if err := kubetest.Apply(ctx, s.Config, kubetest.ApplyOptions{}, objs...); err != nil {
		t.Fatal(err)
	}
	e := &env{srv: s, ns: s.Namespace(t), kube: kubernetes.NewForConfigOrDie(s.Config), dyn: dynamic.NewForConfigOrDie(s.Config), ctx: ctx}
	pgs := e.dyn.Resource(podGroupsResource).Namespace(e.ns)
	user := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
		"metadata": map[string]any{"name": "a-user-pg", "labels": map[string]any{v1alpha1.LabelDeployment: "roll", v1alpha1.LabelGroup: "1"}}}}
	if _, err := pgs.Create(ctx, user, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startController(t, s.Config)
	objs, _ = kubetest.Decode(stringsReader(rollDoc))
	_ = unstructured.SetNestedField(objs[0].Object, int64(2), "spec", "groups")
	if err := kubetest.Apply(ctx, s.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "two PodGroups of 6 members (and the user's) and 12 pods", func() bool {
		l, err := pgs.List(ctx, metav1.ListOptions{})
		if err != nil || len(l.Items) != 3 {
			return false
		}
		for _, pg := range l.Items {
			if pg.GetName() == "a-user-pg" {
				continue
			}
			if n, _, _ := unstructured.NestedInt64(pg.Object, "spec", "minMember"); n != 6 {
				return false
			}
		}
		return len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "roll"})) == 12
	})
	for _, p := range e.pods(t, labels.Set{v1alpha1.LabelDeployment: "roll"}) {
		if p.Spec.SchedulerName != "volcano" || p.Annotations[annotationPodGroup] != "roll-"+p.Labels[v1alpha1.LabelGroup] {
			t.Fatalf("%s: scheduler %q, group annotation %q", p.Name, p.Spec.SchedulerName, p.Annotations[annotationPodGroup])
		}
	}
	e.setScale(t, e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns), "roll", 1)
	testutil.WaitFor(t, wait, "PodGroup roll-1 gone", func() bool {
		_, err := pgs.Get(ctx, "roll-1", metav1.GetOptions{})
		return apierrors.IsNotFound(err)
	})
	// The user's is listed first: a delete by label alone would have removed it before roll-1.
	l, err := pgs.List(ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(l.Items) != 2 || l.Items[0].GetName() != "a-user-pg" || l.Items[1].GetName() != "roll-0" {
		t.Fatalf("PodGroups %d, want a-user-pg (the user's) and roll-0", len(l.Items))
	}
}
