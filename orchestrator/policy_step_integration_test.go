package orchestrator

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	typedcorev1 "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// fakeMesh is a mesh the test sets: waiting requests by engine id.
type fakeMesh struct {
	mu      sync.Mutex
	waiting map[string]int
}

func newFakeMesh() *fakeMesh { return &fakeMesh{waiting: map[string]int{}} }

func (m *fakeMesh) set(id string, waiting int) {
	m.mu.Lock()
	m.waiting[id] = waiting
	m.mu.Unlock()
}

func (m *fakeMesh) Engines() []gossip.EngineView {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []gossip.EngineView
	for id, w := range m.waiting {
		out = append(out, gossip.EngineView{EngineState: gossip.EngineState{ID: id, Model: "m", Waiting: w}})
	}
	return out
}

// stepper runs a controller of the test's namespace whose informers and
// reconcile worker run, but whose policies are stepped by the test alone,
// at the times it gives (stepPolicies): the autoscaler's windows and
// cool-downs are then a matter of those times, not of the wall clock. cfg
// nil means the API server's admin config.
func (e *env) stepper(t *testing.T, load LoadSource, cfg *rest.Config) *Controller {
	t.Helper()
	if cfg == nil {
		cfg = e.srv.Config
	}
	c := DefaultConfig()
	c.Namespace, c.LeaderElection, c.Load = e.ns, false, load
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	ctrl.broadcaster.StartRecordingToSink(&typedcorev1.EventSinkImpl{Interface: ctrl.kube.CoreV1().Events("")})
	ctrl.kubeInformers.Start(ctx.Done())
	ctrl.dynInformers.Start(ctx.Done())
	var wg sync.WaitGroup
	t.Cleanup(func() {
		cancel()
		ctrl.queue.ShutDown()
		wg.Wait()
		ctrl.kubeInformers.Shutdown()
		ctrl.dynInformers.Shutdown()
		ctrl.broadcaster.Shutdown()
	})
	if !cache.WaitForCacheSync(e.ctx.Done(), ctrl.synced...) {
		t.Fatal("caches did not sync")
	}
	wg.Go(func() { // one worker: a RoleScaler's /scale reaches its ModelDeployment
		for ctrl.processNext(ctx) {
		}
	})
	return ctrl
}

// cached waits until the controller's cache holds policy name at the
// API server's version, and returns it.
func (e *env) cached(t *testing.T, ctrl *Controller, name string) *v1alpha1.AutoscalingPolicy {
	t.Helper()
	var ap *v1alpha1.AutoscalingPolicy
	testutil.WaitFor(t, wait, "the cache to show policy "+name+" as the API server has it", func() bool {
		want := e.policy(t, name)
		o, err := ctrl.policies.ByNamespace(e.ns).Get(name)
		if err != nil || o.(metav1.Object).GetResourceVersion() != want.ResourceVersion {
			return false
		}
		ap = want
		return true
	})
	return ap
}

// scaledDeployment creates a Deployment of one replica and its engine pod
// (no kube-controller-manager runs here), labelled app=<name> and the role
// kind, with extra labels on the Deployment.
func (e *env) scaledDeployment(t *testing.T, name string, extra map[string]string) {
	t.Helper()
	one := int32(1)
	l := map[string]string{v1alpha1.LabelRoleKind: "decode"}
	for k, v := range extra {
		l[k] = v
	}
	dep := &appsv1.Deployment{ObjectMeta: metav1.ObjectMeta{Name: name, Labels: l},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": name}},
			Template: engineTemplate(name, "decode")}}
	if _, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.enginePod(t, name+"-0", name, "decode")
}

func (e *env) deploymentScale(t *testing.T, name string) int32 {
	t.Helper()
	s, err := e.kube.AppsV1().Deployments(e.ns).GetScale(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return s.Spec.Replicas
}

// adoptPolicy is a policy adopting Deployment dep by name as role decode
// (waitingRequests, target 10), with the spec fields in extra.
func adoptPolicy(name, dep, extra string, max int) string {
	return `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"` + name + `"},
 "spec":{` + extra + `"roles":[{"name":"decode","minReplicas":1,"maxReplicas":` + strconv.Itoa(max) + `,
  "workload":{"kind":"Deployment","name":"` + dep + `"},"metrics":[{"name":"waitingRequests","target":10}]}]}}`
}

func roleStatus(ap *v1alpha1.AutoscalingPolicy, role string) v1alpha1.RoleAutoscalingStatus {
	for _, r := range ap.Status.Roles {
		if r.Name == role {
			return r
		}
	}
	return v1alpha1.RoleAutoscalingStatus{}
}

// warningEvent waits for a Warning event of the reason on the policy.
func (e *env) warningEvent(t *testing.T, policy, reason string) {
	t.Helper()
	testutil.WaitFor(t, wait, "a Warning event "+reason+" on "+policy, func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
			return ev.Type == corev1.EventTypeWarning && ev.Reason == reason && ev.InvolvedObject.Name == policy
		})
	})
}

