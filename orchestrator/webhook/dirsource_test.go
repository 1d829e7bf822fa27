package webhook

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// projected is a directory laid out as the kubelet mounts a Secret: the
// files are symlinks into ..data, itself a symlink swapped at once to a
// new directory on every update.
type projected struct {
	dir string
	n   int
}

func newProjected(t testing.TB, crt, key, ca []byte) *projected {
	t.Helper()
	p := &projected{dir: t.TempDir()}
	p.write(t, crt, key, ca)
	for _, name := range []string{KeyCert, KeyKey, KeyCA} {
		if err := os.Symlink(filepath.Join("..data", name), filepath.Join(p.dir, name)); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

// write swaps the directory's content to the files at once.
func (p *projected) write(t testing.TB, crt, key, ca []byte) {
	t.Helper()
	p.n++
	ts := fmt.Sprintf("..%d", p.n)
	if err := os.Mkdir(filepath.Join(p.dir, ts), 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{KeyCert: crt, KeyKey: key, KeyCA: ca} {
		testutil.WriteFile(t, filepath.Join(p.dir, ts), name, b)
	}
	tmp := filepath.Join(p.dir, "..data_tmp")
	if err := os.Symlink(ts, tmp); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, filepath.Join(p.dir, "..data")); err != nil {
		t.Fatal(err)
	}
}

// startDirWebhook runs the webhook on p's files, registered by URL so that
// the API server calls it on loopback, and waits for it to be ready.
func startDirWebhook(t testing.TB, kube kubernetes.Interface, p *projected) *instance {
	t.Helper()
	in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1",
		Certs: &DirSource{Dir: p.dir, Hosts: []string{"127.0.0.1"}, Interval: 200 * time.Millisecond, PollEvery: 20 * time.Millisecond}})
	in.waitReady(t)
	return in
}

// served is the certificate a handshake presents, not verified.
func served(t testing.TB, addr string) *x509.Certificate {
	t.Helper()
	conn, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // which certificate, not whether trusted
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	return conn.ConnectionState().PeerCertificates[0]
}

// trustedAsRegistered reports whether a handshake verified with the
// registered bundle, as a new API server connection, presents crt.
func trustedAsRegistered(ctx context.Context, t testing.TB, admin kubernetes.Interface, addr string, crt []byte) bool {
	got, err := handshake(addr, registeredBundle(ctx, admin), "127.0.0.1")
	return err == nil && got.Equal(firstCert(t, crt))
}

// Files that do not verify never replace a served certificate that does:
// an expired pair, then a new CA's pair whose ca.crt lags, are refused
// (logged, counted, read again) while the previous certificate stays
// served, trusted as registered and ready; the good files that follow are
// served.
func TestDirSourceKeepsTheVerifiedCertificate(t *testing.T) {
	_, ns, ctx, admin := webhookEnv(t, 3*time.Minute)
	ca1 := testutil.NewCA(t)
	crt1, key1 := ca1.ValidLeaf(t, "one")
	p := newProjected(t, crt1, key1, ca1.PEM)
	in := startDirWebhook(t, admin, p)
	if !trustedAsRegistered(ctx, t, admin, in.addr, crt1) {
		t.Fatal("the first certificate is not served trusted")
	}
	testutil.WaitFor(t, time.Minute, "the API server to inject through the webhook", func() bool { return injectedByAPIServer(ctx, admin, ns) })

	refused := func(what string, crt []byte) {
		t.Helper()
		errs := promtest.ToFloat64(certErrors)
		kept := strings.Count(in.log.String(), "keeping the previous certificate")
		testutil.WaitFor(t, time.Minute, what+" refused and counted", func() bool {
			return promtest.ToFloat64(certErrors) > errs && strings.Count(in.log.String(), "keeping the previous certificate") > kept
		})
		if !served(t, in.addr).Equal(firstCert(t, crt1)) {
			t.Fatalf("%s replaced the served certificate\n%s", what, in.log.String())
		}
		if !trustedAsRegistered(ctx, t, admin, in.addr, crt1) {
			t.Fatalf("after %s the served certificate is not trusted as registered", what)
		}
		if code, body := in.readyz(); code != 200 {
			t.Fatalf("after %s /readyz: %d %s", what, code, body)
		}
		if promtest.ToFloat64(certValid) != 1 {
			t.Fatalf("after %s kvmesh_webhook_certificate_valid is not 1", what)
		}
		if !injectedByAPIServer(ctx, admin, ns) {
			t.Fatalf("after %s the API server does not inject", what)
		}
	}

	old := time.Now().Add(-48 * time.Hour)
	expCrt, expKey := ca1.Leaf(t, "expired", old, old.Add(time.Hour))
	p.write(t, expCrt, expKey, ca1.PEM)
	refused("an expired pair", expCrt)

	ca2 := testutil.NewCA(t)
	crt2, key2 := ca2.ValidLeaf(t, "two")
	p.write(t, crt2, key2, ca1.PEM) // a new CA's pair, ca.crt not yet written
	refused("a pair its ca.crt does not sign", crt2)

	p.write(t, crt2, key2, ca2.PEM)
	testutil.WaitFor(t, time.Minute, "the good files to be served, trusted as registered", func() bool {
		return trustedAsRegistered(ctx, t, admin, in.addr, crt2)
	})
	testutil.WaitFor(t, time.Minute, "the API server to inject through the new certificate", func() bool {
		return injectedByAPIServer(ctx, admin, ns)
	})
}

