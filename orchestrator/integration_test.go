package orchestrator

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// The server authorizes by RBAC: the admin (system:masters) may do anything,
// TestAutoscalingPolicyUnderRBAC runs the controller under rbac.yaml's rules.
func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{RBAC: true})) }

const wait = 90 * time.Second

// crdOnce installs the CRDs once per API server (keyed by URL).
var crdOnce sync.Map

type onceErr struct {
	once sync.Once
	err  error
}

// env is one test's API server, namespace and clients.
type env struct {
	srv  *kubetest.Server
	ns   string
	kube kubernetes.Interface
	dyn  dynamic.Interface
	ctx  context.Context
}

// installCRDs applies manifests/crds once per API server.
func installCRDs(t testing.TB, s *kubetest.Server) {
	t.Helper()
	v, _ := crdOnce.LoadOrStore(s.URL, &onceErr{})
	o := v.(*onceErr)
	o.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		files, _ := filepath.Glob(kubetest.RepoFile(t, "manifests/crds/kvmesh.io_*.yaml"))
		_, o.err = kubetest.ApplyFiles(ctx, s.Config, kubetest.ApplyOptions{}, files...)
	})
	if o.err != nil {
		t.Fatalf("install CRDs: %v", o.err)
	}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	s := kubetest.Shared(t)
	installCRDs(t, s)
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	t.Cleanup(cancel)
	return &env{srv: s, ns: s.Namespace(t), kube: kubernetes.NewForConfigOrDie(s.Config), dyn: dynamic.NewForConfigOrDie(s.Config), ctx: ctx}
}

// startController runs a controller for the namespace under cfg (leader
// election on a Lease in the namespace) until the test ends.
func (e *env) startController(t *testing.T, cfg *rest.Config) *Controller {
	t.Helper()
	c := DefaultConfig()
	c.Namespace, c.LeaseNamespace = e.ns, e.ns
	c.LeaseDuration, c.RenewDeadline, c.RetryPeriod = 4*time.Second, 3*time.Second, 500*time.Millisecond
	c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	if testing.Verbose() {
		c.Logger = slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	}
	ctrl, err := New(cfg, c)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "controller", ctrl.Run, nil)
	return ctrl
}

func (e *env) apply(t *testing.T, file string) {
	t.Helper()
	if _, err := kubetest.ApplyFiles(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, kubetest.RepoFile(t, file)); err != nil {
		t.Fatal(err)
	}
}

func (e *env) pods(t testing.TB, sel labels.Set) []corev1.Pod {
	t.Helper()
	l, err := e.kube.CoreV1().Pods(e.ns).List(e.ctx, metav1.ListOptions{LabelSelector: sel.String()})
	if err != nil {
		t.Fatal(err)
	}
	return l.Items
}

func (e *env) md(t testing.TB, name string) *v1alpha1.ModelDeployment {
	t.Helper()
	u, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Get(e.ctx, name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	md := &v1alpha1.ModelDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, md); err != nil {
		t.Fatal(err)
	}
	return md
}

// markReady plays the kubelet (which does not run here): every pod that is
// not ready becomes Running and Ready.
func (e *env) markReady(t testing.TB, pods []corev1.Pod) {
	t.Helper()
	for i := range pods {
		p := &pods[i]
		if podReady(p) || p.DeletionTimestamp != nil {
			continue
		}
		p.Status.Phase = corev1.PodRunning
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: metav1.Now()}}
		if _, err := e.kube.CoreV1().Pods(e.ns).UpdateStatus(e.ctx, p, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			t.Fatal(err)
		}
	}
}

func count(pods []corev1.Pod, f func(*corev1.Pod) bool) int {
	n := 0
	for i := range pods {
		if f(&pods[i]) {
			n++
		}
	}
	return n
}

