package modelroutes

import (
	"context"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{})) }

const wait = 60 * time.Second

type env struct {
	srv  *kubetest.Server
	ns   string
	kube kubernetes.Interface
	mr   dynamic.ResourceInterface
	ctx  context.Context
}

// newEnv installs the ModelRoute CRD (applying it again is a no-op) and
// gives the test a namespace; start runs a controller for it.
func newEnv(t *testing.T) *env {
	t.Helper()
	s := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	t.Cleanup(cancel)
	if _, err := kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{}, kubetest.RepoFile(t, "manifests/crds/kvmesh.io_modelroutes.yaml")); err != nil {
		t.Fatal(err)
	}
	ns := s.Namespace(t)
	return &env{srv: s, ns: ns, kube: kubernetes.NewForConfigOrDie(s.Config),
		mr: dynamic.NewForConfigOrDie(s.Config).Resource(v1alpha1.ModelRoutesResource).Namespace(ns), ctx: ctx}
}

func (e *env) start(t *testing.T) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.Namespace = e.ns
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}
	c, err := New(e.srv.Config, cfg)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "controller", c.Run, nil)
}

// file is the namespace's route file as the ingress would load it (nil:
// no ConfigMap yet).
func (e *env) file(t testing.TB) *routes.Config {
	t.Helper()
	cm, err := e.kube.CoreV1().ConfigMaps(e.ns).Get(e.ctx, "kvmesh-routes", metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	c, err := routes.Parse([]byte(cm.Data["routes.yaml"]))
	if err != nil {
		t.Fatalf("the ingress would reject the file: %v\n%s", err, cm.Data["routes.yaml"])
	}
	return c
}

func names(c *routes.Config) []string {
	if c == nil {
		return nil
	}
	var n []string
	for _, r := range c.Routes {
		n = append(n, r.Name)
	}
	return n
}

func (e *env) status(t testing.TB, name string) v1alpha1.ModelRouteStatus {
	t.Helper()
	u, err := e.mr.Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var mr v1alpha1.ModelRoute
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &mr); err != nil {
		t.Fatal(err)
	}
	return mr.Status
}

func condition(st v1alpha1.ModelRouteStatus, typ string) (metav1.ConditionStatus, string, string) {
	c := meta.FindStatusCondition(st.Conditions, typ)
	if c == nil {
		return "", "", ""
	}
	return c.Status, c.Reason, c.Message
}

