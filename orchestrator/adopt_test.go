package orchestrator

import (
	"errors"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// beforeScalePut runs hook before every PUT of a /scale the client makes,
// on the test's own (unwrapped) clients: a write that lands between the
// controller's read and its write, as another writer's would.
func beforeScalePut(cfg *rest.Config, hook func()) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.WrapTransport = func(rt http.RoundTripper) http.RoundTripper {
		return roundTripper(func(r *http.Request) (*http.Response, error) {
			if r.Method == http.MethodPut && strings.HasSuffix(r.URL.Path, "/scale") {
				hook()
			}
			return rt.RoundTrip(r)
		})
	}
	return c
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// TestScaleWorkloadConflict: a 409 on an adopted workload's /scale is no
// scale. A write that only changed the object (a label: the workload
// controller's status writes do the same) is retried on a fresh read and
// lands; one on every attempt, or another writer's new replicas, return
// errScaleConflict (reason ScaleConflict, no Scaled event, no lastScaleTime)
// and nothing is written over the other writer's value.
func TestScaleWorkloadConflict(t *testing.T) {
	e := newEnv(t)
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "llm", Labels: map[string]string{v1alpha1.LabelRoleKind: "decode"}},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llm"}},
			Template: engineTemplate("llm", "decode")},
	}
	if _, err := e.kube.AppsV1().Deployments(e.ns).Create(e.ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var touches atomic.Int32 // how many PUTs the hook still precedes with a label write
	var otherWriter atomic.Int32
	seq := 0
	hook := func() {
		if otherWriter.Load() > 0 {
			s, err := e.kube.AppsV1().Deployments(e.ns).GetScale(e.ctx, "llm", metav1.GetOptions{})
			if err != nil {
				t.Error(err)
				return
			}
			s.Spec.Replicas = otherWriter.Load()
			if _, err := e.kube.AppsV1().Deployments(e.ns).UpdateScale(e.ctx, "llm", s, metav1.UpdateOptions{}); err != nil {
				t.Error(err)
			}
			return
		}
		if touches.Add(-1) < 0 {
			return
		}
		seq++
		patch := `{"metadata":{"labels":{"touched":"` + strings.Repeat("x", seq) + `"}}}`
		if _, err := e.kube.AppsV1().Deployments(e.ns).Patch(e.ctx, "llm", "application/merge-patch+json", []byte(patch), metav1.PatchOptions{}); err != nil {
			t.Error(err)
		}
	}
	c := &Controller{dyn: dynamic.NewForConfigOrDie(beforeScalePut(e.srv.Config, hook)), kube: kubernetes.NewForConfigOrDie(e.srv.Config)}
	ref := &v1alpha1.WorkloadRef{Kind: v1alpha1.WorkloadDeployment, Name: "llm"}
	replicas := func() int32 {
		t.Helper()
		s, err := e.kube.AppsV1().Deployments(e.ns).GetScale(e.ctx, "llm", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Spec.Replicas
	}
	scale := func(n int32) error {
		t.Helper()
		tg, err := c.adoptWorkload(e.ctx, e.ns, "decode", ref)
		if err != nil {
			t.Fatal(err)
		}
		return tg.scale(e.ctx, n)
	}

	touches.Store(1) // one 409, then the retry lands
	if err := scale(3); err != nil || replicas() != 3 {
		t.Fatalf("one 409: %v, %d replicas; want the retry to scale to 3", err, replicas())
	}
	touches.Store(scaleAttempts) // 409 on every attempt
	err := scale(5)
	var te *targetError
	if !errors.Is(err, errScaleConflict) || !errors.As(err, &te) || te.reason != reasonScaleConflict || replicas() != 3 {
		t.Fatalf("409 on every attempt: %v, %d replicas; want errScaleConflict (ScaleConflict) and 3 kept", err, replicas())
	}
	if se := scaleError("decode", err); se.reason != reasonScaleConflict {
		t.Errorf("the policy reports it as %q, want %q", se.reason, reasonScaleConflict)
	}
	touches.Store(0)
	otherWriter.Store(7) // another writer scales to 7 between the step's read and its write
	err = scale(5)
	otherWriter.Store(0)
	if !errors.Is(err, errScaleConflict) || replicas() != 7 {
		t.Fatalf("another writer's 7: %v, %d replicas; want errScaleConflict and its 7 kept", err, replicas())
	}
	if err := scale(2); err != nil || replicas() != 2 {
		t.Fatalf("no conflict: %v, %d replicas; want 2", err, replicas())
	}
}

// mdTargets resolves a policy's ModelDeployment targets from listers
// holding md alone (no API server: the budget is arithmetic on its spec).
func mdTargets(t *testing.T, md *v1alpha1.ModelDeployment, ap *v1alpha1.AutoscalingPolicy) map[string]roleTarget {
	t.Helper()
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(md)
	if err != nil {
		t.Fatal(err)
	}
	idx := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	if err := idx.Add(&unstructured.Unstructured{Object: obj}); err != nil {
		t.Fatal(err)
	}
	pods := cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{cache.NamespaceIndex: cache.MetaNamespaceIndexFunc})
	c := &Controller{mds: cache.NewGenericLister(idx, v1alpha1.ModelDeploymentsResource.GroupResource()), pods: corelisters.NewPodLister(pods)}
	targets, err := c.modelDeploymentTargets(ap)
	if err != nil {
		t.Fatal(err)
	}
	return targets
}

