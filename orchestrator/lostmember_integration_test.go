package orchestrator

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestLostWorkerRecreatesReplica, through the API server: the multi-node
// example's replica, whole and Running, is marked complete; its worker
// deleted (an eviction), the leader goes too and the replica is made again
// whole (RoleRecreate), once: the new members are not marked until they
// run, so the old leader's going away recovers nothing more.
func TestLostWorkerRecreatesReplica(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	e.apply(t, "examples/multinode-modeldeployment.yaml")
	sel := labels.Set{v1alpha1.LabelDeployment: "llama-70b"}
	marked := func(ps []corev1.Pod) int {
		return count(ps, func(p *corev1.Pod) bool { return p.Annotations[v1alpha1.AnnotationReplicaComplete] != "" })
	}
	testutil.WaitFor(t, wait, "the leader and its worker, Running and marked complete", func() bool {
		ps := e.pods(t, sel)
		e.markReady(t, ps)
		return len(ps) == 2 && marked(ps) == 2
	})
	var leader, worker types.UID
	for _, p := range e.pods(t, sel) {
		if p.Labels[v1alpha1.LabelWorker] == "0" {
			leader = p.UID
		} else {
			worker = p.UID
		}
	}
	var wname string
	for _, p := range e.pods(t, sel) {
		if p.UID == worker {
			wname = p.Name
		}
	}
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, wname, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "a new leader and worker, neither marked", func() bool {
		ps := e.pods(t, sel)
		return len(ps) == 2 && marked(ps) == 0 && count(ps, func(p *corev1.Pod) bool { return p.UID == leader || p.UID == worker }) == 0
	})
	// The recorder writes events on its own goroutine: waited for.
	testutil.WaitFor(t, wait, "one Recovering event", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		recovering := 0
		for _, ev := range evs.Items {
			if ev.Reason == "Recovering" {
				recovering += int(ev.Count)
			}
		}
		if recovering > 1 {
			t.Fatalf("%d Recovering events, want 1", recovering)
		}
		return recovering == 1
	})
}