// TestPolicyEditAndRestartKeepCooldown: decode, scaled up to 6 and idle
// since, is held by its 300 s scale-down cool-down. Raising its
// maxReplicas (an edit: a new generation) keeps the autoscaler's state, and
// so does a restart (a new controller: its autoscaler starts from the
// policy's status.lastScaleTime): decode stays at 6 until the cool-down
// ends, then halves.
func TestPolicyEditAndRestartKeepCooldown(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	e.scaledDeployment(t, "dec", nil)
	mesh.set("dec-0", 60)
	ctrl := e.stepper(t, mesh, nil)
	const knobs = `"stableWindowSeconds":30,"panicWindowSeconds":10,"scaleDownCooldownSeconds":300,`
	if err := e.applyDoc(t, adoptPolicy("p", "dec", knobs, 6)); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(time.Now().Unix(), 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	for i, want := range []int32{2, 4, 6} {
		e.cached(t, ctrl, "p")
		ctrl.stepPolicies(e.ctx, at(i))
		if got := e.deploymentScale(t, "dec"); got != want {
			t.Fatalf("step %d: decode at %d, want %d", i, got, want)
		}
	}
	mesh.set("dec-0", 0)
	e.cached(t, ctrl, "p")
	ctrl.stepPolicies(e.ctx, at(45))
	if r := roleStatus(e.cached(t, ctrl, "p"), "decode"); r.DesiredReplicas != 6 || r.Reason != "scale-down cool-down" {
		t.Fatalf("idle within the cool-down: %+v", r)
	}

	if err := e.applyDoc(t, adoptPolicy("p", "dec", knobs, 7)); err != nil {
		t.Fatal(err)
	}
	if ap := e.cached(t, ctrl, "p"); ap.Generation != 2 {
		t.Fatalf("generation %d after the edit", ap.Generation)
	}
	ctrl.stepPolicies(e.ctx, at(48))
	r := roleStatus(e.cached(t, ctrl, "p"), "decode")
	if got := e.deploymentScale(t, "dec"); got != 6 || r.Reason != "scale-down cool-down" {
		t.Fatalf("after raising maxReplicas: decode at %d (%+v), want 6 held by the cool-down", got, r)
	}

	restarted := e.stepper(t, mesh, nil)
	ap := e.cached(t, restarted, "p")
	if ap.Status.LastScaleTime == nil || !ap.Status.LastScaleTime.Time.Equal(at(2)) {
		t.Fatalf("lastScaleTime %v, want %v", ap.Status.LastScaleTime, at(2))
	}
	restarted.stepPolicies(e.ctx, at(51))
	r = roleStatus(e.cached(t, restarted, "p"), "decode")
	if got := e.deploymentScale(t, "dec"); got != 6 || r.Reason != "scale-down cool-down" {
		t.Fatalf("after a restart: decode at %d (%+v), want 6 held by the cool-down", got, r)
	}
	restarted.stepPolicies(e.ctx, at(302))
	if got := e.deploymentScale(t, "dec"); got != 3 {
		t.Fatalf("after the cool-down: decode at %d, want 3", got)
	}
}

// TestSelectorAdoptionConflicts: three policies adopt one Deployment, by
// two selectors and by name. What they resolve to is the same workload: the
// oldest (here by name) scales it, the other two say PolicyConflict naming
// it, with Warning events, and never write its /scale (each wants another
// size: target 10, 20, 5 for 40 waiting).
func TestSelectorAdoptionConflicts(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	e.scaledDeployment(t, "ad-dec", map[string]string{"app": "llama"})
	mesh.set("ad-dec-0", 40)
	ctrl := e.stepper(t, mesh, nil)
	policy := func(name, workload string, target int) string {
		return `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"` + name + `"},
 "spec":{"stableWindowSeconds":1,"panicWindowSeconds":1,"scaleDownCooldownSeconds":0,"roles":[{"name":"decode","minReplicas":1,"maxReplicas":8,
  "workload":` + workload + `,"metrics":[{"name":"waitingRequests","target":` + strconv.Itoa(target) + `}]}]}}`
	}
	doc := policy("adopt-a", `{"kind":"Deployment","selector":{"matchLabels":{"app":"llama"}}}`, 10) + "\n---\n" +
		policy("adopt-b", `{"kind":"Deployment","selector":{"matchLabels":{"kvmesh.io/role-kind":"decode"}}}`, 20) + "\n---\n" +
		policy("adopt-c", `{"kind":"Deployment","name":"ad-dec"}`, 5)
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(time.Now().Unix(), 0)
	for i, want := range []int32{2, 4, 4, 4} {
		for _, p := range []string{"adopt-a", "adopt-b", "adopt-c"} {
			e.cached(t, ctrl, p)
		}
		ctrl.stepPolicies(e.ctx, t0.Add(time.Duration(i)*2*time.Second))
		if got := e.deploymentScale(t, "ad-dec"); got != want {
			t.Fatalf("step %d: ad-dec at %d, want %d (adopt-a's)", i, got, want)
		}
	}
	if s, _ := scalingActive(e.policy(t, "adopt-a")); s != metav1.ConditionTrue {
		t.Errorf("adopt-a: ScalingActive %q", s)
	}
	for _, p := range []string{"adopt-b", "adopt-c"} {
		ap := e.policy(t, p)
		c := meta.FindStatusCondition(ap.Status.Conditions, v1alpha1.ConditionScalingActive)
		if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonPolicyConflict ||
			!strings.Contains(c.Message, "adopt-a") || !strings.Contains(c.Message, "Deployment/ad-dec") || len(ap.Status.Roles) != 0 {
			t.Errorf("%s: %+v, roles %+v; want PolicyConflict naming adopt-a and Deployment/ad-dec", p, c, ap.Status.Roles)
		}
		e.warningEvent(t, p, reasonPolicyConflict)
	}
}

// TestInvalidOlderPolicyClaimsNothing: an older policy the autoscaler
// refuses (a ratio naming a role it does not scale, which the schema
// admits) scales nothing, so it does not take the workload from a newer
// valid one; it says InvalidPolicy with a Warning event and counts it.
func TestInvalidOlderPolicyClaimsNothing(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	e.scaledDeployment(t, "c0", nil)
	mesh.set("c0-0", 40)
	ctrl := e.stepper(t, mesh, nil)
	before := promtest.ToFloat64(policyTargetErrors.WithLabelValues(reasonInvalidPolicy))
	broken := adoptPolicy("aa-broken", "c0", `"ratio":{"numeratorRole":"decode","denominatorRole":"prefill","minRatio":1,"maxRatio":2},`, 6)
	if err := e.applyDoc(t, broken+"\n---\n"+adoptPolicy("zz-good", "c0", "", 6)); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "aa-broken")
	e.cached(t, ctrl, "zz-good")
	ctrl.stepPolicies(e.ctx, time.Now())
	if got := e.deploymentScale(t, "c0"); got != 2 {
		t.Errorf("c0 at %d, want 2 (zz-good's first step)", got)
	}
	if s, r := scalingActive(e.policy(t, "zz-good")); s != metav1.ConditionTrue {
		t.Errorf("zz-good: %s %s, want ScalingActive True", s, r)
	}
	if s, r := scalingActive(e.policy(t, "aa-broken")); s != metav1.ConditionFalse || r != reasonInvalidPolicy {
		t.Errorf("aa-broken: %s %s, want False InvalidPolicy", s, r)
	}
	e.warningEvent(t, "aa-broken", reasonInvalidPolicy)
	if got := promtest.ToFloat64(policyTargetErrors.WithLabelValues(reasonInvalidPolicy)); got != before+1 {
		t.Errorf("target errors {InvalidPolicy}: %v, want %v", got, before+1)
	}
}

