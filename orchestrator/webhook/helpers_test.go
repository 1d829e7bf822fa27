package webhook

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// manifestObjects decodes a file of manifests/orchestrator.
func manifestObjects(t testing.TB, file string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", "manifests", "orchestrator", file))
	if err != nil {
		t.Fatal(err)
	}
	objs, err := kubetest.Decode(bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	var out [][]byte
	for _, o := range objs {
		j, err := o.MarshalJSON()
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, j)
	}
	return out
}

// manifestWebhook is manifests/orchestrator/webhook.yaml's configuration.
func manifestWebhook(t testing.TB) *admissionregistrationv1.MutatingWebhookConfiguration {
	t.Helper()
	objs := manifestObjects(t, "webhook.yaml")
	if len(objs) != 1 {
		t.Fatalf("webhook.yaml holds %d objects", len(objs))
	}
	var c admissionregistrationv1.MutatingWebhookConfiguration
	if err := yaml.Unmarshal(objs[0], &c); err != nil {
		t.Fatal(err)
	}
	return &c
}

// installConfiguration creates webhook.yaml's configuration as the install
// does (the orchestrator may not create it) and deletes it after the test.
func installConfiguration(t testing.TB, admin kubernetes.Interface) {
	t.Helper()
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_ = api.Delete(context.Background(), ConfigName, metav1.DeleteOptions{})
	if _, err := api.Create(context.Background(), manifestWebhook(t), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = api.Delete(context.Background(), ConfigName, metav1.DeleteOptions{}) })
}

// orchestratorIdentity returns a client acting as a ServiceAccount of ns
// holding exactly manifests/orchestrator/rbac.yaml's webhook rules: the
// Secret Role (bound in ns) and the ClusterRole's rules on webhook
// configurations.
func orchestratorIdentity(t testing.TB, s *kubetest.Server, ns string) kubernetes.Interface {
	t.Helper()
	ctx := context.Background()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	var secretRules, webhookRules []rbacv1.PolicyRule
	for _, raw := range manifestObjects(t, "rbac.yaml") {
		var r rbacv1.ClusterRole // a Role has the same rules field
		if err := yaml.Unmarshal(raw, &r); err != nil {
			t.Fatal(err)
		}
		switch {
		case r.Kind == "Role" && r.Name == "kvmesh-orchestrator-webhook-tls":
			secretRules = r.Rules
		case r.Kind == "ClusterRole" && r.Name == "kvmesh-orchestrator":
			for _, rule := range r.Rules {
				if len(rule.APIGroups) == 1 && rule.APIGroups[0] == "admissionregistration.k8s.io" {
					webhookRules = append(webhookRules, rule)
				}
			}
		}
	}
	if len(secretRules) == 0 || len(webhookRules) == 0 {
		t.Fatal("rbac.yaml lacks the webhook's Secret Role or its ClusterRole rules")
	}
	name := "orch-" + ns
	if _, err := admin.CoreV1().ServiceAccounts(ns).Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "orchestrator"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	subj := []rbacv1.Subject{{Kind: "ServiceAccount", Name: "orchestrator", Namespace: ns}}
	if _, err := admin.RbacV1().Roles(ns).Create(ctx, &rbacv1.Role{ObjectMeta: metav1.ObjectMeta{Name: "webhook-tls"}, Rules: secretRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().RoleBindings(ns).Create(ctx, &rbacv1.RoleBinding{ObjectMeta: metav1.ObjectMeta{Name: "webhook-tls"}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "Role", Name: "webhook-tls"}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoles().Create(ctx, &rbacv1.ClusterRole{ObjectMeta: metav1.ObjectMeta{Name: name}, Rules: webhookRules}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := admin.RbacV1().ClusterRoleBindings().Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: name}, Subjects: subj,
		RoleRef: rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: name}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = admin.RbacV1().ClusterRoleBindings().Delete(context.Background(), name, metav1.DeleteOptions{})
		_ = admin.RbacV1().ClusterRoles().Delete(context.Background(), name, metav1.DeleteOptions{})
	})
	return serviceAccountClient(t, s, ns, "orchestrator")
}

// serviceAccountClient is a client with a token of the ServiceAccount.
func serviceAccountClient(t testing.TB, s *kubetest.Server, ns, sa string) kubernetes.Interface {
	t.Helper()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	tok, err := admin.CoreV1().ServiceAccounts(ns).CreateToken(context.Background(), sa,
		&authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{}}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return kubernetes.NewForConfigOrDie(&rest.Config{Host: s.URL, BearerToken: tok.Status.Token,
		TLSClientConfig: rest.TLSClientConfig{CAData: s.CAPEM}})
}

// instance is one webhook.Run in the background, as one orchestrator replica.
type instance struct {
	addr string
	log  *testutil.SyncBuffer
	// stop ends the replica (as its process dying) and waits for Run to return.
	stop func()
}

