package orchestrator

import (
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// TestOldNamesStayWritableAfterCRDUpgrade: ModelDeployments an older CRD
// admitted (a dot in the name; name and role 56 characters together), each
// with the finalizer an older controller added, stay writable once the CRD
// with the name rules is applied: the rules ratchet. A spec edit of an
// existing role, the controller's status, cluster-admin's removal of the
// finalizer and the controller's own cleanup are admitted, so the objects
// can be deleted (an uninstall no longer hangs on them). A new object with
// such names, or a role added to the old one that is too long for its name,
// is still refused.
func TestOldNamesStayWritableAfterCRDUpgrade(t *testing.T) {
	e := newEnv(t)
	e.applyRulelessCRD(t)
	mds := e.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(e.ns)
	const long = "a-very-long-model-deployment-name-for-team-x" // 44 characters, 56 with role prefill-long
	old := []*unstructured.Unstructured{namedMD(t, "llama.v1", "decode"), namedMD(t, long, "prefill-long"), namedMD(t, "admin.v1", "decode")}
	for _, md := range old {
		md.SetFinalizers([]string{Finalizer}) // an older controller's
		testutil.WaitFor(t, wait, "the older CRD to admit "+md.GetName(), func() bool {
			_, err := mds.Create(e.ctx, md, metav1.CreateOptions{})
			return err == nil || apierrors.IsAlreadyExists(err)
		})
	}

	e.applyCurrentCRD(t)
	dryRun := metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}
	testutil.WaitFor(t, wait, "the current CRD to refuse a new llama.v2", func() bool {
		_, err := mds.Create(e.ctx, namedMD(t, "llama.v2", "decode"), dryRun)
		return apierrors.IsInvalid(err)
	})
	if _, err := mds.Create(e.ctx, namedMD(t, long+"-b", "prefill-long"), dryRun); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "50 characters") {
		t.Errorf("a new deployment with name and role 58 characters together: got %v, want Invalid", err)
	}

	// Spec edits of the old long one: an existing role may change, a role
	// added must fit.
	editRoles := func(edit func([]any) []any) error {
		u, err := mds.Get(e.ctx, long, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		roles, _, _ := unstructured.NestedSlice(u.Object, "spec", "roles")
		if err := unstructured.SetNestedSlice(u.Object, edit(roles), "spec", "roles"); err != nil {
			t.Fatal(err)
		}
		_, err = mds.Update(e.ctx, u, metav1.UpdateOptions{})
		return err
	}
	if err := editRoles(func(r []any) []any { r[0].(map[string]any)["replicas"] = int64(2); return r }); err != nil {
		t.Errorf("scale the old deployment's existing role: %v", err)
	}
	addRole := func(name string) func([]any) []any {
		return func(r []any) []any {
			return append(r, map[string]any{"name": name, "kind": "decode", "template": map[string]any{"spec": map[string]any{"containers": []any{map[string]any{"name": "e", "image": "vllm"}}}}})
		}
	}
	if err := editRoles(addRole("decode-too-long")); !apierrors.IsInvalid(err) || !strings.Contains(err.Error(), "50 characters") {
		t.Errorf("add a role whose name and the deployment's hold 59 characters: got %v, want Invalid", err)
	}
	if err := editRoles(addRole("d")); err != nil {
		t.Errorf("add a role whose name and the deployment's hold 45 characters: %v", err)
	}

	// cluster-admin removes the finalizer of a deleted one (no controller runs).
	if err := mds.Delete(e.ctx, "admin.v1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := mds.Patch(e.ctx, "admin.v1", types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`), metav1.PatchOptions{}); err != nil {
		t.Fatalf("remove the finalizer of admin.v1: %v", err)
	}
	if _, err := mds.Get(e.ctx, "admin.v1", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("admin.v1 after its finalizer went: %v, want NotFound", err)
	}

	// The controller says why it makes nothing from the others (a status
	// write), and cleans them up when they are deleted.
	e.startController(t, e.srv.Config)
	for _, name := range []string{"llama.v1", long} {
		testutil.WaitFor(t, wait, name+": Available false, reason InvalidName", func() bool {
			c := meta.FindStatusCondition(e.md(t, name).Status.Conditions, v1alpha1.ConditionAvailable)
			return c != nil && c.Status == metav1.ConditionFalse && c.Reason == reasonInvalidName
		})
		if err := mds.Delete(e.ctx, name, metav1.DeleteOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"llama.v1", long} {
		testutil.WaitFor(t, wait, name+" deleted (the controller drops its finalizer)", func() bool {
			_, err := mds.Get(e.ctx, name, metav1.GetOptions{})
			return apierrors.IsNotFound(err)
		})
	}
}
