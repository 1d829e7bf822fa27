package orchestrator

import (
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestGangHeldNameSaysPodNameConflict: a new group's gang that cannot be
// created because another pod holds one of its pod names is reported as a
// held name (PodNameConflict True naming the pod, Progressing False for that
// reason) besides GangBlocked. Before, a held name in a gang reached only
// GangBlocked, with PodNameConflict False ("no pod holds the name...") and
// Progressing True: the two conditions contradicted each other (k8s tester).
func TestGangHeldNameSaysPodNameConflict(t *testing.T) {
	e := newEnv(t)
	holder := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "gheld-0-decode-0"},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "user:v1"}}}}
	if _, err := e.kube.CoreV1().Pods(e.ns).Create(e.ctx, holder, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	cnt := &requestCounter{}
	cfg := rest.CopyConfig(e.srv.Config)
	cfg.Wrap(cnt.wrap)
	ctrl := e.newTestController(t, cfg, "a", nil)
	ctrl.heldRequeue = 50 * time.Millisecond
	testutil.Run(t, "controller", ctrl.Run, nil)
	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "gheld")); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "PodNameConflict naming the holder, Progressing False, GangBlocked", func() bool {
		md := e.md(t, "gheld")
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionPodNameConflict)
		p := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
		g := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionGangBlocked)
		return c != nil && c.Status == metav1.ConditionTrue && strings.Contains(c.Message, "gheld-0-decode-0") &&
			p != nil && p.Status == metav1.ConditionFalse && p.Reason == reasonPodNameConflict &&
			g != nil && g.Status == metav1.ConditionTrue
	})
	// Each pass tries the gang again and finds the name held as before: the
	// status it starts with (Progressing as the last pass ended) and ends
	// with are the same, so nothing is written.
	start := e.steadyFrom(t, ctrl, cnt, "gheld", "gheld-0-decode-0")
	// (Passes of a failed gang back off: three, not ten.)
	testutil.WaitFor(t, wait, "three more passes (reads of the held name)", func() bool {
		return cnt.count("GET", "/pods/gheld-0-decode-0")-start.count("GET", "/pods/gheld-0-decode-0") >= 3
	})
	if n := cnt.count("PUT", "/modeldeployments/gheld/status") - start.count("PUT", "/modeldeployments/gheld/status"); n != 0 {
		t.Errorf("%d status writes over three passes of a held gang, want none", n)
	}
}