func (e *env) create(t *testing.T, yaml string) {
	t.Helper()
	objs, err := kubetest.Decode(strings.NewReader(yaml))
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range objs {
		if _, err := e.mr.Create(e.ctx, o, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestModelRoutesRenderTheRouteFile: the example's routes and one the
// ingress would reject; the file holds the valid ones in priority order, as
// the ingress parses it; statuses say Accepted/Programmed and the position;
// a priority change reorders the file, a deletion removes the route, and a
// hand edit of the file is put back.
func TestModelRoutesRenderTheRouteFile(t *testing.T) {
	e := newEnv(t)
	e.start(t)
	if _, err := kubetest.ApplyFiles(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, kubetest.RepoFile(t, "examples/modelroutes.yaml")); err != nil {
		t.Fatal(err)
	}
	// Valid for the CRD's schema, not for the ingress: every weight 0.
	e.create(t, `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelRoute","metadata":{"name":"drained"},
		"spec":{"priority":50,"match":{"model":"old"},"backends":[{"model":"llama-1b","weight":0}]}}`)

	testutil.WaitFor(t, wait, "the route file with chat-canary then chat", func() bool {
		return slices.Equal(names(e.file(t)), []string{"chat-canary", "chat"})
	})
	c := e.file(t)
	canary := c.Routes[0]
	if len(canary.Backends) != 2 || *canary.Backends[0].Weight != 80 || *canary.Backends[1].Weight != 20 ||
		canary.Match.Headers["X-Tenant"] != "beta" || !slices.Equal(canary.Fallback, []string{"llama-1b"}) ||
		canary.RateLimit.RequestsPerMinute != 600 || canary.RateLimit.InputTokensPerMinute != 200000 {
		t.Errorf("chat-canary as written: %+v", canary)
	}
	if c.Routes[1].Backends[0].Weight == nil || *c.Routes[1].Backends[0].Weight != 1 || !slices.Equal(c.Routes[1].LoRAAdapters, []string{"sql-lora"}) {
		t.Errorf("chat as written (weight defaulted to 1): %+v", c.Routes[1])
	}
	// The ingress's table from that file routes as the objects say.
	tab := routes.NewTable(c, nil)
	hdr := func(beta bool) func(string) []byte {
		return func(h string) []byte {
			if beta && strings.EqualFold(h, "X-Tenant") {
				return []byte("beta")
			}
			return nil
		}
	}
	if r, ok := tab.Match("chat", "/v1/chat/completions", hdr(true)); !ok || r.Name() != "chat-canary" {
		t.Errorf("beta tenant's chat: %v", r)
	}
	if r, ok := tab.Match("sql-lora", "/v1/completions", hdr(false)); !ok || r.Name() != "chat" {
		t.Errorf("the adapter: %v", r)
	}

	testutil.WaitFor(t, wait, "statuses", func() bool {
		s0, s1, bad := e.status(t, "chat-canary"), e.status(t, "chat"), e.status(t, "drained")
		a0, _, _ := condition(s0, v1alpha1.ConditionAccepted)
		p0, _, _ := condition(s0, v1alpha1.ConditionProgrammed)
		p1, _, _ := condition(s1, v1alpha1.ConditionProgrammed)
		ab, _, _ := condition(bad, v1alpha1.ConditionAccepted)
		return a0 == metav1.ConditionTrue && p0 == metav1.ConditionTrue && p1 == metav1.ConditionTrue && ab == metav1.ConditionFalse &&
			s0.Position != nil && *s0.Position == 0 && s1.Position != nil && *s1.Position == 1 && s0.ConfigMap == "kvmesh-routes"
	})
	// The metrics, per namespace.
	testutil.WaitFor(t, wait, "2 programmed and 1 invalid route in the metrics", func() bool {
		return promtest.ToFloat64(routeStates.WithLabelValues(e.ns, "programmed")) == 2 &&
			promtest.ToFloat64(routeStates.WithLabelValues(e.ns, "invalid")) == 1 &&
			promtest.ToFloat64(routeStates.WithLabelValues(e.ns, "pending")) == 0
	})
	bad := e.status(t, "drained")
	if _, reason, msg := condition(bad, v1alpha1.ConditionAccepted); reason != "Invalid" || !strings.Contains(msg, "weight") {
		t.Errorf("drained: Accepted %s %q", reason, msg)
	}
	if p, _, _ := condition(bad, v1alpha1.ConditionProgrammed); p != metav1.ConditionFalse || bad.Position != nil {
		t.Errorf("drained: Programmed %s, position %v", p, bad.Position)
	}

	// Priority 20 puts chat first.
	if _, err := e.mr.Patch(e.ctx, "chat", "application/merge-patch+json", []byte(`{"spec":{"priority":20}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "chat before chat-canary", func() bool {
		st := e.status(t, "chat")
		return slices.Equal(names(e.file(t)), []string{"chat", "chat-canary"}) && st.Position != nil && *st.Position == 0
	})

	// A hand edit of the file is put back.
	cm, err := e.kube.CoreV1().ConfigMaps(e.ns).Get(e.ctx, "kvmesh-routes", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	cm.Data["routes.yaml"] = "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: []\n"
	if _, err := e.kube.CoreV1().ConfigMaps(e.ns).Update(e.ctx, cm, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the edit reverted", func() bool {
		return slices.Equal(names(e.file(t)), []string{"chat", "chat-canary"})
	})

	// Deleting routes removes them; with none left the file stays, empty.
	for _, n := range []string{"chat-canary", "chat", "drained"} {
		if err := e.mr.Delete(e.ctx, n, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
		if n == "chat-canary" {
			testutil.WaitFor(t, wait, "chat alone", func() bool { return slices.Equal(names(e.file(t)), []string{"chat"}) })
		}
	}
	testutil.WaitFor(t, wait, "an empty route file", func() bool {
		c := e.file(t)
		return c != nil && len(c.Routes) == 0
	})
}

// TestForeignConfigMapKept: a ConfigMap of the same name the orchestrator
// did not make is not overwritten; the route says why it is not programmed.
func TestForeignConfigMapKept(t *testing.T) {
	e := newEnv(t)
	mine := "apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutes: []\n# the user's\n"
	if _, err := e.kube.CoreV1().ConfigMaps(e.ns).Create(e.ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "kvmesh-routes"}, Data: map[string]string{"routes.yaml": mine}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.start(t)
	e.create(t, `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelRoute","metadata":{"name":"r"},"spec":{"backends":[{"model":"m"}]}}`)
	testutil.WaitFor(t, wait, "r accepted, not programmed", func() bool {
		st := e.status(t, "r")
		a, _, _ := condition(st, v1alpha1.ConditionAccepted)
		p, reason, _ := condition(st, v1alpha1.ConditionProgrammed)
		return a == metav1.ConditionTrue && p == metav1.ConditionFalse && reason == "ConfigMapNotManaged"
	})
	if n := promtest.ToFloat64(routeStates.WithLabelValues(e.ns, "pending")); n != 1 {
		t.Errorf("pending routes in the metrics: %v, want 1", n)
	}
	cm, err := e.kube.CoreV1().ConfigMaps(e.ns).Get(e.ctx, "kvmesh-routes", metav1.GetOptions{})
	if err != nil || cm.Data["routes.yaml"] != mine {
		t.Fatalf("the user's ConfigMap changed: %v %q", err, cm.Data["routes.yaml"])
	}
}

// TestCRDSchema: the API server itself refuses what the schema rules out.
func TestCRDSchema(t *testing.T) {
	e := newEnv(t)
	for name, spec := range map[string]string{
		"no-backends":  `{"backends":[]}`,
		"star-inside":  `{"match":{"model":"a*b"},"backends":[{"model":"m"}]}`,
		"bare-path":    `{"match":{"pathPrefix":"v1"},"backends":[{"model":"m"}]}`,
		"neg-weight":   `{"backends":[{"model":"m","weight":-1}]}`,
		"dup-backend":  `{"backends":[{"model":"m"},{"model":"m"}]}`,
		"neg-limit":    `{"backends":[{"model":"m"}],"rateLimit":{"requestsPerMinute":-5}}`,
		"empty-model":  `{"backends":[{"model":""}]}`,
		"dup-fallback": `{"backends":[{"model":"m"}],"fallback":["a","a"]}`,
	} {
		u := &unstructured.Unstructured{}
		if err := u.UnmarshalJSON([]byte(`{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelRoute","metadata":{"name":"` + name + `"},"spec":` + spec + `}`)); err != nil {
			t.Fatal(err)
		}
		if _, err := e.mr.Create(e.ctx, u, metav1.CreateOptions{}); !apierrors.IsInvalid(err) {
			t.Errorf("%s: want Invalid, got %v", name, err)
		}
	}
}