// TestCRDValidation: the schemas reject what the controller could not run.
func TestCRDValidation(t *testing.T) {
	e := newEnv(t)
	bad := map[string]string{
		"duplicate role": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"dup"},
			"spec":{"model":"m","engine":"vllm","roles":[{"name":"a","kind":"mixed","template":{}},{"name":"a","kind":"decode","template":{}}]}}`,
		"bad engine": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"eng"},
			"spec":{"model":"m","engine":"tgi","roles":[{"name":"a","kind":"mixed","template":{}}]}}`,
		"gang above replicas": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"gang"},
			"spec":{"model":"m","engine":"vllm","roles":[{"name":"a","kind":"mixed","replicas":1,"gangMinimum":2,"template":{}}]}}`,
		"inverted ratio": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"r"},
			"spec":{"target":"x","roles":[{"name":"p","minReplicas":1,"maxReplicas":2}],
			"ratio":{"numeratorRole":"p","denominatorRole":"d","minRatio":2,"maxRatio":1}}}`,
		"min above max": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"m"},
			"spec":{"target":"x","roles":[{"name":"p","minReplicas":3,"maxReplicas":2}]}}`,
		"stable window below the default panic window": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"w"},
			"spec":{"target":"x","stableWindowSeconds":5,"roles":[{"name":"p","minReplicas":1,"maxReplicas":2}]}}`,
		"stable window below the panic window": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"w2"},
			"spec":{"target":"x","stableWindowSeconds":60,"panicWindowSeconds":90,"roles":[{"name":"p","minReplicas":1,"maxReplicas":2}]}}`,
		"negative TTFT aim": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"aim"},
			"spec":{"target":"x","roles":[{"name":"p","minReplicas":1,"maxReplicas":2},{"name":"d","minReplicas":1,"maxReplicas":2}],
			"slo":{"prefillRole":"p","decodeRole":"d","prefillTokensPerSecond":1000,"decodeStreamsPerReplica":8,"ttftAimPercent":-5}}}`,
		"TPOT aim over 300 %": `{"apiVersion":"kvmesh.io/v1alpha1","kind":"AutoscalingPolicy","metadata":{"name":"aim2"},
			"spec":{"target":"x","roles":[{"name":"p","minReplicas":1,"maxReplicas":2},{"name":"d","minReplicas":1,"maxReplicas":2}],
			"slo":{"prefillRole":"p","decodeRole":"d","prefillTokensPerSecond":1000,"decodeStreamsPerReplica":8,"tpotAimPercent":301}}}`,
	}
	for name, doc := range bad {
		objs, err := kubetest.Decode(stringsReader(doc))
		if err != nil {
			t.Fatal(err)
		}
		err = kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns}, objs...)
		// .spec.roles is a map list keyed by name: server-side apply refuses
		// duplicate names before validation (an internal error naming the
		// duplicate key, not Invalid); a plain create is Invalid, below.
		dupByApply := name == "duplicate role" && err != nil && strings.Contains(err.Error(), `duplicate entries for key [name="a"]`)
		if err == nil || !(apierrors.IsInvalid(errors.Unwrap(err)) || dupByApply) {
			t.Errorf("%s: got %v, want Invalid", name, err)
		}
		if name == "duplicate role" {
			_, err := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns).Create(e.ctx, objs[0], metav1.CreateOptions{})
			if !apierrors.IsInvalid(err) {
				t.Errorf("%s (create): got %v, want Invalid", name, err)
			}
		}
	}
	// Every example validates (server-side dry run through the CRDs' schemas).
	for _, f := range []string{"examples/pd-modeldeployment.yaml", "examples/multinode-modeldeployment.yaml", "examples/autoscalingpolicy.yaml"} {
		if _, err := kubetest.ApplyFiles(e.ctx, e.srv.Config, kubetest.ApplyOptions{Namespace: e.ns, DryRun: true}, kubetest.RepoFile(t, f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// TestPDDeploymentLifecycle: the P/D example creates each role's pods, the
// role scalers and the headless service; a role scales through its
// RoleScaler's /scale, the groups through the deployment's /scale; deleting
// the deployment removes every child (finalizer; no garbage collector runs).
func TestPDDeploymentLifecycle(t *testing.T) {
	e := newEnv(t)
	e.startController(t, e.srv.Config)
	e.apply(t, "examples/pd-modeldeployment.yaml")
	sel := labels.Set{v1alpha1.LabelDeployment: "llama-pd"}
	testutil.WaitFor(t, wait, "2 prefill + 2 decode pods", func() bool {
		ps := e.pods(t, sel)
		return len(ps) == 4 &&
			count(ps, func(p *corev1.Pod) bool { return p.Labels[v1alpha1.LabelRoleKind] == "prefill" }) == 2 &&
			count(ps, func(p *corev1.Pod) bool { return p.Labels[v1alpha1.LabelRoleKind] == "decode" }) == 2
	})
	for _, p := range e.pods(t, sel) {
		if p.Status.Phase != corev1.PodPending {
			t.Errorf("%s: phase %s (no kubelet: Pending)", p.Name, p.Status.Phase)
		}
		if p.Labels[v1alpha1.DefaultPDGroupLabel] != "llama-pd-0" || p.Labels[v1alpha1.LabelInject] != "true" {
			t.Errorf("%s: labels %v", p.Name, p.Labels)
		}
		if len(p.OwnerReferences) != 1 || p.OwnerReferences[0].Kind != "ModelDeployment" {
			t.Errorf("%s: owner %v", p.Name, p.OwnerReferences)
		}
	}
	if _, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, "llama-pd", metav1.GetOptions{}); err != nil {
		t.Fatalf("headless service: %v", err)
	}
	testutil.WaitFor(t, wait, "status with 1 group and the selector", func() bool {
		st := e.md(t, "llama-pd").Status
		return st.Groups == 1 && st.Selector == "kvmesh.io/deployment=llama-pd" && st.Ready == "0/1"
	})

	// Scale the decode role alone through its RoleScaler's scale subresource.
	rs := e.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(e.ns)
	testutil.WaitFor(t, wait, "RoleScaler llama-pd-decode", func() bool {
		_, err := rs.Get(e.ctx, "llama-pd-decode", metav1.GetOptions{})
		return err == nil
	})
	e.setScale(t, rs, "llama-pd-decode", 3)
	testutil.WaitFor(t, wait, "3 decode pods and the role's replicas at 3", func() bool {
		md := e.md(t, "llama-pd")
		return len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "llama-pd", v1alpha1.LabelRole: "decode"})) == 3 &&
			*md.Spec.Roles[1].Replicas == 3
	})
	testutil.WaitFor(t, wait, "RoleScaler status: 3 replicas, a selector", func() bool {
		s, err := rs.Get(e.ctx, "llama-pd-decode", metav1.GetOptions{}, "scale")
		if err != nil {
			return false
		}
		n, _, _ := unstructured.NestedInt64(s.Object, "status", "replicas")
		sel, _, _ := unstructured.NestedString(s.Object, "status", "selector")
		return n == 3 && sel != ""
	})

	// Scale whole groups through the deployment's scale subresource.
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	e.setScale(t, mdc, "llama-pd", 2)
	testutil.WaitFor(t, wait, "a second group of 2 prefill + 3 decode", func() bool {
		return len(e.pods(t, labels.Set{v1alpha1.LabelDeployment: "llama-pd", v1alpha1.LabelGroup: "1"})) == 5
	})
	ready := false
	testutil.WaitFor(t, wait, "both groups ready once every pod is", func() bool {
		if !ready {
			e.markReady(t, e.pods(t, sel))
		}
		md := e.md(t, "llama-pd")
		return md.Status.Ready == "2/2" && conditionTrue(md.Status.Conditions, v1alpha1.ConditionAvailable)
	})

	// Delete: the finalizer removes every pod, scaler and the service.
	if err := mdc.Delete(e.ctx, "llama-pd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "deployment and its children gone", func() bool {
		_, err := mdc.Get(e.ctx, "llama-pd", metav1.GetOptions{})
		scalers, _ := rs.List(e.ctx, metav1.ListOptions{})
		_, svcErr := e.kube.CoreV1().Services(e.ns).Get(e.ctx, "llama-pd", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(e.pods(t, sel)) == 0 && len(scalers.Items) == 0 && apierrors.IsNotFound(svcErr)
	})
	evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	reasons := map[string]bool{}
	for _, ev := range evs.Items {
		reasons[ev.Reason] = true
	}
	for _, r := range []string{"GroupCreated", "ScaledRole", "CleanedUp"} {
		if !reasons[r] {
			t.Errorf("no %s event (have %v)", r, reasons)
		}
	}
}

