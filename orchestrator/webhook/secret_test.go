package webhook

import (
	"bytes"
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func serviceHosts(ns string) []string {
	return []string{"kvmesh-orchestrator." + ns + ".svc", "kvmesh-orchestrator." + ns + ".svc.cluster.local"}
}

// A fresh install has no Secret kvmesh-webhook-tls: two replicas starting at
// once (as the orchestrator's rbac.yaml identity) create one between them,
// both serve its certificate, and the configuration trusts its CA; a replica
// started later serves the same without writing the Secret.
func TestSecretCertificateFreshInstallSharedByReplicas(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 2*time.Minute)
	kube := orchestratorIdentity(t, s, ns)
	target := Target{ServiceNamespace: ns, Service: "kvmesh-orchestrator", ServicePort: 443}
	replica := func() *instance {
		return startWebhook(t, kube, RunConfig{Target: target,
			Certs: &SecretSource{Kube: kube, Namespace: ns, Name: SecretName, Hosts: serviceHosts(ns)}})
	}
	a, b := replica(), replica()
	a.waitReady(t)
	b.waitReady(t)

	sec, err := admin.CoreV1().Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatalf("no Secret after a fresh install: %v\n%s", err, a.log.String())
	}
	if sec.Type != corev1.SecretTypeTLS || len(sec.Data[KeyCA]) == 0 || len(sec.Data[KeyCAKey]) == 0 {
		t.Fatalf("secret type %s keys %d", sec.Type, len(sec.Data))
	}
	bundle := registeredBundle(ctx, admin)
	if !bytes.Equal(bundle, sec.Data[KeyCA]) {
		t.Fatalf("registered caBundle is not the Secret's ca.crt:\n%s\nvs\n%s", bundle, sec.Data[KeyCA])
	}
	want := firstCert(t, sec.Data[KeyCert])
	check := func(name string, in *instance) {
		t.Helper()
		for _, host := range serviceHosts(ns) {
			got, err := handshake(in.addr, bundle, host)
			if err != nil {
				t.Errorf("replica %s: the API server's handshake for %s fails: %v", name, host, err)
			} else if !got.Equal(want) {
				t.Errorf("replica %s serves serial %v, the Secret holds %v", name, got.SerialNumber, want.SerialNumber)
			}
		}
	}
	check("a", a)
	check("b", b)

	c := replica()
	c.waitReady(t)
	check("c", c)
	again, err := admin.CoreV1().Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil || again.ResourceVersion != sec.ResourceVersion {
		t.Errorf("a later replica rewrote the Secret (resourceVersion %s -> %s, %v)", sec.ResourceVersion, again.ResourceVersion, err)
	}
	if !bytes.Equal(registeredBundle(ctx, admin), bundle) {
		t.Error("a later replica registered another CA")
	}
}

// A Secret rotated behind the orchestrator's back (cert-manager renewing,
// here with a new CA) is served once its CA is registered, with the old CA
// kept beside it: the API server keeps calling the webhook through the
// rotation.
func TestRotatedSecretServedAndRegistered(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 3*time.Minute)
	kube := orchestratorIdentity(t, s, ns)
	certManager := map[string]string{AnnotationCertManager: "kvmesh-webhook"}
	now := time.Now()
	ca1 := newTestCA(t)
	crt1, key1 := ca1.issue(t, now.Add(-time.Hour), now.Add(90*24*time.Hour), "127.0.0.1")
	if _, err := admin.CoreV1().Secrets(ns).Create(ctx, tlsSecret(ns, SecretName, certManager, crt1, key1, ca1.pem), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// Registered by URL so that the API server itself calls it on loopback.
	in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1",
		Certs: &SecretSource{Kube: kube, Namespace: ns, Name: SecretName, Hosts: []string{"127.0.0.1"}}})
	in.waitReady(t)
	if got, err := handshake(in.addr, ca1.pem, "127.0.0.1"); err != nil || !got.Equal(firstCert(t, crt1)) {
		t.Fatalf("cert-manager's certificate not served: %v", err)
	}
	if !bytes.Equal(registeredBundle(ctx, admin), ca1.pem) {
		t.Fatal("cert-manager's ca.crt not registered")
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the webhook", func() bool { return injectedByAPIServer(ctx, admin, ns) })

	loads := promtest.ToFloat64(certReloads)
	ca2 := newTestCA(t)
	crt2, key2 := ca2.issue(t, now.Add(-time.Minute), now.Add(90*24*time.Hour), "127.0.0.1")
	sec, err := admin.CoreV1().Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sec.Data = map[string][]byte{KeyCert: crt2, KeyKey: key2, KeyCA: ca2.pem}
	if _, err := admin.CoreV1().Secrets(ns).Update(ctx, sec, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "a new handshake to see the rotated certificate", func() bool {
		got, err := handshake(in.addr, ca2.pem, "127.0.0.1")
		return err == nil && got.Equal(firstCert(t, crt2))
	})
	if b := registeredBundle(ctx, admin); !bytes.HasPrefix(b, ca2.pem) || !bytes.Contains(b, ca1.pem) {
		t.Fatalf("the registered bundle is not the rotated CA then the old one:\n%s", b)
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the rotated certificate", func() bool {
		return injectedByAPIServer(ctx, admin, ns)
	})
	if promtest.ToFloat64(certReloads) <= loads {
		t.Error("kvmesh_webhook_certificate_loads_total did not count the rotation")
	}
	if got, _ := admin.CoreV1().Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{}); !bytes.Equal(got.Data[KeyCert], crt2) {
		t.Error("the orchestrator wrote cert-manager's Secret")
	}
}

