package orchestrator

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// shippedRules are the rules of manifests/orchestrator/rbac.yaml's
// ClusterRole.
func shippedRules(t *testing.T) []rbacv1.PolicyRule {
	t.Helper()
	f, err := os.Open(kubetest.RepoFile(t, "manifests/orchestrator/rbac.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	objs, err := kubetest.Decode(f)
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if o.GetKind() == "ClusterRole" && o.GetName() == "kvmesh-orchestrator" {
			var r rbacv1.ClusterRole
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &r); err != nil {
				t.Fatal(err)
			}
			return r.Rules
		}
	}
	t.Fatal("rbac.yaml has no ClusterRole kvmesh-orchestrator")
	return nil
}

// grant binds a ClusterRole holding rules to the ServiceAccount sa of the
// test's namespace (a RoleBinding: the rules hold in that namespace only),
// replacing an earlier grant.
func (e *env) grant(t *testing.T, sa string, rules []rbacv1.PolicyRule) {
	t.Helper()
	name := "orch-" + e.ns
	crs, rbs := e.kube.RbacV1().ClusterRoles(), e.kube.RbacV1().RoleBindings(e.ns)
	_ = rbs.Delete(e.ctx, name, metav1.DeleteOptions{})
	_ = crs.Delete(e.ctx, name, metav1.DeleteOptions{})
	if _, err := crs.Create(e.ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: rules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = crs.Delete(context.Background(), name, metav1.DeleteOptions{}) })
	if _, err := rbs.Create(e.ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: sa, Namespace: e.ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
}

// serviceAccountConfig creates the ServiceAccount sa in the test's
// namespace and returns a client config with a token of it.
func (e *env) serviceAccountConfig(t *testing.T, sa string) *rest.Config {
	t.Helper()
	if _, err := e.kube.CoreV1().ServiceAccounts(e.ns).Create(e.ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: sa}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	tok, err := e.kube.CoreV1().ServiceAccounts(e.ns).CreateToken(e.ctx, sa, &authenticationv1.TokenRequest{}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return &rest.Config{Host: e.srv.URL, BearerToken: tok.Status.Token, TLSClientConfig: rest.TLSClientConfig{CAData: e.srv.CAPEM}}
}

const rbacDoc = `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"rb"},
 "spec":{"model":"m","engine":"vllm","roles":[
  {"name":"decode","kind":"decode","replicas":1,"template":{"spec":{"containers":[{"name":"engine","image":"engine:v1"}]}}}]}}
---
{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"rb"},
 "spec":{"target":"rb","stableWindowSeconds":1,"panicWindowSeconds":1,"scaleDownCooldownSeconds":0,
  "roles":[{"name":"decode","minReplicas":1,"maxReplicas":4,"metrics":[{"name":"waitingRequests","target":10}]}]}}`

// TestAutoscalingPolicyUnderRBAC runs the controller as a ServiceAccount
// holding rbac.yaml's ClusterRole rules. Without the rule on
// rolescalers/scale, the policy that wants decode at 4 says so: ScalingActive
// False (Forbidden) and a Warning event, the role unchanged. With the shipped
// rules the policy scales the role (its pods follow) and is active again.
func TestAutoscalingPolicyUnderRBAC(t *testing.T) {
	e := newEnv(t)
	rules := shippedRules(t)
	noScale := slices.DeleteFunc(slices.Clone(rules), func(r rbacv1.PolicyRule) bool {
		return slices.Contains(r.Resources, "rolescalers/scale")
	})
	cfg := e.serviceAccountConfig(t, "orchestrator")
	e.grant(t, "orchestrator", noScale)

	orch := gossipNode(t, "orchestrator", gossip.RoleOrchestrator)
	side := gossipNode(t, "sidecar", gossip.RoleSidecar, orch.Addr())
	side.SetEngine(gossip.EngineState{ID: "rb-0-decode-0", Model: "m", EngineRole: "decode", Waiting: 40})
	testutil.WaitFor(t, 30*time.Second, "the orchestrator to see the engine", func() bool { return len(orch.Engines()) == 1 })
	c := DefaultConfig()
	c.Namespace, c.LeaderElection, c.Load, c.AutoscaleInterval = e.ns, false, orch, 200*time.Millisecond
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	ctrl, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "controller", ctrl.Run, nil)
	if err := e.applyDoc(t, rbacDoc); err != nil {
		t.Fatal(err)
	}

	testutil.WaitFor(t, wait, "ScalingActive False (Forbidden) and a Warning event", func() bool {
		cond := meta.FindStatusCondition(e.policy(t, "rb").Status.Conditions, v1alpha1.ConditionScalingActive)
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == reasonForbidden && err == nil &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
				return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonForbidden && ev.InvolvedObject.Kind == "AutoscalingPolicy"
			})
	})
	if n := *e.md(t, "rb").Spec.Roles[0].Replicas; n != 1 {
		t.Fatalf("decode at %d replicas without the right to scale it", n)
	}

	e.grant(t, "orchestrator", rules)
	testutil.WaitFor(t, wait, "decode at 4 replicas, as pods, and ScalingActive True", func() bool {
		cond := meta.FindStatusCondition(e.policy(t, "rb").Status.Conditions, v1alpha1.ConditionScalingActive)
		return *e.md(t, "rb").Spec.Roles[0].Replicas == 4 && len(e.pods(t, map[string]string{v1alpha1.LabelDeployment: "rb"})) == 4 &&
			cond != nil && cond.Status == metav1.ConditionTrue
	})
}

