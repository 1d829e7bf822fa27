package orchestrator

import (
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	corelisters "k8s.io/client-go/listers/core/v1"
	"k8s.io/client-go/tools/cache"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

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