// TestModelDeploymentPodBudget: the report's ModelDeployment h0, 11 groups
// of prefill (1 replica, 1 worker: 2 pods) and decode, and a policy that
// scales decode alone up to 950 under a demand far above it. 950 × 11 pods
// would be over the 10000 pods (v1alpha1.MaxPods) the controller lets a
// deployment have (TooManyPods: it is frozen). The targets' budget holds
// decode at 907 (9977 pods + prefill's 22 = 9999), with a reason the
// status shows, also when decode is already over it (the frozen deployment
// is brought back under it).
func TestModelDeploymentPodBudget(t *testing.T) {
	eleven, one, many := int32(11), int32(1), int32(950)
	md := &v1alpha1.ModelDeployment{
		TypeMeta:   metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ModelDeployment"},
		ObjectMeta: metav1.ObjectMeta{Name: "h0", Namespace: "t5"},
		Spec: v1alpha1.ModelDeploymentSpec{Model: "m", Groups: &eleven, Roles: []v1alpha1.Role{
			{Name: "prefill", Replicas: &one, Workers: &v1alpha1.Workers{Count: 1}},
			{Name: "decode", Replicas: &many},
		}},
	}
	ap := &v1alpha1.AutoscalingPolicy{ObjectMeta: metav1.ObjectMeta{Name: "big", Namespace: "t5"},
		Spec: v1alpha1.AutoscalingPolicySpec{Target: "h0", Roles: []v1alpha1.RoleAutoscaling{
			{Name: "decode", MinReplicas: 1, MaxReplicas: 950, Metrics: []v1alpha1.MetricTarget{{Name: autoscale.WaitingRequests, Target: 10}}}}}}
	targets := mdTargets(t, md, ap)
	b := podBudget(targets)
	if b == nil || b.Limit != v1alpha1.MaxPods || b.PerReplica["prefill"] != 22 || b.PerReplica["decode"] != 11 || b.Of != "ModelDeployment h0" {
		t.Fatalf("budget %+v, want %d pods, prefill 22 and decode 11 a replica", b, v1alpha1.MaxPods)
	}
	p := PolicyFromSpec(&ap.Spec)
	p.MaxUpRate = 1000
	for _, from := range []int32{1, 950} {
		a, err := autoscale.New(p)
		if err != nil {
			t.Fatal(err)
		}
		tg := targets["decode"]
		tg.current = from
		targets["decode"] = tg
		obs := observe(targets, map[string]gossip.EngineView{})
		obs["decode"].Metrics[autoscale.WaitingRequests] = 1e7
		res := a.StepWithin(time.Unix(0, 0), obs, nil, podBudget(targets))
		d := res.Roles["decode"]
		if d.Desired != 907 || !strings.Contains(d.Reason, "pod budget: ModelDeployment h0 holds at most 10000 pods") || !res.Budget.Limited {
			t.Errorf("decode from %d: %+v (budget %+v), want 907 with the pod budget's reason", from, d, res.Budget)
		}
	}
	// Adopted workloads have no budget.
	if b := podBudget(map[string]roleTarget{"decode": {current: 3, groups: 1, workload: "Deployment/x"}}); b != nil {
		t.Errorf("adopted: budget %+v, want none", b)
	}
}