// TestMinZeroNeedsAWakeSource: a role with minReplicas 0 that only mesh
// metrics observe would be held at zero forever once there (no engine, no
// load observed): the policy is refused with CannotScaleFromZero, a Warning
// event naming the fix, and scales nothing; with minReplicas 1 it runs.
func TestMinZeroNeedsAWakeSource(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	e.scaledDeployment(t, "z", nil)
	mesh.set("z-0", 0)
	ctrl := e.stepper(t, mesh, nil)
	zero := strings.Replace(adoptPolicy("p", "z", "", 4), `"minReplicas":1`, `"minReplicas":0`, 1)
	if err := e.applyDoc(t, zero); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "p")
	ctrl.stepPolicies(e.ctx, time.Now())
	ap := e.policy(t, "p")
	c := meta.FindStatusCondition(ap.Status.Conditions, v1alpha1.ConditionScalingActive)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonCannotScaleFromZero ||
		!strings.Contains(c.Message, "role decode") || !strings.Contains(c.Message, "minReplicas to 1") {
		t.Fatalf("condition %+v, want CannotScaleFromZero naming the role and the fix", c)
	}
	if got := e.deploymentScale(t, "z"); got != 1 {
		t.Fatalf("z scaled to %d by a refused policy", got)
	}
	e.warningEvent(t, "p", reasonCannotScaleFromZero)
	if err := e.applyDoc(t, adoptPolicy("p", "z", "", 4)); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "p")
	ctrl.stepPolicies(e.ctx, time.Now())
	if s, r := scalingActive(e.policy(t, "p")); s != metav1.ConditionTrue {
		t.Fatalf("minReplicas 1: %s %s, want ScalingActive True", s, r)
	}
}

