package orchestrator

import (
	"io"
	"log/slog"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

const pdDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"pd"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"prefill","kind":"prefill","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}},
  {"name":"decode","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"pd"},
 "spec":{"target":"pd","stableWindowSeconds":1,"panicWindowSeconds":1,"scaleDownCooldownSeconds":0,
  "roles":[{"name":"prefill","minReplicas":1,"maxReplicas":6,"metrics":[{"name":"waitingRequests","target":10}]},
           {"name":"decode","minReplicas":1,"maxReplicas":6,"metrics":[{"name":"waitingRequests","target":10}]}],
  "ratio":{"numeratorRole":"prefill","denominatorRole":"decode","minRatio":0.5,"maxRatio":1}}}`

func gossipNode(t *testing.T, name, role string, join ...string) *gossip.Node {
	t.Helper()
	c := gossip.DefaultConfig()
	c.Name, c.Profile, c.Join = name, "local", join
	c.BroadcastInterval, c.PushPullInterval, c.RejoinInterval = 50*time.Millisecond, 500*time.Millisecond, 200*time.Millisecond
	c.Meta = gossip.NodeMeta{Role: role, ID: name}
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	n, err := gossip.New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

// TestAutoscalingPolicyScalesRolesFromTheMesh: a sidecar gossips its decode
// engine's queue (40 waiting, target 10 per replica); the orchestrator, a
// gossip member, scales decode to 4 through the RoleScaler's /scale, and the
// ratio band (prefill/decode in [0.5, 1]) raises the idle prefill role to 2.
func TestAutoscalingPolicyScalesRolesFromTheMesh(t *testing.T) {
	e := newEnv(t)
	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	side := gossipNode(t, "sidecar", gossip.RoleSidecar, orch.Addr())
	side.SetEngine(gossip.EngineState{ID: "pd-0-decode-0", Model: "m", EngineRole: "decode", Waiting: 40, Running: 8})
	side.SetEngine(gossip.EngineState{ID: "pd-0-prefill-0", Model: "m", EngineRole: "prefill"})
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to see both engines", func() bool { return len(orch.Engines()) == 2 })

	e.startAutoscaler(t, orch)

	objs, _ := kubetest.Decode(stringsReader(pdDoc))
	if err := kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "decode at 4 and prefill at 2 replicas, as pods", func() bool {
		md := e.md(t, "pd")
		return *md.Spec.Roles[0].Replicas == 2 && *md.Spec.Roles[1].Replicas == 4 &&
			len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "pd"})) == 6
	})
	var ap v1alpha1.AutoscalingPolicy
	testutil.WaitFor(t, wait, "policy status: desired replicas and the ratio condition", func() bool {
		u, err := e.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(e.ns).Get(e.ctx, "pd", metav1.GetOptions{})
		if err != nil {
			return false
		}
		ap = v1alpha1.AutoscalingPolicy{}
		_ = runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &ap)
		return len(ap.Status.Roles) == 2 && ap.Status.Roles[1].DesiredReplicas == 4 && ap.Status.Roles[0].DesiredReplicas == 2 &&
			conditionTrue(ap.Status.Conditions, v1alpha1.ConditionRatioConstraintActive) &&
			conditionTrue(ap.Status.Conditions, v1alpha1.ConditionScalingActive)
	})
	if ap.Status.LastScaleTime == nil {
		t.Error("no lastScaleTime")
	}
	// Load gone: decode comes back down to its min, prefill with it (band).
	side.SetEngine(gossip.EngineState{ID: "pd-0-decode-0", Model: "m", EngineRole: "decode"})
	testutil.WaitFor(t, wait, "both roles back at 1", func() bool {
		md := e.md(t, "pd")
		return *md.Spec.Roles[0].Replicas == 1 && *md.Spec.Roles[1].Replicas == 1
	})
}
