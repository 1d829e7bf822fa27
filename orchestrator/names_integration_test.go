package orchestrator

import (
	"os"
	"slices"
	"strings"
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// namedMD is a one-role ModelDeployment named name with role role.
func namedMD(t testing.TB, name, role string) *unstructured.Unstructured {
	t.Helper()
	objs, err := kubetest.Decode(stringsReader(`{"apiVersion":"kvmesh.io/v1alpha1","kind":"ModelDeployment","metadata":{"name":"` + name + `"},
		"spec":{"model":"m","engine":"vllm","roles":[{"name":"` + role + `","kind":"mixed","template":{"spec":{"containers":[{"name":"e","image":"vllm"}]}}}]}}`))
	if err != nil {
		t.Fatal(err)
	}
	return objs[0]
}

// The longest pod name the schema's bounds allow is a hostname of exactly 63
// characters when the deployment's and the role's names hold MaxNamesLength.
func TestNameBoundsFitAHostname(t *testing.T) {
	md := strings.Repeat("a", v1alpha1.MaxNamesLength-20)
	longest := podName(md, slot{Group: v1alpha1.MaxGroups - 1, Role: strings.Repeat("r", 20), Replica: v1alpha1.MaxReplicas - 1, Member: v1alpha1.MaxWorkers})
	if len(longest) != 63 {
		t.Fatalf("longest pod name %s: %d characters, want 63", longest, len(longest))
	}
	for _, c := range []struct {
		name, role string
		ok         bool
	}{
		{md, strings.Repeat("r", 20), true},
		{md + "b", strings.Repeat("r", 20), false},
		{"llama.v1", "decode", false},
		{"1llama", "decode", false},
		{"Llama", "decode", false},
		{"llama-pd", "decode", true},
	} {
		m := testMD(1, "", role(c.role, 1, 0))
		m.Name = c.name
		if probs := nameProblems(m); (probs == nil) != c.ok {
			t.Errorf("%s/%s: problems %q, want ok=%v", c.name, c.role, probs, c.ok)
		}
	}
}

// TestCRDRefusesNamesItCannotRun: the API server refuses, at admission, a
// ModelDeployment whose name the controller cannot make a Service, pod
// hostnames and label values from, naming the field (the rules' fieldPath:
// a root rule without one is reported as "<nil>: Invalid value"); the
// longest names that fit are admitted.
func TestCRDRefusesNamesItCannotRun(t *testing.T) {
	e := newEnv(t)
	mds := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	for _, c := range []struct{ why, name, role, field, msg string }{
		{"a dot", "llama.v1", "decode", "metadata.name", "DNS-1035 label"},
		{"a leading digit (Service names are DNS-1035 labels)", "1llama", "decode", "metadata.name", "DNS-1035 label"},
		{"pod names longer than a hostname", strings.Repeat("a", 55), "decode", "spec.roles", "50 characters"},
		{"name and role over 50 together", strings.Repeat("a", 31), strings.Repeat("r", 20), "spec.roles", "50 characters"},
	} {
		_, err := mds.Create(e.ctx, namedMD(t, c.name, c.role), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), c.field+": Invalid value") || strings.Contains(err.Error(), "<nil>") {
			t.Errorf("%s (%s/%s): got %v, want Invalid on %s", c.why, c.name, c.role, err, c.field)
			continue
		}
		var causes []metav1.StatusCause
		if st, ok := err.(apierrors.APIStatus); ok && st.Status().Details != nil {
			causes = st.Status().Details.Causes
		}
		if !slices.ContainsFunc(causes, func(sc metav1.StatusCause) bool {
			return sc.Field == c.field && sc.Type == metav1.CauseTypeFieldValueInvalid && strings.Contains(sc.Message, c.msg)
		}) {
			t.Errorf("%s (%s/%s): causes %+v, want %s on field %s", c.why, c.name, c.role, causes, c.msg, c.field)
		}
	}
	if _, err := mds.Create(e.ctx, namedMD(t, strings.Repeat("a", 30), strings.Repeat("r", 20)), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); err != nil {
		t.Errorf("a 30-character name with a 20-character role: %v", err)
	}
}