// startWebhook runs Run until the test ends and returns once it listens.
func startWebhook(t testing.TB, kube kubernetes.Interface, cfg RunConfig) *instance {
	t.Helper()
	in := &instance{log: &testutil.SyncBuffer{}}
	cfg.Logger = slog.New(slog.NewTextHandler(in.log, &slog.HandlerOptions{Level: slog.LevelDebug}))
	if cfg.Listen == "" {
		cfg.Listen = "127.0.0.1:0"
	}
	if cfg.Sidecar.Image == "" {
		cfg.Sidecar = DefaultSidecarConfig()
	}
	bound := make(chan string, 1)
	cfg.Listening = func(a string) { bound <- a }
	switch src := cfg.Certs.(type) {
	case *SecretSource:
		src.Log = cfg.Logger
	case *GeneratedSource:
		src.Log = cfg.Logger
	case *DirSource:
		src.Log = cfg.Logger
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("webhook at %s logged:\n%s", in.addr, in.log.String())
		}
	})
	stopped := make(chan struct{})
	var once sync.Once
	run := testutil.Run(t, "webhook", func(ctx context.Context) error {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			select {
			case <-stopped:
				cancel()
			case <-ctx.Done():
			}
		}()
		return Run(ctx, kube, cfg)
	}, in.log.String)
	in.stop = func() {
		once.Do(func() { close(stopped) })
		select {
		case <-run.Done():
		case <-time.After(testutil.StopTimeout):
			t.Fatal("the webhook did not stop")
		}
	}
	select {
	case in.addr = <-bound:
	case <-run.Done():
		t.Fatalf("webhook ended before listening: %v", run.Err())
	}
	return in
}

// readyz is the instance's /readyz status and body (certificate not verified:
// only the answer matters here).
func (in *instance) readyz() (int, string) {
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}}} //nolint:gosec // status only
	defer c.CloseIdleConnections()
	resp, err := c.Get("https://" + in.addr + "/readyz")
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	var b bytes.Buffer
	_, _ = b.ReadFrom(resp.Body)
	return resp.StatusCode, b.String()
}

func (in *instance) waitReady(t testing.TB) {
	t.Helper()
	testutil.WaitFor(t, time.Minute, "the webhook to be ready", func() bool {
		code, _ := in.readyz()
		return code == http.StatusOK
	})
}

// handshake dials addr verifying with the bundle for serverName, as the API
// server does, and returns the certificate presented.
func handshake(addr string, bundle []byte, serverName string) (*x509.Certificate, error) {
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(bundle) {
		return nil, errors.New("empty bundle")
	}
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, &tls.Config{RootCAs: roots, ServerName: serverName})
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0], nil
}

// firstCert parses the first certificate of a PEM chain.
func firstCert(t testing.TB, chain []byte) *x509.Certificate {
	t.Helper()
	b, _ := pem.Decode(chain)
	if b == nil {
		t.Fatalf("no PEM in %q", chain)
	}
	c, err := x509.ParseCertificate(b.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// testCA signs serving certificates with chosen validity, as another issuer
// (cert-manager, an operator) would.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "test-ca"},
		NotBefore: time.Now().Add(-2 * 365 * 24 * time.Hour), NotAfter: time.Now().Add(5 * 365 * 24 * time.Hour),
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true, IsCA: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	c, _ := x509.ParseCertificate(der)
	return &testCA{cert: c, key: key, pem: pemBlock("CERTIFICATE", der)}
}

// issue returns a serving certificate and key (PEM) for hosts, valid from
// notBefore to notAfter.
func (ca *testCA) issue(t testing.TB, notBefore, notAfter time.Time, hosts ...string) (crt, key []byte) {
	t.Helper()
	k, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: serial(), Subject: pkix.Name{CommonName: "webhook"},
		NotBefore: notBefore, NotAfter: notAfter, KeyUsage: x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &k.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(k)
	return pemBlock("CERTIFICATE", der), pemBlock("EC PRIVATE KEY", kb)
}

// tlsSecret is a kubernetes.io/tls Secret with the given data.
func tlsSecret(ns, name string, ann map[string]string, crt, key, ca []byte) *corev1.Secret {
	data := map[string][]byte{KeyCert: crt, KeyKey: key}
	if ca != nil {
		data[KeyCA] = ca
	}
	return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Annotations: ann}, Type: corev1.SecretTypeTLS, Data: data}
}

// registeredBundle is the CA bundle in the configuration (nil if none).
func registeredBundle(ctx context.Context, admin kubernetes.Interface) []byte {
	c, err := admin.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil || len(c.Webhooks) == 0 {
		return nil
	}
	return c.Webhooks[0].ClientConfig.CABundle
}

// injectedByAPIServer reports whether the API server, calling the webhook
// over TLS with the registered bundle, injects a dry-run engine pod.
func injectedByAPIServer(ctx context.Context, admin kubernetes.Interface, ns string) bool {
	p, err := admin.CoreV1().Pods(ns).Create(ctx, enginePod("probe", map[string]string{LabelInject: "true"}, map[string]string{AnnotationModel: "m"}),
		metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
	return err == nil && len(p.Spec.InitContainers) == 1
}

func isNotFound(err error) bool { return apierrors.IsNotFound(err) }