// setScale writes spec.replicas through the scale subresource, retrying on
// conflicts with the controller's writes.
func (e *env) setScale(t *testing.T, ri dynamic.ResourceInterface, name string, n int64) {
	t.Helper()
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		s, err := ri.Get(e.ctx, name, metav1.GetOptions{}, "scale")
		if err != nil {
			return err
		}
		if err := unstructured.SetNestedField(s.Object, n, "spec", "replicas"); err != nil {
			return err
		}
		_, err = ri.Update(e.ctx, s, metav1.UpdateOptions{}, "scale")
		return err
	})
	if err != nil {
		t.Fatalf("scale %s to %d: %v", name, n, err)
	}
}

func conditionTrue(cs []metav1.Condition, typ string) bool {
	for _, c := range cs {
		if c.Type == typ {
			return c.Status == metav1.ConditionTrue
		}
	}
	return false
}

// A service of the deployment's name that is not the deployment's (a user's
// own) is left alone: a ServiceConflict event says why the pods' names may
// not resolve, and deleting the deployment does not delete it.
func TestForeignServiceKept(t *testing.T) {
	e := newEnv(t)
	svcs := e.kube.CoreV1().Services(e.ns)
	mine := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "llama-pd"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := svcs.Create(e.ctx, mine, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.startController(t, e.srv.Config)
	e.apply(t, "examples/pd-modeldeployment.yaml")
	sel := labels.Set{v1alpha1.LabelDeployment: "llama-pd"}
	testutil.WaitFor(t, wait, "the pods and a ServiceConflict event", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		return err == nil && len(e.pods(t, sel)) == 4 && slices.ContainsFunc(evs.Items, func(ev corev1.Event) bool { return ev.Reason == "ServiceConflict" })
	})
	testutil.WaitFor(t, wait, "ServiceReady False (ServiceConflict)", func() bool {
		c := meta.FindStatusCondition(e.md(t, "llama-pd").Status.Conditions, v1alpha1.ConditionServiceReady)
		return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reasonServiceConflict
	})
	mdc := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	if err := mdc.Delete(e.ctx, "llama-pd", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "the deployment and its pods gone", func() bool {
		_, err := mdc.Get(e.ctx, "llama-pd", metav1.GetOptions{})
		return apierrors.IsNotFound(err) && len(e.pods(t, sel)) == 0
	})
	if _, err := svcs.Get(e.ctx, "llama-pd", metav1.GetOptions{}); err != nil {
		t.Fatalf("the user's service was deleted with the deployment: %v", err)
	}
}

