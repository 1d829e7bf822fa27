package webhook

import (
	"bytes"
	"context"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The install's own commands against a real API server: `kubectl apply
// --server-side -k manifests/orchestrator` on a cluster without the Secret,
// the webhook run as the install's ServiceAccount the way the Deployment
// runs it, then the documented uninstall. The Secret is created and its CA
// registered; applying again (an upgrade) keeps both; `kubectl delete -k`
// removes the cluster-scoped configuration, which deleting the namespace
// alone would leave behind.
//
// It has an API server of its own: the uninstall deletes CRDs and the
// namespace kvmesh, which stays Terminating here (no namespace controller).
func TestInstallAndUninstallWithKubectl(t *testing.T) {
	kc := testutil.RequireTool(t, "kubectl", "the install is applied with kubectl")
	s := kubetest.StartT(t, kubetest.Options{RBAC: true})
	dir := filepath.Join("..", "..", "manifests", "orchestrator")
	kubectl := func(args ...string) {
		t.Helper()
		out, err := exec.Command(kc, append(args, "--kubeconfig", s.Kubeconfig)...).CombinedOutput()
		if err != nil {
			t.Fatalf("kubectl %v: %v\n%s", args, err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	kubectl("apply", "--server-side", "-k", dir)
	t.Cleanup(func() {
		_ = admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), ConfigName, metav1.DeleteOptions{})
	})

	kube := serviceAccountClient(t, s, "kvmesh", "kvmesh-orchestrator")
	in := startWebhook(t, kube, RunConfig{
		Target: Target{ServiceNamespace: "kvmesh", Service: "kvmesh-orchestrator", ServicePort: 443},
		Certs:  &SecretSource{Kube: kube, Namespace: "kvmesh", Name: SecretName, Hosts: serviceHosts("kvmesh")},
	})
	in.waitReady(t)
	sec, err := admin.CoreV1().Secrets("kvmesh").Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the orchestrator made no Secret: %v\n%s", err, in.log.String())
	}
	bundle := registeredBundle(ctx, admin)
	if !bytes.Equal(bundle, sec.Data[KeyCA]) {
		t.Fatal("the installed configuration does not trust the Secret's CA")
	}
	if _, err := handshake(in.addr, bundle, "kvmesh-orchestrator.kvmesh.svc"); err != nil {
		t.Fatalf("handshake as the API server: %v", err)
	}

	kubectl("apply", "--server-side", "-k", dir)
	if !bytes.Equal(registeredBundle(ctx, admin), bundle) {
		t.Error("re-applying the install dropped the CA bundle")
	}

	// No namespace controller runs here: do not wait for the namespace.
	kubectl("delete", "-k", dir, "--wait=false")
	testutil.WaitFor(t, time.Minute, "the webhook configuration to be gone", func() bool {
		_, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
		return isNotFound(err)
	})
}
