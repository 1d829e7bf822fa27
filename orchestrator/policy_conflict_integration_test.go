package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// noEngines is a mesh without engines: every role is unobserved and held
// within its policy's bounds.
type noEngines struct{}

func (noEngines) Engines() []gossip.EngineView { return nil }

// startAutoscaler runs a controller that steps policies every 200 ms on
// the engines load lists, until the test ends.
func (e *env) startAutoscaler(t *testing.T, load LoadSource) {
	t.Helper()
	c := DefaultConfig()
	c.Namespace, c.LeaderElection, c.Load, c.AutoscaleInterval = e.ns, false, load, 200*time.Millisecond
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := New(e.srv.Config, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// scalingActive is the policy's ScalingActive condition ("" when unset).
func scalingActive(ap *v1alpha1.AutoscalingPolicy) (metav1.ConditionStatus, string) {
	c := meta.FindStatusCondition(ap.Status.Conditions, v1alpha1.ConditionScalingActive)
	if c == nil {
		return "", ""
	}
	return c.Status, c.Reason
}

// TestPolicyConflictAndMissingRole: two policies hold the decode role at 4
// and at 6; they would undo each other's every step (4, 6, 4, ...). The
// older (here: by name, created in the same second) scales it to 4; the
// other says ScalingActive False (PolicyConflict) with a Warning event and
// scales nothing. A policy naming a role the deployment lacks says
// RoleNotFound instead of Observing an empty status.
func TestPolicyConflictAndMissingRole(t *testing.T) {
	e := newEnv(t)
	e.startAutoscaler(t, noEngines{})
	const doc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"pd"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"prefill","kind":"prefill","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}},
  {"name":"decode","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"first"},
 "spec":{"target":"pd","roles":[{"name":"decode","minReplicas":4,"maxReplicas":4}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"second"},
 "spec":{"target":"pd","roles":[{"name":"prefill","minReplicas":1,"maxReplicas":2},{"name":"decode","minReplicas":6,"maxReplicas":6}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"typo"},
 "spec":{"target":"pd","roles":[{"name":"decoder","minReplicas":1,"maxReplicas":2}]}}`
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "decode at 4 by first; second PolicyConflict with a Warning event; typo RoleNotFound", func() bool {
		first, second, typo := e.policy(t, "first"), e.policy(t, "second"), e.policy(t, "typo")
		fs, _ := scalingActive(first)
		ss, sr := scalingActive(second)
		ts, tr := scalingActive(typo)
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return *e.md(t, "pd").Spec.Roles[1].Replicas == 4 && fs == metav1.ConditionTrue &&
			ss == metav1.ConditionFalse && sr == reasonPolicyConflict && ts == metav1.ConditionFalse && tr == reasonRoleNotFound &&
			len(second.Status.Roles) == 0 && err == nil && slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
			return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonPolicyConflict && ev.InvolvedObject.Name == "second"
		})
	})
	// Deleting the older policy hands the role to the other, which holds it at 6.
	if err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).Delete(e.ctx, "first", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "decode at 6 by second, now ScalingActive", func() bool {
		s, _ := scalingActive(e.policy(t, "second"))
		return *e.md(t, "pd").Spec.Roles[1].Replicas == 6 && s == metav1.ConditionTrue
	})
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// While both were there, second never scaled decode to 6 for first to
	// bring it back to 4.
	for _, ev := range evs.Items {
		if ev.Reason == "Scaled" && ev.InvolvedObject.Name == "first" && strings.HasPrefix(ev.Message, "role decode: 6 -> 4") {
			t.Errorf("the policies fought: first %s (x%d)", ev.Message, ev.Count)
		}
	}
}