// A Service of the deployment's name that is not its own holds the name
// until someone deletes it: the deployment looks again while it does (a
// requeue), since that Service is not labelled as the deployment's and its
// deletion brings no event; once it is gone the deployment's headless
// Service is made and ServiceReady turns True. Before, a steady
// deployment's ServiceConflict stayed until the resync (regression
// tester). The test takes the controller's steps itself: no timing.
func TestForeignServiceGoneServiceMade(t *testing.T) {
	e := newEnv(t)
	svcs := e.kube.CoreV1().Services(e.ns)
	theirs := &corev1.Service{ObjectMeta: metav1.ObjectMeta{Name: "fsvc"},
		Spec: corev1.ServiceSpec{Ports: []corev1.ServicePort{{Name: "http", Port: 80}}}}
	if _, err := svcs.Create(e.ctx, theirs, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	ctrl := e.driven(t)
	if err := e.applyDoc(t, strings.ReplaceAll(raceDoc, `"race"`, `"fsvc"`)); err != nil {
		t.Fatal(err)
	}
	var requeue time.Duration
	step := func() {
		t.Helper()
		e.inCache(t, ctrl, "fsvc", "fsvc-r")
		d, err := ctrl.reconcile(e.ctx, e.ns+"/fsvc")
		if err != nil {
			t.Fatal(err)
		}
		requeue = d
	}
	serviceReady := func(want metav1.ConditionStatus, reason string) func() bool {
		return func() bool {
			step()
			c := meta.FindStatusCondition(e.md(t, "fsvc").Status.Conditions, v1alpha1.ConditionServiceReady)
			return c != nil && c.Status == want && (reason == "" || c.Reason == reason)
		}
	}
	testutil.WaitFor(t, wait, "ServiceReady False (ServiceConflict)", serviceReady(metav1.ConditionFalse, reasonServiceConflict))
	step()
	if requeue <= 0 {
		t.Fatalf("a steady deployment whose Service name another Service holds asks for no requeue (%v): nothing would see that Service go", requeue)
	}
	if err := svcs.Delete(e.ctx, "fsvc", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, wait, "ServiceReady True", serviceReady(metav1.ConditionTrue, ""))
	if svc, err := svcs.Get(e.ctx, "fsvc", metav1.GetOptions{}); err != nil || !metav1.IsControlledBy(svc, e.md(t, "fsvc")) {
		t.Fatalf("the deployment's own Service: %v", err)
	}
}