// applyRulelessCRD applies the ModelDeployment CRD as it was before the name
// rules (an older release's: no root x-kubernetes-validations); the real one
// is applied again when the test ends.
func (e *env) applyRulelessCRD(t *testing.T) {
	t.Helper()
	b, err := os.ReadFile(kubetest.RepoFile(t, "manifests/crds/kvmesh.io_modeldeployments.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	crd, err := kubetest.Decode(stringsReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	versions, _, _ := unstructured.NestedSlice(crd[0].Object, "spec", "versions")
	unstructured.RemoveNestedField(versions[0].(map[string]any), "schema", "openAPIV3Schema", "x-kubernetes-validations")
	if err := unstructured.SetNestedSlice(crd[0].Object, versions, "spec", "versions"); err != nil {
		t.Fatal(err)
	}
	if err := kubetest.Apply(e.ctx, e.srv.Config, kubetest.ApplyOptions{}, crd[0]); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { e.applyCurrentCRD(t) })
}

// applyCurrentCRD applies manifests/crds/kvmesh.io_modeldeployments.yaml.
func (e *env) applyCurrentCRD(t *testing.T) {
	t.Helper()
	if _, err := kubetest.ApplyFiles(e.ctx, e.srv.Config, kubetest.ApplyOptions{}, kubetest.RepoFile(t, "manifests/crds/kvmesh.io_modeldeployments.yaml")); err != nil {
		t.Errorf("apply the CRD: %v", err)
	}
}

// TestControllerRefusesBadNamesOnce: a ModelDeployment admitted by an older
// CRD (without the name rules) with names the controller cannot make objects
// from gets Available and Progressing false with reason InvalidName and one
// warning event, and is not retried: no reconcile error, no requeue, nothing
// created (before, every pass failed on the Service or the pods and was
// requeued with backoff forever).
func TestControllerRefusesBadNamesOnce(t *testing.T) {
	e := newEnv(t)
	e.applyRulelessCRD(t)
	mds := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	bad := []*unstructured.Unstructured{namedMD(t, "llama.v1", "decode"), namedMD(t, strings.Repeat("a", 55), "decode")}
	for _, md := range bad {
		// The API server takes up the CRD's new schema asynchronously.
		testutil.WaitFor(t, wait, "the older CRD to admit "+md.GetName(), func() bool {
			_, err := mds.Create(e.ctx, md, metav1.CreateOptions{})
			return err == nil || apierrors.IsAlreadyExists(err)
		})
	}
	errsBefore := promtest.ToFloat64(reconcileErrors)
	ctrl := e.startController(t, e.srv.Config)
	for _, md := range bad {
		name := md.GetName()
		testutil.WaitFor(t, wait, name+": Available false, reason InvalidName", func() bool {
			c := meta.FindStatusCondition(e.md(t, name).Status.Conditions, v1alpha1.ConditionAvailable)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reasonInvalidName
		})
		got := e.md(t, name)
		if c := meta.FindStatusCondition(got.Status.Conditions, v1alpha1.ConditionProgressing); c == nil || c.Reason != reasonInvalidName || !strings.Contains(c.Message, "nothing is created") {
			t.Errorf("%s: Progressing %+v", name, c)
		}
		if slices.Contains(got.Finalizers, Finalizer) {
			t.Errorf("%s: finalizer added to a deployment that creates nothing", name)
		}
		if n := ctrl.queue.NumRequeues(e.ns + "/" + name); n != 0 {
			t.Errorf("%s: requeued %d times", name, n)
		}
		if ps := e.pods(t, labels.Set{v1alpha1.LabelDeployment: name}); len(ps) != 0 {
			t.Errorf("%s: %d pods", name, len(ps))
		}
		if _, err := e.kube.CoreV1().Services(e.ns).Get(e.ctx, name, metav1.GetOptions{}); !apierrors.IsNotFound(err) && !apierrors.IsInvalid(err) {
			t.Errorf("%s: a Service was made (%v)", name, err)
		}
	}
	testutil.WaitFor(t, wait, "one InvalidName warning per deployment", func() bool {
		evs, err := e.kube.CoreV1().Events(e.ns).List(e.ctx, metav1.ListOptions{})
		if err != nil {
			return false
		}
		n := 0
		for _, ev := range evs.Items {
			if ev.Reason == reasonInvalidName && ev.Type == corev1.EventTypeWarning && ev.Count == 1 && strings.Contains(ev.Message, "nothing is created") {
				n++
			}
		}
		return n == len(bad)
	})
	if d := promtest.ToFloat64(reconcileErrors) - errsBefore; d != 0 {
		t.Errorf("%v reconcile errors", d)
	}
}

// TestPDGroupLabelIsALabelKey: pdGroupLabel becomes a label key of every
// pod, so the CRD admits only a label key (it failed at pod creation) and
// none under kvmesh.io/ but the default (it overwrote one of the
// controller's labels), and the controller refuses one admitted before the
// CRD checked it.
func TestPDGroupLabelIsALabelKey(t *testing.T) {
	e := newEnv(t)
	mds := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	for key, ok := range map[string]bool{"not a label!": false, "a/b/c": false, "Example.com/g": false, "-g": false,
		"kvmesh.io/pd-group": true, "example.com/pd_group.v1": true, "group": true,
		// The controller's own labels (TestPDGroupLabelIsNoControllerLabel has them all).
		"kvmesh.io/replica": false, "kvmesh.io/deployment": false, "kvmesh.io/revision": false, "kvmesh.io/inject": false,
		"kvmesh.io/pd-group2": false, "sub.kvmesh.io/pd": true} {
		u := namedMD(t, "pdl", "decode")
		if err := unstructured.SetNestedField(u.Object, key, "spec", "pdGroupLabel"); err != nil {
			t.Fatal(err)
		}
		_, err := mds.Create(e.ctx, u, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		if ok && err != nil || !ok && !(apierrors.IsInvalid(err) && strings.Contains(err.Error(), "spec.pdGroupLabel")) {
			t.Errorf("pdGroupLabel %q: got %v, want admitted %v", key, err, ok)
		}
		m := testMD(1, "", role("decode", 1, 0))
		m.Spec.PDGroupLabel = key
		if probs := nameProblems(m); (probs == nil) != ok {
			t.Errorf("pdGroupLabel %q: problems %q, want ok=%v", key, probs, ok)
		}
	}
}
