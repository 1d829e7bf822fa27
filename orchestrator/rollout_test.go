package orchestrator

import (
	"encoding/json"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

const rollDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"roll"},
 "spec":{"model":"m","engine":"vllm","recoveryPolicy":"GroupRecreate","roles":[
  {"name":"decode","kind":"decode","replicas":5,"rollout":{"maxUnavailable":2},
   "template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}},
  {"name":"prefill","kind":"prefill","replicas":1,
   "template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestRollingUpdateWithinMaxUnavailable changes the decode template and
// follows every pod event: at no point are more than maxUnavailable (2) of
// the 5 decode replicas missing or unready, and the rollout completes. The
// test plays the kubelet by marking new pods ready as they appear.
func TestRollingUpdateWithinMaxUnavailable(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	objs, _ := kubetest.Decode(stringsReader(rollDoc))
	if err := kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "roll", v1alpha1.LabelRole: "decode"}
	all := labels.Set{v1alpha1.LabelDeployment: "roll"}
	testutil.WaitFor(t, wait, "6 ready pods", func() bool {
		ps := e.pods(t, all)
		e.markReady(t, ps)
		return count(ps, podReady) == 6
	})
	prefill := e.pods(t, labels.Set{v1alpha1.LabelDeployment: "roll", v1alpha1.LabelRole: "prefill"})[0]
	oldRev := e.pods(t, sel)[0].Labels[v1alpha1.LabelRevision]

	list, err := e.kube.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	w, err := e.kube.CoreV1().Pods(e.ns).Watch(e.ctx, metav1.ListOptions{LabelSelector: sel.String(), ResourceVersion: list.ResourceVersion})
	if err != nil {
		t.Fatal(err)
	}
	defer w.Stop()
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/roles/0/template/spec/containers/0/image", "value": "engine:v2"}})
	if _, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Patch(e.ctx, "roll", types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	pods := map[string]*corev1.Pod{}
	for i := range list.Items {
		pods[list.Items[i].Name] = &list.Items[i]
	}
	minReady, done := 5, false
	for !done {
		var ev watch.Event
		select {
		case ev = <-w.ResultChan():
		case <-e.ctx.Done():
			t.Fatalf("rollout did not finish: %d pods", len(pods))
		}
		p, ok := ev.Object.(*corev1.Pod)
		if !ok {
			t.Fatalf("watch: %v", ev.Object)
		}
		if ev.Type == watch.Deleted {
			delete(pods, p.Name)
		} else {
			pods[p.Name] = p
		}
		ready, updated := 0, 0
		for _, q := range pods {
			if podReady(q) && q.DeletionTimestamp == nil {
				ready++
				if q.Labels[v1alpha1.LabelRevision] != oldRev {
					updated++
				}
			}
		}
		minReady = min(minReady, ready)
		if ready < 5-2 {
			t.Fatalf("only %d of 5 decode replicas ready during the rollout (maxUnavailable 2)", ready)
		}
		if ev.Type == watch.Added {
			e.markReady(t, []corev1.Pod{*p})
		}
		done = updated == 5 && len(pods) == 5
	}
	if minReady != 3 {
		t.Errorf("the rollout never used its budget: min ready %d, want 3", minReady)
	}
	for _, p := range e.pods(t, sel) {
		if p.Spec.Containers[0].Image != "engine:v2" {
			t.Errorf("%s runs %s", p.Name, p.Spec.Containers[0].Image)
		}
	}
	// The prefill role was not touched.
	for _, p := range e.pods(t, labels.Set{v1alpha1.LabelDeployment: "roll", v1alpha1.LabelRole: "prefill"}) {
		if p.UID != prefill.UID {
			t.Errorf("prefill pod %s was replaced by the decode rollout", p.Name)
		}
	}
}

// TestGroupRecreateOnFailure: with GroupRecreate, one failed pod replaces
// every pod of its group.
func TestGroupRecreateOnFailure(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	objs, _ := kubetest.Decode(stringsReader(rollDoc))
	if err := kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "roll"}
	testutil.WaitFor(t, wait, "6 pods", func() bool { return len(e.pods(t, sel)) == 6 })
	before := map[types.UID]bool{}
	for _, p := range e.pods(t, sel) {
		before[p.UID] = true
	}
	victim := e.pods(t, labels.Set{v1alpha1.LabelDeployment: "roll", v1alpha1.LabelRole: "prefill"})[0]
	victim.Status.Phase = corev1.PodFailed
	if _, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, &victim, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "all 6 pods recreated", func() bool {
		ps := e.pods(t, sel)
		return len(ps) == 6 && count(ps, func(p *corev1.Pod) bool { return !before[p.UID] }) == 6
	})
}