// TestRefusedPolicyConditionsNotStepped: a policy refused after steps
// that set its ratio and SLO conditions (here its vLLM ModelDeployment
// switched to sglang, which aggregateBelow cannot run on) says
// ScalingActive False InvalidPolicy, and its RatioConstraintActive and
// SLOAtRisk turn Unknown, reason ScalingInactive, rather than keep
// claiming "Aggregated" for a loop that no longer runs (tester h-orchagg
// F5); stepped again, they are evaluated again.
func TestRefusedPolicyConditionsNotStepped(t *testing.T) {
	e := newEnv(t)
	ctrl := e.sloStepper(t)
	doc := replaceAll(pdDoc, `{"name":"prefill","minReplicas":1,"maxReplicas":6,"metrics":[{"name":"waitingRequests","target":10}]}`,
		`{"name":"prefill","minReplicas":0,"maxReplicas":6}`)
	doc = replaceAll(doc, `"ratio":`, `"slo":{"prefillRole":"prefill","decodeRole":"decode","prefillTokensPerSecond":10000,"decodeStreamsPerReplica":8,"aggregateBelow":0.8},"ratio":`)
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "pd")
	t0 := time.Now()
	ctrl.stepPolicies(e.ctx, t0)
	ap := e.cached(t, ctrl, "pd")
	for _, typ := range []string{v1alpha1.ConditionRatioConstraintActive, v1alpha1.ConditionSLOAtRisk} {
		if c := meta.FindStatusCondition(ap.Status.Conditions, typ); c == nil || c.Status == metav1.ConditionUnknown {
			t.Fatalf("after a step: %s %+v, want it evaluated (%+v)", typ, c, ap.Status)
		}
	}

	e.setEngine(t, ctrl, "pd", "sglang")
	ctrl.stepPolicies(e.ctx, t0.Add(time.Second))
	ap = e.cached(t, ctrl, "pd")
	if s, r := scalingActive(ap); s != metav1.ConditionFalse || r != reasonInvalidPolicy {
		t.Fatalf("refused: ScalingActive %s %s, want False InvalidPolicy", s, r)
	}
	for _, typ := range []string{v1alpha1.ConditionRatioConstraintActive, v1alpha1.ConditionSLOAtRisk} {
		c := meta.FindStatusCondition(ap.Status.Conditions, typ)
		if c == nil || c.Status != metav1.ConditionUnknown || c.Reason != reasonScalingInactive || !strings.Contains(c.Message, reasonInvalidPolicy) {
			t.Errorf("refused: %s %+v, want Unknown %s naming InvalidPolicy", typ, c, reasonScalingInactive)
		}
	}
	if len(ap.Status.Roles) != 0 {
		t.Errorf("refused: roles %+v, want none", ap.Status.Roles)
	}

	e.setEngine(t, ctrl, "pd", "vllm")
	ctrl.stepPolicies(e.ctx, t0.Add(2*time.Second))
	ap = e.cached(t, ctrl, "pd")
	for _, typ := range []string{v1alpha1.ConditionScalingActive, v1alpha1.ConditionRatioConstraintActive, v1alpha1.ConditionSLOAtRisk} {
		if c := meta.FindStatusCondition(ap.Status.Conditions, typ); c == nil || c.Status == metav1.ConditionUnknown {
			t.Errorf("stepped again: %s %+v, want it evaluated", typ, c)
		}
	}
}

