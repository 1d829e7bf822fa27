package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// lwsCRD is the served shape of LeaderWorkerSet (leaderworkerset.x-k8s.io/v1)
// with its scale subresource as upstream declares it (specReplicasPath
// .spec.replicas, statusReplicasPath .status.replicas, labelSelectorPath
// .status.hpaPodSelector); the schema is trimmed, and LWS's controller
// cannot run here, so the test plays it (pods, hpaPodSelector).
const lwsCRD = `{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"leaderworkersets.leaderworkerset.x-k8s.io"},
 "spec":{"group":"leaderworkerset.x-k8s.io","scope":"Namespaced",
  "names":{"kind":"LeaderWorkerSet","plural":"leaderworkersets","singular":"leaderworkerset","listKind":"LeaderWorkerSetList"},
  "versions":[{"name":"v1","served":true,"storage":true,
   "subresources":{"status":{},"scale":{"specReplicasPath":".spec.replicas","statusReplicasPath":".status.replicas","labelSelectorPath":".status.hpaPodSelector"}},
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}`

const sloAdoptDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"slo"},
 "spec":{"stableWindowSeconds":1,"panicWindowSeconds":1,"scaleDownCooldownSeconds":0,
  "roles":[
   {"name":"prefill","minReplicas":1,"maxReplicas":8,"workload":{"kind":"Deployment","name":"llm-prefill"}},
   {"name":"decode","minReplicas":1,"maxReplicas":8,"workload":{"kind":"LeaderWorkerSet","selector":{"matchLabels":{"kvmesh.io/role-kind":"decode"}}}}],
  "slo":{"prefillRole":"prefill","decodeRole":"decode","ttftMilliseconds":500,"tpotMilliseconds":50,
         "prefillTokensPerSecond":1000,"decodeStreamsPerReplica":8}}}`

// TestAdoptLeaderWorkerSetInSLOMode: on an API server that serves
// LeaderWorkerSets, an SLO-mode policy adopts a Deployment (prefill) and a
// LeaderWorkerSet (decode, through the dynamic client and its /scale). An
// ingress-like gossip member publishes the ingress's TTFT/TPOT summary
// (8000 prompt tokens/s, latencies well under target: corrections clamp to
// 0.5), a sidecar gossips 48 running streams on the LWS leader: prefill goes
// to ceil(8000/1000 × 0.5) = 4, decode to ceil(48/8 × 0.5) = 3 groups, and
// SLOAtRisk is False.
func TestAdoptLeaderWorkerSetInSLOMode(t *testing.T) {
	s := kubetest.StartT(t, kubetest.Options{})
	installCRDs(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	e := &env{srv: s, ns: s.Namespace(t), kube: kubernetes.NewForConfigOrDie(s.Config), dyn: dynamic.NewForConfigOrDie(s.Config), ctx: ctx}
	if err := e.applyDoc(t, lwsCRD); err != nil {
		t.Fatal(err)
	}
	lwsRes := workloadResources[v1alpha1.WorkloadLeaderWorkerSet]
	lws := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
		"metadata": map[string]any{"name": "llm-decode", "labels": map[string]any{v1alpha1.LabelRoleKind: "decode"}},
		"spec":     map[string]any{"replicas": int64(1), "leaderWorkerTemplate": map[string]any{"size": int64(2)}},
	}}
	created, err := e.dyn.Resource(lwsRes).Namespace(e.ns).Create(ctx, lws, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	leaderSel := "leaderworkerset.sigs.k8s.io/name=llm-decode,leaderworkerset.sigs.k8s.io/worker-index=0"
	_ = unstructured.SetNestedField(created.Object, leaderSel, "status", "hpaPodSelector")
	_ = unstructured.SetNestedField(created.Object, int64(1), "status", "replicas")
	if _, err := e.dyn.Resource(lwsRes).Namespace(e.ns).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	one := int32(1)
	dep := &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Name: "llm-prefill"},
		Spec: appsv1.DeploymentSpec{Replicas: &one, Selector: &metav1.LabelSelector{MatchLabels: map[string]string{"app": "llm-prefill"}},
			Template: engineTemplate("llm-prefill", "prefill")},
	}
	if _, err := e.kube.AppsV1().Deployments(e.ns).Create(ctx, dep, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.enginePod(t, "llm-prefill-5c6d-xyz", "llm-prefill", "prefill")
	leader := engineTemplate("llm-decode", "decode")
	leader.Labels["leaderworkerset.sigs.k8s.io/name"] = "llm-decode"
	leader.Labels["leaderworkerset.sigs.k8s.io/worker-index"] = "0"
	if _, err := e.kube.CoreV1().Pods(e.ns).Create(ctx, podFrom("llm-decode-0", leader), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}

	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	side := gossipNode(t, "sidecar", gossip.RoleSidecar, orch.Addr())
	ing := gossipNode(t, "ingress", gossip.RoleIngress, orch.Addr())
	side.SetEngine(gossip.EngineState{ID: "llm-decode-0", Model: "m", EngineRole: "decode", Running: 48})
	side.SetEngine(gossip.EngineState{ID: "llm-prefill-5c6d-xyz", Model: "m", EngineRole: "prefill"})
	rec := ingress.NewSLORecorder(ingress.SLOConfig{Interval: time.Second})
	for range 8 {
		rec.Observe("llm-prefill-5c6d-xyz", "llm-decode-0", 100*time.Millisecond, 10*time.Millisecond, 1000)
	}
	if err := rec.Tick(time.Now(), ing); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to see the engines and the summary", func() bool {
		return len(orch.Engines()) == 2 && len(orch.AppStates(SLOStateName)) == 1
	})

	c := DefaultConfig()
	c.Namespace, c.LeaderElection, c.Load, c.AutoscaleInterval = e.ns, false, orch, 200*time.Millisecond
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := New(s.Config, c)
	if err != nil {
		t.Fatal(err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- ctrl.Run(rctx) }()
	defer func() { rcancel(); <-done }()

	if err := e.applyDoc(t, sloAdoptDoc); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "prefill Deployment at 4 and the LeaderWorkerSet at 3 groups", func() bool {
		d, err := e.kube.AppsV1().Deployments(e.ns).GetScale(ctx, "llm-prefill", metav1.GetOptions{})
		if err != nil {
			return false
		}
		l, err := e.dyn.Resource(lwsRes).Namespace(e.ns).Get(ctx, "llm-decode", metav1.GetOptions{})
		if err != nil {
			return false
		}
		n, _, _ := unstructured.NestedInt64(l.Object, "spec", "replicas")
		return d.Spec.Replicas == 4 && n == 3
	})
	testutil.WaitFor(t, wait, "SLOAtRisk False with the measured inputs", func() bool {
		ap := e.policy(t, "slo")
		cnd := meta.FindStatusCondition(ap.Status.Conditions, v1alpha1.ConditionSLOAtRisk)
		return cnd != nil && cnd.Status == metav1.ConditionFalse && cnd.Reason == "WithinTarget" &&
			len(ap.Status.Roles) == 2 && ap.Status.Roles[1].Workload == "LeaderWorkerSet/llm-decode"
	})
}
