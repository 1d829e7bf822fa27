package orchestrator

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// driven is a controller of the test's namespace whose informers run but
// no worker: the test takes each reconcile step itself (step), in the
// order it chooses, with the caches where it put them.
func (e *env) driven(t *testing.T) *Controller {
	t.Helper()
	c := DefaultConfig()
	c.Namespace, c.LeaderElection = e.ns, false
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := New(e.srv.Config, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ctrl.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: ctrl.kube.CoreV1().Events("")})
	ctrl.kubeInformers.Start(ctx.Done())
	ctrl.dynInformers.Start(ctx.Done())
	t.Cleanup(func() {
		cancel()
		ctrl.queue.ShutDown()
		ctrl.kubeInformers.Shutdown()
		ctrl.dynInformers.Shutdown()
		ctrl.broadcaster.Shutdown()
	})
	if !cache.WaitForCacheSync(e.ctx.Done(), ctrl.synced...) {
		t.Fatal("caches did not sync")
	}
	return ctrl
}

// inCache waits until ctrl's caches show ModelDeployment md and RoleScaler
// scaler (when the API server has it) as the API server has them.
func (e *env) inCache(t *testing.T, ctrl *Controller, md, scaler string) {
	t.Helper()
	testutil.WaitFor(t, wait, "the caches to show "+md+" and "+scaler, func() bool {
		for _, o := range []struct {
			res  cache.GenericLister
			ri   string
			name string
		}{{ctrl.mds, "md", md}, {ctrl.scalers, "scaler", scaler}} {
			r := v1alpha1.ModelDeploymentsResource
			if o.ri == "scaler" {
				r = v1alpha1.RoleScalersResource
			}
			want, err := e.dyn.Resource(r).Namespace(e.ns).Get(e.ctx, o.name, metav1.GetOptions{})
			if err != nil {
				if o.ri == "scaler" {
					continue
				}
				return false
			}
			got, err := o.res.ByNamespace(e.ns).Get(o.name)
			if err != nil || got.(metav1.Object).GetResourceVersion() != want.GetResourceVersion() {
				return false
			}
		}
		return true
	})
}