// TestDroppedBlocksDropTheirConditions: a policy edit that removes its
// ratio band and its SLO removes RatioConstraintActive and SLOAtRisk, which
// would otherwise report the last band and verdict for good.
func TestDroppedBlocksDropTheirConditions(t *testing.T) {
	e := newEnv(t)
	ctrl := e.sloStepper(t)
	doc := replaceAll(pdDoc, `"ratio":`, `"slo":{"prefillRole":"prefill","decodeRole":"decode","prefillTokensPerSecond":10000,"decodeStreamsPerReplica":8},"ratio":`)
	if err := e.applyDoc(t, doc); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "pd")
	t0 := time.Now()
	ctrl.stepPolicies(e.ctx, t0)
	ap := e.cached(t, ctrl, "pd")
	for _, typ := range []string{v1alpha1.ConditionRatioConstraintActive, v1alpha1.ConditionSLOAtRisk} {
		if meta.FindStatusCondition(ap.Status.Conditions, typ) == nil {
			t.Fatalf("after a step: no %s (%+v)", typ, ap.Status.Conditions)
		}
	}
	patch := []byte(`{"spec":{"ratio":null,"slo":null}}`)
	if _, err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).Patch(e.ctx, "pd", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "pd")
	ctrl.stepPolicies(e.ctx, t0.Add(time.Second))
	ap = e.cached(t, ctrl, "pd")
	if s, r := scalingActive(ap); s != metav1.ConditionTrue {
		t.Fatalf("after the edit: ScalingActive %s %s, want it stepped", s, r)
	}
	for _, typ := range []string{v1alpha1.ConditionRatioConstraintActive, v1alpha1.ConditionSLOAtRisk} {
		if c := meta.FindStatusCondition(ap.Status.Conditions, typ); c != nil {
			t.Errorf("after the edit that dropped its block: %s %+v", typ, c)
		}
	}
}

// sloStepper is a stepper whose one ingress gossips an SLO summary for
// pd's decode engine, read by stepPolicies only, which the test's
// goroutine calls.
func (e *env) sloStepper(t *testing.T) *Controller {
	t.Helper()
	ctrl := e.stepper(t, newFakeMesh(), nil)
	sum, err := json.Marshal(sloSummary{Version: 1, WindowSeconds: 1, Engines: []sloEngine{{ID: "pd-0-decode-0", TTFT: 0.1, TTFTN: 5, TPOT: 0.01, TPOTN: 5}}})
	if err != nil {
		t.Fatal(err)
	}
	ctrl.cfg.SLO = sloBlobs{"ingress-1": sum}
	return ctrl
}

// setEngine patches ModelDeployment name's engine and waits until the
// controller's cache shows it.
func (e *env) setEngine(t *testing.T, ctrl *Controller, name, engine string) {
	t.Helper()
	patch := []byte(`{"spec":{"engine":"` + engine + `"}}`)
	if _, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Patch(e.ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the cache to show "+name+" running "+engine, func() bool {
		o, err := ctrl.mds.ByNamespace(e.ns).Get(name)
		if err != nil {
			return false
		}
		got, _, _ := unstructured.NestedString(o.(*unstructured.Unstructured).Object, "spec", "engine")
		return got == engine
	})
}

// TestStatusIgnoresUnrelatedEngines: the status says how many of each
// role's engines the mesh knows; an engine of another workload joining the
// mesh does not rewrite it.
func TestStatusIgnoresUnrelatedEngines(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	e.scaledDeployment(t, "s", nil)
	mesh.set("s-0", 0)
	ctrl := e.stepper(t, mesh, nil)
	if err := e.applyDoc(t, adoptPolicy("p", "s", "", 1)); err != nil {
		t.Fatal(err)
	}
	e.cached(t, ctrl, "p")
	t0 := time.Now()
	ctrl.stepPolicies(e.ctx, t0)
	ap := e.cached(t, ctrl, "p")
	c := meta.FindStatusCondition(ap.Status.Conditions, v1alpha1.ConditionScalingActive)
	if c == nil || c.Message != "adopting 1 workloads; role decode: 1 of 1 engines in the mesh" {
		t.Fatalf("condition %+v", c)
	}
	mesh.set("elsewhere-0", 7)
	ctrl.stepPolicies(e.ctx, t0.Add(time.Second))
	if after := e.policy(t, "p"); after.ResourceVersion != ap.ResourceVersion {
		t.Errorf("status rewritten for an unrelated engine: %+v", after.Status.Conditions)
	}
}