// With nothing usable served, files that do not verify are served anyway
// (better than none), and readiness and kvmesh_webhook_certificate_valid
// say so until good files arrive.
func TestDirSourceServesUnverifiableOnlyWhenNothingBetter(t *testing.T) {
	s := kubetest.Shared(t)
	admin := kubernetes.NewForConfigOrDie(s.Config)
	installConfiguration(t, admin)
	ca := testutil.NewCA(t)
	old := time.Now().Add(-48 * time.Hour)
	expCrt, expKey := ca.Leaf(t, "expired", old, old.Add(time.Hour))
	p := newProjected(t, expCrt, expKey, ca.PEM)
	in := startWebhook(t, admin, RunConfig{URLHost: "127.0.0.1",
		Certs: &DirSource{Dir: p.dir, Hosts: []string{"127.0.0.1"}, Interval: 200 * time.Millisecond, PollEvery: 20 * time.Millisecond}})
	testutil.WaitFor(t, time.Minute, "the expired certificate served", func() bool {
		c, err := tls.Dial("tcp", in.addr, &tls.Config{InsecureSkipVerify: true}) //nolint:gosec // which certificate
		if err != nil {
			return false
		}
		defer c.Close()
		return c.ConnectionState().PeerCertificates[0].Equal(firstCert(t, expCrt))
	})
	code, body := in.readyz()
	if code != 503 || !strings.Contains(body, "does not verify") {
		t.Fatalf("/readyz with an expired certificate served: %d %s", code, body)
	}
	if promtest.ToFloat64(certValid) != 0 {
		t.Fatal("kvmesh_webhook_certificate_valid is not 0")
	}
	crt, key := ca.ValidLeaf(t, "good")
	p.write(t, crt, key, ca.PEM)
	in.waitReady(t)
	if !served(t, in.addr).Equal(firstCert(t, crt)) || promtest.ToFloat64(certValid) != 1 {
		t.Fatal("the good files are not served as valid")
	}
}

// A new CA's certificate is served only once a bundle trusting it is
// registered, with the old CA kept in it: while registering fails (the
// orchestrator's identity lost its rights) the old certificate stays
// served, so no new API server connection meets a certificate the
// registered bundle does not trust.
func TestDirSourceNewCAServedAfterItsBundleIsRegistered(t *testing.T) {
	s, ns, ctx, admin := webhookEnv(t, 3*time.Minute)
	kube := orchestratorIdentity(t, s, ns)
	ca1 := testutil.NewCA(t)
	crt1, key1 := ca1.ValidLeaf(t, "one")
	p := newProjected(t, crt1, key1, ca1.PEM)
	// A short overlap: the previous CA leaves the bundle a second after the
	// new one is registered beside it.
	in := startWebhook(t, kube, RunConfig{URLHost: "127.0.0.1", CAOverlap: time.Second,
		Certs: &DirSource{Dir: p.dir, Hosts: []string{"127.0.0.1"}, Interval: 200 * time.Millisecond, PollEvery: 20 * time.Millisecond}})
	in.waitReady(t)

	bindings := admin.RbacV1().ClusterRoleBindings()
	binding, err := bindings.Get(ctx, "orch-"+ns, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := bindings.Delete(ctx, binding.Name, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the identity to lose its rights on the configuration", func() bool {
		_, err := kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Get(ctx, ConfigName, metav1.GetOptions{})
		return apierrors.IsForbidden(err)
	})
	errs := promtest.ToFloat64(registrationErrors)
	ca2 := testutil.NewCA(t)
	crt2, key2 := ca2.ValidLeaf(t, "two")
	p.write(t, crt2, key2, ca2.PEM)
	testutil.WaitFor(t, time.Minute, "the new CA's registration to fail", func() bool { return promtest.ToFloat64(registrationErrors) > errs })
	if !served(t, in.addr).Equal(firstCert(t, crt1)) {
		t.Fatalf("the new CA's certificate is served before its CA is registered\n%s", in.log.String())
	}
	if !trustedAsRegistered(ctx, t, admin, in.addr, crt1) {
		t.Fatal("the served certificate is not trusted as registered")
	}

	binding.ResourceVersion = ""
	if _, err := bindings.Create(ctx, &rbacv1.ClusterRoleBinding{ObjectMeta: metav1.ObjectMeta{Name: binding.Name},
		Subjects: binding.Subjects, RoleRef: binding.RoleRef}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, time.Minute, "the new certificate served, trusted as registered", func() bool {
		return trustedAsRegistered(ctx, t, admin, in.addr, crt2)
	})
	// The log line follows the write the check above saw: wait for it.
	testutil.WaitFor(t, time.Minute, "the new CA registered beside the previous one (its log line)", func() bool {
		return strings.Contains(in.log.String(), "registered with the previous CA beside it")
	})
	// Then the previous CA leaves the bundle: a CA retired (for a compromise,
	// say) is not trusted for the webhook past the overlap.
	testutil.WaitFor(t, time.Minute, "the previous CA dropped from the registered bundle", func() bool {
		b := registeredBundle(ctx, admin)
		return bytes.Contains(b, ca2.PEM) && !bytes.Contains(b, ca1.PEM)
	})
	if !trustedAsRegistered(ctx, t, admin, in.addr, crt2) {
		t.Fatal("the served certificate is not trusted by the bundle without the previous CA")
	}
	in.waitReady(t)
}