// TestServiceRepairUnderRBAC runs the controller as a ServiceAccount holding
// rbac.yaml's ClusterRole rules, first without update on services (the
// shipped role lacked it, k8s tester 2): the deployment's Service, its
// selector edited by hand, cannot be set back, which the deployment says
// (ServiceReady False, ServiceError, a Warning event naming the forbidden
// update), and nothing else of it waits on the Service: a deleted pod is
// recreated and a scale is taken. With the shipped rules the Service is set
// back and ServiceReady is True again.
func TestServiceRepairUnderRBAC(t *testing.T) {
	e := newEnv(t)
	rules := shippedRules(t)
	noUpdate := slices.Clone(rules)
	for i, r := range noUpdate {
		if slices.Contains(r.Resources, "services") {
			r.Verbs = slices.DeleteFunc(slices.Clone(r.Verbs), func(v string) bool { return v == "update" })
			noUpdate[i] = r
		}
	}
	cfg := e.serviceAccountConfig(t, "orchestrator")
	e.grant(t, "orchestrator", noUpdate)
	c := DefaultConfig()
	c.Namespace, c.LeaderElection = e.ns, false
	c.Logger = slog.New(slog.DiscardHandler)
	ctrl, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "controller", ctrl.Run, nil)
	if err := e.applyDoc(t, replaceAll(fenceDoc, "NAME", "svcrbac")); err != nil {
		t.Fatal(err)
	}
	sel := labels.Set{v1alpha1.LabelDeployment: "svcrbac"}
	svcs := e.kube.CoreV1().Services(e.ns)
	selects := func() bool {
		svc, err := svcs.Get(e.ctx, "svcrbac", metav1.GetOptions{})
		return err == nil && svc.Spec.Selector[v1alpha1.LabelDeployment] == "svcrbac"
	}
	serviceReady := func() *metav1.Condition {
		return meta.FindStatusCondition(e.md(t, "svcrbac").Status.Conditions, v1alpha1.ConditionServiceReady)
	}
	testutil.WaitFor(t, wait, "the Service, the pod and ServiceReady True", func() bool {
		cond := serviceReady()
		return selects() && len(e.pods(t, sel)) == 1 && cond != nil && cond.Status == metav1.ConditionTrue
	})

	if _, err := svcs.Patch(e.ctx, "svcrbac", types.StrategicMergePatchType, []byte(`{"spec":{"selector":{"kvmesh.io/deployment":"other"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "ServiceReady False (ServiceError, forbidden) and a Warning event", func() bool {
		cond := serviceReady()
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return cond != nil && cond.Status == metav1.ConditionFalse && cond.Reason == reasonServiceError &&
			strings.Contains(cond.Message, "forbidden") && err == nil &&
			slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool {
				return ev.Type == corev1.EventTypeWarning && ev.Reason == reasonServiceError && strings.Contains(ev.Message, "forbidden")
			})
	})
	// The pods do not wait on the Service: a deleted one is recreated, a
	// scale is taken.
	pod := e.pods(t, sel)[0]
	if err := e.kube.CoreV1().Pods(e.ns).Delete(e.ctx, pod.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the deleted pod recreated", func() bool {
		ps := e.pods(t, sel)
		return len(ps) == 1 && ps[0].UID != pod.UID
	})
	e.setScale(t, e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns), "svcrbac-decode", 2)
	testutil.WaitFor(t, wait, "decode scaled to 2 pods", func() bool { return len(e.pods(t, sel)) == 2 })
	if selects() {
		t.Fatal("the Service was set back without the right to update it")
	}

	e.grant(t, "orchestrator", rules)
	// An edit of the Service brings the deployment back at once (its
	// retries back off up to a minute).
	if _, err := svcs.Patch(e.ctx, "svcrbac", types.StrategicMergePatchType, []byte(`{"metadata":{"annotations":{"touched":"1"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the Service set back under the shipped rules and ServiceReady True", func() bool {
		cond := serviceReady()
		return selects() && cond != nil && cond.Status == metav1.ConditionTrue
	})
}