// patchRoleReplicas writes roles[0].replicas as a user (or a GitOps tool)
// does: a JSON patch of the deployment.
func (e *env) patchRoleReplicas(t *testing.T, md string, n int) {
	t.Helper()
	patch, _ := json.Marshal([]map[string]any{{"op": "replace", "path": "/spec/roles/0/replicas", "value": n}})
	if _, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Patch(e.ctx, md, types.JSONPatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
}

func (e *env) scaler(t *testing.T, name string) *v1alpha1.RoleScaler {
	t.Helper()
	u, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s := &v1alpha1.RoleScaler{}
	if err := runtimeFromUnstructured(u, s); err != nil {
		t.Fatal(err)
	}
	return s
}

const raceDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"race"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"r","kind":"mixed","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestOwnScalerWriteNotExternal: the controller creates a RoleScaler and
// copies edits of roles[].replicas into it; each such write moves the
// scaler's generation. A later edit read while the cache still shows the
// scaler between that write and its status (the informer passes through
// that state), or read by another controller after a restart, must not take
// the controller's own write for someone's scale and copy the older value
// back over the edit. The test takes the steps itself, in this order, and
// sets the cache to the state between the two writes: no timing is
// involved.
func TestOwnScalerWriteNotExternal(t *testing.T) {
	e := newEnv(t)
	ctrl := e.driven(t)
	if err := e.applyDoc(t, raceDoc); err != nil {
		t.Fatal(err)
	}
	key := e.ns + "/race"
	step := func(c *Controller) {
		t.Helper()
		e.inCache(t, c, "race", "race-r")
		if _, err := c.reconcile(e.ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	// stepBetween takes a step whose cache shows the scaler at its current
	// generation, its status observing generation obs only.
	stepBetween := func(obs int64) {
		t.Helper()
		e.inCache(t, ctrl, "race", "race-r")
		o, err := ctrl.scalers.ByNamespace(e.ns).Get("race-r")
		if err != nil {
			t.Fatal(err)
		}
		mid := o.(*unstructured.Unstructured).DeepCopy()
		if err := unstructured.SetNestedField(mid.Object, obs, "status", "observedGeneration"); err != nil {
			t.Fatal(err)
		}
		if err := ctrl.dynInformers.ForResource(v1alpha1.RoleScalersResource).Informer().GetIndexer().Update(mid); err != nil {
			t.Fatal(err)
		}
		if _, err := ctrl.reconcile(e.ctx, key); err != nil {
			t.Fatal(err)
		}
	}
	replicas := func(want int32, what string) {
		t.Helper()
		if n := *e.md(t, "race").Spec.Roles[0].Replicas; n != want {
			t.Fatalf("%s: roles[0].replicas %d, want %d (the controller's own RoleScaler write was taken for a scale)", what, n, want)
		}
	}
	settled := func(c *Controller, n int32) {
		t.Helper()
		testutil.WaitFor(t, wait, fmt.Sprintf("RoleScaler race-r at %d, observed", n), func() bool {
			step(c)
			s := e.scaler(t, "race-r")
			return s.Spec.Replicas == n && s.Status.ObservedGeneration == s.Generation
		})
		replicas(n, "settled")
	}

	// The controller creates the scaler (at 1); an edit to 2 is read while
	// the cache shows it as created, with no status.
	testutil.WaitFor(t, wait, "RoleScaler race-r created", func() bool {
		step(ctrl)
		_, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, "race-r", metav1.GetOptions{})
		return err == nil
	})
	e.patchRoleReplicas(t, "race", 2)
	stepBetween(0)
	replicas(2, "edit to 2 read with the scaler as created")
	settled(ctrl, 2)

	// An edit to 3 is copied into the scaler (the controller's write); an
	// edit to 4 is read while the cache shows the scaler as that write left
	// it: its new generation, the status not yet observing it.
	before := e.scaler(t, "race-r")
	e.patchRoleReplicas(t, "race", 3)
	step(ctrl)
	if s := e.scaler(t, "race-r"); s.Spec.Replicas != 3 || s.Generation == before.Generation {
		t.Fatalf("RoleScaler after the edit to 3: replicas %d generation %d, want 3 at a new generation", s.Spec.Replicas, s.Generation)
	}
	e.patchRoleReplicas(t, "race", 4)
	stepBetween(before.Generation)
	replicas(4, "edit to 4 read with the scaler between the controller's write and its status")
	settled(ctrl, 4)

	// A new controller (a restart, a new leader) remembers nothing of the
	// first one's writes: the scaler's status must say it.
	e.patchRoleReplicas(t, "race", 5)
	step(ctrl) // copied into the scaler by the first controller
	if s := e.scaler(t, "race-r"); s.Spec.Replicas != 5 {
		t.Fatalf("RoleScaler after the edit to 5: replicas %d, want 5", s.Spec.Replicas)
	}
	ctrl2 := e.driven(t)
	e.patchRoleReplicas(t, "race", 6)
	step(ctrl2)
	replicas(6, "edit to 6 read by a new controller")
	settled(ctrl2, 6)
}

const gangDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"gang"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"a","kind":"prefill","replicas":2,"gangMinimum":2,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}},
  {"name":"b","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestScaleBelowGangMinimumRefused: a RoleScaler scaled below its role's
// gangMinimum asks for what the deployment cannot take (the API server
// refuses it). The scale is refused once with a Warning event on the
// deployment and the RoleScaler, the RoleScaler is set back, gangMinimum
// is left alone, and the deployment goes on being reconciled: a deleted
// pod is created again.
func TestScaleBelowGangMinimumRefused(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, gangDoc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "gang"}
	testutil.WaitFor(t, wait, "3 pods and RoleScaler gang-a observed", func() bool {
		u, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, "gang-a", metav1.GetOptions{})
		if err != nil {
			return false
		}
		obs, _, _ := unstructured.NestedInt64(u.Object, "status", "observedGeneration")
		return len(e.pods(t, sel)) == 3 && obs == u.GetGeneration()
	})
	e.setScale(t, e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns), "gang-a", 1)
	refused := func(ev corev1.Event, kind, name string) bool {
		return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonScaleRefused && ev.InvolvedObject.Kind == kind && ev.InvolvedObject.Name == name
	}
	testutil.WaitFor(t, wait, "ScaleRefused events and RoleScaler gang-a set back to 2", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		s := e.scaler(t, "gang-a")
		return slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return refused(ev, "ModelDeployment", "gang") }) &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return refused(ev, "RoleScaler", "gang-a") }) &&
			s.Spec.Replicas == 2 && s.Status.ObservedGeneration == s.Generation
	})
	md := e.md(t, "gang")
	if *md.Spec.Roles[0].Replicas != 2 || *md.Spec.Roles[0].GangMinimum != 2 {
		t.Fatalf("role a: replicas %d gangMinimum %d, want both 2 (the scale refused, gangMinimum kept)", *md.Spec.Roles[0].Replicas, *md.Spec.Roles[0].GangMinimum)
	}
	// Reconciling goes on: a lost pod comes back.
	pods := e.kube.CoreV1().Pods(e.ns)
	old, err := pods.Get(e.ctx, "gang-0-b-0", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := pods.Delete(e.ctx, "gang-0-b-0", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "gang-0-b-0 created again", func() bool {
		p, err := pods.Get(e.ctx, "gang-0-b-0", metav1.GetOptions{})
		return err == nil && p.UID != old.UID
	})
	// Refused once, not retried.
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range evs.Items {
		if refused(ev, "ModelDeployment", "gang") && ev.Count > 1 {
			t.Errorf("ScaleRefused on the deployment %d times, want once: %s", ev.Count, ev.Message)
		}
	}
}

const bigDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"big"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"r","kind":"mixed","replicas":2,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`

// TestRoleScalerScaleUnderTooManyPods: a running deployment scaled above
// MaxPods is refused (TooManyPods); scaling its role down through the
// RoleScaler, the documented way, is still taken and makes it valid.
func TestRoleScalerScaleUnderTooManyPods(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	if err := e.applyDoc(t, bigDoc); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "big"}
	rs := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns)
	testutil.WaitFor(t, wait, "2 pods and RoleScaler big-r", func() bool {
		_, err := rs.Get(e.ctx, "big-r", metav1.GetOptions{})
		return err == nil && len(e.pods(t, sel)) == 2
	})
	const groups = 11 // × 1000 replicas: over MaxPods
	patch := fmt.Sprintf(`[{"op":"replace","path":"/spec/groups","value":%d},{"op":"replace","path":"/spec/roles/0/replicas","value":1000}]`, groups)
	if _, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Patch(e.ctx, "big", types.JSONPatchType, []byte(patch), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "big refused (TooManyPods)", func() bool {
		c := meta.FindStatusCondition(e.md(t, "big").Status.Conditions, v1alpha1.ConditionProgressing)
		return c != nil && c.Reason == reasonTooManyPods
	})
	e.setScale(t, rs, "big-r", 1)
	testutil.WaitFor(t, wait, "role r at 1 replica, 11 groups of pods, TooManyPods gone", func() bool {
		md := e.md(t, "big")
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionProgressing)
		return *md.Spec.Roles[0].Replicas == 1 && c != nil && c.Reason != reasonTooManyPods && len(e.pods(t, sel)) == groups
	})
}

// TestScalerConflictClearedWhenHolderGoes: a RoleScaler of another
// deployment's spec holding the name <md>-<role> is reported
// (RoleScalerConflict); deleting it brings md back, which creates its own
// RoleScaler and clears the condition without any other event.
func TestScalerConflictClearedWhenHolderGoes(t *testing.T) {
	e := newEnv(t)
	e.userScaler(t, "z-r", "other", "r", 1)
	e.startController(t, e.srv.Config)
	const doc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"z"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"r","kind":"mixed","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}`
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "RoleScalerConflict on z", func() bool {
		return conditionTrue(e.md(t, "z").Status.Conditions, v1alpha1.ConditionRoleScalerConflict)
	})
	rs := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns)
	if err := rs.Delete(e.ctx, "z-r", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "z's own RoleScaler z-r and the conflict cleared", func() bool {
		u, err := rs.Get(e.ctx, "z-r", metav1.GetOptions{})
		if err != nil {
			return false
		}
		md := e.md(t, "z")
		c := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionRoleScalerConflict)
		return metav1.IsControlledBy(u, md) && c != nil && c.Status == metav1.ConditionFalse
	})
}