// An existing Secret is used as it is when valid for the Service, left to
// cert-manager when it issued it, and otherwise replaced: renewed once two
// thirds into its lifetime (keeping the old CA in the bundle so replicas not
// yet switched stay trusted), reissued when made for other hosts.
func TestExistingSecretUsedRenewedOrReplaced(t *testing.T) {
	s := kubetest.Shared(t)
	admin := kubernetes.NewForConfigOrDie(s.Config)
	now := time.Now()
	ca := newTestCA(t)
	cases := []struct {
		name         string
		certManager  bool
		from, to     time.Time
		hosts        func(ns string) []string
		wantReplaced bool
		wantOldCA    bool // the old CA stays in the new bundle
	}{
		{name: "valid", from: now.Add(-time.Hour), to: now.Add(60 * 24 * time.Hour), hosts: serviceHosts},
		{name: "due for renewal", from: now.Add(-300 * 24 * time.Hour), to: now.Add(20 * 24 * time.Hour), hosts: serviceHosts,
			wantReplaced: true, wantOldCA: true},
		{name: "due for renewal, cert-manager's", certManager: true, from: now.Add(-300 * 24 * time.Hour), to: now.Add(20 * 24 * time.Hour), hosts: serviceHosts},
		{name: "other hosts", from: now.Add(-time.Hour), to: now.Add(60 * 24 * time.Hour),
			hosts: func(string) []string { return []string{"elsewhere.example"} }, wantReplaced: true},
		{name: "expired", from: now.Add(-60 * 24 * time.Hour), to: now.Add(-time.Hour), hosts: serviceHosts, wantReplaced: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ns := s.Namespace(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			installConfiguration(t, admin)
			var ann map[string]string
			if tc.certManager {
				ann = map[string]string{AnnotationCertManager: "kvmesh-webhook"}
			}
			crt, key := ca.issue(t, tc.from, tc.to, tc.hosts(ns)...)
			if _, err := admin.CoreV1().Secrets(ns).Create(ctx, tlsSecret(ns, SecretName, ann, crt, key, ca.pem), metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			kube := orchestratorIdentity(t, s, ns)
			in := startWebhook(t, kube, RunConfig{Target: Target{ServiceNamespace: ns, Service: "kvmesh-orchestrator", ServicePort: 443},
				Certs: &SecretSource{Kube: kube, Namespace: ns, Name: SecretName, Hosts: serviceHosts(ns)}})
			in.waitReady(t)
			sec, err := admin.CoreV1().Secrets(ns).Get(ctx, SecretName, metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if replaced := !bytes.Equal(sec.Data[KeyCert], crt); replaced != tc.wantReplaced {
				t.Fatalf("replaced %v, want %v\n%s", replaced, tc.wantReplaced, in.log.String())
			}
			bundle := registeredBundle(ctx, admin)
			if !bytes.Equal(bundle, sec.Data[KeyCA]) {
				t.Errorf("registered bundle is not the Secret's ca.crt")
			}
			got, err := handshake(in.addr, bundle, serviceHosts(ns)[0])
			if err != nil || !got.Equal(firstCert(t, sec.Data[KeyCert])) {
				t.Errorf("served certificate is not the Secret's (%v)", err)
			}
			if hasOld := bytes.Contains(bundle, ca.pem); hasOld != (tc.wantOldCA || !tc.wantReplaced) {
				t.Errorf("old CA in the registered bundle: %v", hasOld)
			}
			if tc.wantReplaced {
				c, err := parseCerts(sec.Data[KeyCert], sec.Data[KeyKey], sec.Data[KeyCA])
				if err != nil {
					t.Fatal(err)
				}
				if renewAt, err := c.Check(serviceHosts(ns), time.Now()); err != nil || time.Until(renewAt) < 200*24*time.Hour {
					t.Errorf("the new certificate: renew at %v, %v", renewAt, err)
				}
			}
		})
	}
}

// A registration that fails (here: the orchestrator's identity may not
// touch webhook configurations yet) is logged at once, counted, retried
// with backoff and keeps /readyz failing; once permitted, a retry registers
// it without a restart.
func TestRegistrationFailureSurfacedAndRetried(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 3*time.Minute)
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "orchestrator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	kube := serviceAccountClient(t, s, ns, "orchestrator")
	errs := promtest.ToFloat64(registrationErrors)
	ready := make(chan string, 1)
	in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1", Ready: func(w string) { ready <- w }})
	testutil.WaitFor(t, time.Minute, "the failure in the log while running", func() bool {
		return strings.Contains(in.log.String(), "sidecar webhook not registered") && strings.Contains(in.log.String(), "forbidden")
	})
	testutil.WaitFor(t, time.Minute, "a retry", func() bool { return promtest.ToFloat64(registrationErrors) >= errs+2 })
	if code, body := in.readyz(); code != http.StatusServiceUnavailable || !strings.Contains(body, "forbidden") {
		t.Errorf("/readyz %d %q while unregistered, want 503 with the reason", code, body)
	}
	if promtest.ToFloat64(registered) != 0 {
		t.Error("kvmesh_webhook_registered is not 0")
	}

	name := "late-grant-" + ns
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: []rbacv1.PolicyRule{{
		APIGroups: []string{"admissionregistration.k8s.io"}, Resources: []string{"mutatingwebhookconfigurations"},
		ResourceNames: []string{ConfigName}, Verbs: []string{"get", "list", "watch", "update"}}}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name},
		Subjects: []rbacv1.Subject{{Kind: "ServiceAccount", Name: "orchestrator", Namespace: ns}},
		RoleRef:  rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	select {
	case w := <-ready:
		if !strings.HasPrefix(w, "https://127.0.0.1:") {
			t.Errorf("registered at %q", w)
		}
	case <-time.After(2 * time.Minute):
		t.Fatalf("not registered after the grant:\n%s", in.log.String())
	}
	in.waitReady(t)
	if promtest.ToFloat64(registered) != 1 {
		t.Error("kvmesh_webhook_registered is not 1")
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the webhook", func() bool { return injectedByAPIServer(ctx, admin, ns) })
}

// A configuration replaced under the running orchestrator (deleted and
// re-applied from webhook.yaml, which has no caBundle) gets the CA again
// without a restart or a rotation. While it is missing the log says pods
// are admitted without the sidecar (no webhook is called), and only the
// two changes are warned of, not the start-up's own write.
func TestReplacedConfigurationRegisteredAgain(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 2*time.Minute)
	kube := orchestratorIdentity(t, s, ns)
	in := startWebhook(t, kube, RunConfig{Target: Target{ServiceNamespace: ns, Service: "kvmesh-orchestrator", ServicePort: 443},
		Certs: &SecretSource{Kube: kube, Namespace: ns, Name: SecretName, Hosts: serviceHosts(ns)}})
	in.waitReady(t)
	want := registeredBundle(ctx, admin)
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	if err := api.Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "/readyz to fail without the configuration, and the log to say pods are admitted uninjected", func() bool {
		code, _ := in.readyz()
		return code == http.StatusServiceUnavailable && strings.Contains(in.log.String(), "pods asking for the sidecar are admitted without it")
	})
	if strings.Contains(in.log.String(), "rejected until") {
		t.Errorf("without a configuration no webhook is called, yet the log says pods are rejected:\n%s", in.log.String())
	}
	if promtest.ToFloat64(registered) != 0 {
		t.Error("kvmesh_webhook_registered stays 1 without the configuration")
	}
	if _, err := api.Create(ctx, manifestWebhook(t), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the CA written into the re-applied configuration", func() bool {
		return bytes.Equal(registeredBundle(ctx, admin), want)
	})
	in.waitReady(t)
	// Two changes under it (the deletion, the re-applied one): the
	// start-up's own registration is none.
	if n := strings.Count(in.log.String(), "changed under the orchestrator"); n != 2 {
		t.Errorf("%d warnings of a changed configuration, want 2:\n%s", n, in.log.String())
	}
}

// webhookEnv is the shared API server with the webhook configuration
// installed, a namespace of the test's own, a context ending after
// timeout (or with the test) and an admin client.
func webhookEnv(t *testing.T, timeout time.Duration) (*kubetest.Server, string, context.Context, kubernetes.Interface) {
	t.Helper()
	s := kubetest.Shared(t)
	ns := s.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	t.Cleanup(cancel)
	admin := kubernetes.NewForConfigOrDie(s.Config)
	installConfiguration(t, admin)
	return s, ns, ctx, admin
}