// seriesOf lists the roles of a policy with a current-replicas series.
func seriesOf(t *testing.T, ns, policy string) []string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(autoscaleCurrent)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, p := range m.GetLabel() {
				l[p.GetName()] = p.GetValue()
			}
			if l["namespace"] == ns && l["policy"] == policy {
				out = append(out, l["role"])
			}
		}
	}
	slices.Sort(out)
	return out
}

// TestPolicySeriesFollowPolicies: a policy's per-role series go with a
// role dropped from it, with a lost conflict, and with the policy.
func TestPolicySeriesFollowPolicies(t *testing.T) {
	e := newEnv(t)
	mesh := newFakeMesh()
	for _, d := range []string{"pre", "dec", "other"} {
		e.scaledDeployment(t, d, nil)
	}
	ctrl := e.stepper(t, mesh, nil)
	two := `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"a"},
 "spec":{"roles":[{"name":"prefill","minReplicas":1,"maxReplicas":2,"workload":{"kind":"Deployment","name":"pre"}},
  {"name":"decode","minReplicas":1,"maxReplicas":2,"workload":{"kind":"Deployment","name":"dec"}}]}}`
	if err := e.applyDoc(t, two+"\n---\n"+adoptPolicy("b", "other", "", 2)); err != nil {
		t.Fatal(err)
	}
	step := func(names ...string) {
		for _, n := range names {
			e.cached(t, ctrl, n)
		}
		ctrl.stepPolicies(e.ctx, time.Now())
	}
	step("a", "b")
	if a, b := seriesOf(t, e.ns, "a"), seriesOf(t, e.ns, "b"); !slices.Equal(a, []string{"decode", "prefill"}) || !slices.Equal(b, []string{"decode"}) {
		t.Fatalf("series: a %v, b %v", a, b)
	}
	if err := e.applyDoc(t, adoptPolicy("a", "dec", "", 2)); err != nil { // prefill dropped
		t.Fatal(err)
	}
	step("a", "b")
	if a := seriesOf(t, e.ns, "a"); !slices.Equal(a, []string{"decode"}) {
		t.Errorf("after dropping prefill: a %v", a)
	}
	if err := e.applyDoc(t, adoptPolicy("b", "dec", "", 2)); err != nil { // b now loses to the older a
		t.Fatal(err)
	}
	step("a", "b")
	if s, r := scalingActive(e.policy(t, "b")); r != reasonPolicyConflict || len(seriesOf(t, e.ns, "b")) != 0 {
		t.Errorf("b lost (%s %s), series %v", s, r, seriesOf(t, e.ns, "b"))
	}
	if err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).Delete(e.ctx, "a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the cache to lose a", func() bool {
		_, err := ctrl.policies.ByNamespace(e.ns).Get("a")
		return err != nil
	})
	step("b")
	if a, b := seriesOf(t, e.ns, "a"), seriesOf(t, e.ns, "b"); len(a) != 0 || !slices.Equal(b, []string{"decode"}) {
		t.Errorf("after deleting a: a %v, b %v", a, b)
	}
}

const externalDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"x"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"decode","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"x"},
 "spec":{"target":"x","stableWindowSeconds":30,"panicWindowSeconds":10,"roles":[{"name":"decode","minReplicas":3,"maxReplicas":3}]}}`

// roleScale is a RoleScaler's spec.replicas as the API server has it.
func (e *env) roleScale(t *testing.T, name string) int32 {
	t.Helper()
	s, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{}, "scale")
	if err != nil {
		t.Fatal(err)
	}
	n, _, _ := unstructured.NestedInt64(s.Object, "spec", "replicas")
	return int32(n)
}

// scaleRoleScaler writes a RoleScaler's /scale as an HPA does.
func (e *env) scaleRoleScaler(t *testing.T, name string, n int32) {
	t.Helper()
	rc := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns)
	s, err := rc.Get(e.ctx, name, metav1.GetOptions{}, "scale")
	if err != nil {
		t.Fatal(err)
	}
	_ = unstructured.SetNestedField(s.Object, int64(n), "spec", "replicas")
	if _, err := rc.Update(e.ctx, s, metav1.UpdateOptions{}, "scale"); err != nil {
		t.Fatal(err)
	}
}

// settled waits until the ModelDeployment x's decode role shows n
// replicas in the API server and the caches (the worker copies the
// RoleScaler's value into it), with n pods, and the RoleScaler's status
// says so: the worker has nothing left to write, and no write of it meets
// the policy's.
func (e *env) settled(t *testing.T, ctrl *Controller, n int32) {
	t.Helper()
	testutil.WaitFor(t, wait, "decode of x at "+strconv.Itoa(int(n))+" in the API server and the caches", func() bool {
		rs, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Get(e.ctx, "x-decode", metav1.GetOptions{})
		if err != nil {
			return false
		}
		obs, _, _ := unstructured.NestedInt64(rs.Object, "status", "observedGeneration")
		cur, _, _ := unstructured.NestedInt64(rs.Object, "status", "replicas")
		if obs != rs.GetGeneration() || cur != int64(n) {
			return false
		}
		o, err := ctrl.mds.ByNamespace(e.ns).Get("x")
		if err != nil {
			return false
		}
		md := &v1alpha1.ModelDeployment{}
		if runtimeFromUnstructured(o, md) != nil || *md.Spec.Roles[0].Replicas != n {
			return false
		}
		s, err := ctrl.scalers.ByNamespace(e.ns).Get("x-decode")
		if err != nil {
			return false
		}
		v, _, _ := unstructured.NestedInt64(s.(*unstructured.Unstructured).Object, "spec", "replicas")
		return int32(v) == n && *e.md(t, "x").Spec.Roles[0].Replicas == n
	})
}

// TestExternalScalerDetected: something else (an HPA) writes the role's
// RoleScaler /scale to 1 while the policy holds it at 3. Once, the policy
// puts its value back; a second time at the next step, the policy stops
// writing the role and says ExternalScaler (ScalingActive False, Warning
// event), rather than flip the role (and its pods) at every step. Once the
// value has held for a stable window, the policy takes the role back.
func TestExternalScalerDetected(t *testing.T) {
	e := newEnv(t)
	ctrl := e.stepper(t, noEngines{}, nil)
	if err := e.applyDoc(t, externalDoc); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the RoleScaler x-decode", func() bool {
		_, err := ctrl.scalers.ByNamespace(e.ns).Get("x-decode")
		return err == nil
	})
	t0 := time.Unix(time.Now().Unix(), 0)
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	e.settled(t, ctrl, 1)
	e.cached(t, ctrl, "x")
	ctrl.stepPolicies(e.ctx, at(0))
	e.settled(t, ctrl, 3)

	for i, s := range []int{1, 2} {
		e.scaleRoleScaler(t, "x-decode", 1)
		e.settled(t, ctrl, 1)
		e.cached(t, ctrl, "x")
		ctrl.stepPolicies(e.ctx, at(s))
		if i == 0 {
			if got := e.roleScale(t, "x-decode"); got != 3 {
				t.Fatalf("after one outside write: x-decode at %d, want 3 (put back)", got)
			}
			e.settled(t, ctrl, 3)
		}
	}
	if got := e.roleScale(t, "x-decode"); got != 1 {
		t.Fatalf("after the second outside write in a row: x-decode at %d, want 1 (left to the other writer)", got)
	}
	c := meta.FindStatusCondition(e.cached(t, ctrl, "x").Status.Conditions, v1alpha1.ConditionScalingActive)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != reasonExternalScaler || !strings.Contains(c.Message, "its /scale is 1, not the 3") {
		t.Fatalf("condition %+v, want ExternalScaler", c)
	}
	e.warningEvent(t, "x", reasonExternalScaler)
	ctrl.stepPolicies(e.ctx, at(20))
	if got := e.roleScale(t, "x-decode"); got != 1 {
		t.Fatalf("within the stable window: x-decode at %d, want 1", got)
	}
	e.cached(t, ctrl, "x")
	ctrl.stepPolicies(e.ctx, at(32))
	if got := e.roleScale(t, "x-decode"); got != 3 {
		t.Fatalf("after the value held for a stable window: x-decode at %d, want 3 (taken back)", got)
	}
	if s, r := scalingActive(e.cached(t, ctrl, "x")); s != metav1.ConditionTrue {
		t.Errorf("taken back: %s %s, want ScalingActive True", s, r)
	}
}

// conflictOnce makes the first PUT of a RoleScaler's /scale meet a write
// of the RoleScaler made just before it (its resourceVersion moves), as
// another writer between the controller's GET and its PUT would: the API
// server answers 409.
type conflictOnce struct {
	rt    http.RoundTripper
	once  sync.Once
	touch func()
}

func (c *conflictOnce) RoundTrip(r *http.Request) (*http.Response, error) {
	if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/rolescalers/x-decode/scale") {
		c.once.Do(c.touch)
	}
	return c.rt.RoundTrip(r)
}

// TestScaleConflictIsNotAScale: a 409 on the RoleScaler's /scale wrote
// nothing: no Scaled event and no lastScaleTime, and the next step writes.
func TestScaleConflictIsNotAScale(t *testing.T) {
	e := newEnv(t)
	cfg := rest.CopyConfig(e.srv.Config)
	cfg.Wrap(func(rt http.RoundTripper) http.RoundTripper {
		return &conflictOnce{rt: rt, touch: func() {
			patch := []byte(`{"metadata":{"annotations":{"test/touched":"yes"}}}`)
			if _, err := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns).Patch(e.ctx, "x-decode", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
				t.Error(err)
			}
		}}
	})
	ctrl := e.stepper(t, noEngines{}, cfg)
	if err := e.applyDoc(t, externalDoc); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the RoleScaler x-decode", func() bool {
		_, err := ctrl.scalers.ByNamespace(e.ns).Get("x-decode")
		return err == nil
	})
	e.settled(t, ctrl, 1)
	e.cached(t, ctrl, "x")
	ctrl.stepPolicies(e.ctx, time.Now())
	ap := e.cached(t, ctrl, "x")
	if got := e.roleScale(t, "x-decode"); got != 1 || ap.Status.LastScaleTime != nil {
		t.Fatalf("after a 409: x-decode at %d, lastScaleTime %v; want 1 and none", got, ap.Status.LastScaleTime)
	}
	if s, r := scalingActive(ap); s != metav1.ConditionTrue {
		t.Errorf("a 409 is retried, not a failure: %s %s", s, r)
	}
	ctrl.stepPolicies(e.ctx, time.Now())
	ap = e.cached(t, ctrl, "x")
	if got := e.roleScale(t, "x-decode"); got != 3 || ap.Status.LastScaleTime == nil {
		t.Fatalf("the next step: x-decode at %d, lastScaleTime %v; want 3 and set (%+v)", got, ap.Status.LastScaleTime, ap.Status)
	}
	testutil.WaitFor(t, wait, "one Scaled event", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{FieldSelector: "involvedObject.name=x,reason=Scaled"})
		return err == nil && len(evs.Items) == 1 && evs.Items[0].Count == 1
	})
}

// TestNoLoadSourceMarksPolicies: an orchestrator without a load source (no
// --gossip-bind) runs no policy; it says so on each, replacing a previous
// leader's ScalingActive True, with a Warning event and a WARN log line;
// the conditions of its steps (here RatioConstraintActive) turn Unknown.
func TestNoLoadSourceMarksPolicies(t *testing.T) {
	e := newEnv(t)
	if err := e.applyDoc(t, adoptPolicy("p", "nothing", "", 2)); err != nil {
		t.Fatal(err)
	}
	ap := e.policy(t, "p")
	meta.SetStatusCondition(&ap.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionScalingActive, Status: metav1.ConditionTrue, Reason: "Observing", Message: "old leader"})
	meta.SetStatusCondition(&ap.Status.Conditions, metav1.Condition{Type: v1alpha1.ConditionRatioConstraintActive, Status: metav1.ConditionFalse, Reason: "WithinBand", Message: "old leader"})
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(ap)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).UpdateStatus(e.ctx, &unstructured.Unstructured{Object: obj}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	c := DefaultConfig()
	c.Namespace, c.LeaderElection = e.ns, false
	c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	ctrl, err := New(e.srv.Config, c)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "controller", ctrl.Run, nil)
	testutil.WaitFor(t, wait, "ScalingActive Unknown, reason AutoscalerDisabled", func() bool {
		c := meta.FindStatusCondition(e.policy(t, "p").Status.Conditions, v1alpha1.ConditionScalingActive)
		return c != nil && c.Status == metav1.ConditionUnknown && c.Reason == reasonAutoscalerDisabled && strings.Contains(c.Message, "--gossip-bind")
	})
	e.warningEvent(t, "p", reasonAutoscalerDisabled)
	if c := meta.FindStatusCondition(e.policy(t, "p").Status.Conditions, v1alpha1.ConditionRatioConstraintActive); c == nil ||
		c.Status != metav1.ConditionUnknown || c.Reason != reasonScalingInactive {
		t.Errorf("RatioConstraintActive %+v, want the old leader's verdict Unknown, %s", c, reasonScalingInactive)
	}
	if !strings.Contains(logs.String(), "level=WARN") || !strings.Contains(logs.String(), "will not be run") {
		t.Errorf("no warning logged:\n%s", logs.String())
	}
}
