package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"log/slog"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// tlsFiles is a certificate and key on disk, rewritten in place as a
// Secret's update does.
type tlsFiles struct{ cert, key string }

func (f tlsFiles) write(t *testing.T, certPEM, keyPEM []byte) {
	t.Helper()
	if certPEM != nil {
		if err := os.WriteFile(f.cert, certPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	if keyPEM != nil {
		if err := os.WriteFile(f.key, keyPEM, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// servedCert handshakes with addr as a client of roots (presenting
// client, if any) and returns the server's certificate, or the error.
func servedCert(addr string, roots *x509.CertPool, client *tls.Certificate) (*x509.Certificate, error) {
	cfg := &tls.Config{RootCAs: roots, ServerName: "127.0.0.1"}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.Dial("tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	// In TLS 1.3 the server judges the client's certificate after the
	// client's handshake is done: a read sees its verdict.
	_ = c.SetReadDeadline(time.Now().Add(100 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil && !os.IsTimeout(err) {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

// The listener's certificate and client CA are re-read when their files
// change: the next handshake presents the new certificate and verifies
// clients with the new CA, and the expiry gauge follows. A change that
// cannot be loaded (a certificate written before its key) keeps the pair
// in force and is counted; the key's arrival completes the rotation.
// Before, they were read once at start: a renewed certificate was served
// only after a restart.
func TestTLSCertsReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	ca1, ca2 := newTestCA(t), newTestCA(t)
	srv := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
	crt1, key1 := ca1.validLeaf(t, "server-1")
	srv.write(t, crt1, key1)
	caFile := writeFile(t, dir, "ca.crt", ca1.pem)
	cfg := testConfig()
	cfg.TLS = TLSConfig{CertFile: srv.cert, KeyFile: srv.key, ClientCAFile: caFile}
	reg := prometheus.NewRegistry()
	s := startIngress(t, cfg, Deps{Registry: reg})
	cli1, cli2 := ca1.validPair(t, "client-1"), ca2.validPair(t, "client-2")
	roots := ca1.pool()
	roots.AddCert(ca2.cert)
	expiry := func() float64 { return val(s.certs.m.expiry.WithLabelValues(certServer)) }

	got, err := servedCert(s.Addr(), roots, &cli1)
	if err != nil || got.Subject.CommonName != "server-1" {
		t.Fatalf("before the rotation: %v %v, want server-1", got, err)
	}
	leaf1 := pair(t, crt1, key1).Leaf
	if expiry() != float64(leaf1.NotAfter.Unix()) {
		t.Errorf("expiry gauge %v, want %v", expiry(), leaf1.NotAfter.Unix())
	}

	// The certificate first: it does not match the key in place.
	crt2, key2 := ca2.leaf(t, "server-2", time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour))
	srv.write(t, crt2, nil)
	testutil.WaitFor(t, 30*time.Second, "the failed reload counted", func() bool {
		return val(s.certs.m.reloadErrs.WithLabelValues(certServer)) == 1
	})
	if got, err := servedCert(s.Addr(), roots, &cli1); err != nil || got.Subject.CommonName != "server-1" {
		t.Fatalf("after a half-written rotation: %v %v, want server-1 still", got, err)
	}
	// Then its key.
	srv.write(t, nil, key2)
	testutil.WaitFor(t, 30*time.Second, "the new certificate in force", func() bool {
		return s.certs.server.Load().Certificates[0].Leaf.Subject.CommonName == "server-2"
	})
	if got, err := servedCert(s.Addr(), roots, &cli1); err != nil || got.Subject.CommonName != "server-2" {
		t.Fatalf("after the rotation: %v %v, want server-2", got, err)
	}
	if want := float64(pair(t, crt2, key2).Leaf.NotAfter.Unix()); expiry() != want {
		t.Errorf("expiry gauge %v after the rotation, want %v", expiry(), want)
	}

	// The client CA: clients of the new one are let in, of the old one not.
	writeFile(t, dir, "ca.crt", ca2.pem)
	testutil.WaitFor(t, 30*time.Second, "the new client CA in force", func() bool {
		return val(s.certs.m.reloads.WithLabelValues(certClientCA)) == 2
	})
	if _, err := servedCert(s.Addr(), roots, &cli2); err != nil {
		t.Errorf("client of the new CA: %v", err)
	}
	if _, err := servedCert(s.Addr(), roots, &cli1); err == nil {
		t.Error("client of the old CA let in after the CA changed")
	}
}

// A certificate that has expired, is not valid yet or expires within 7
// days is warned of when it is loaded (at start), by file and date.
// Before, an expired certificate was served without a word.
func TestTLSCertsWarnOfExpiry(t *testing.T) {
	ca := newTestCA(t)
	now := time.Now()
	for _, c := range []struct {
		name                string
		notBefore, notAfter time.Time
		want                string
	}{
		{"expired", now.Add(-48 * time.Hour), now.Add(-24 * time.Hour), "has expired"},
		{"not yet valid", now.Add(24 * time.Hour), now.Add(48 * time.Hour), "not valid yet"},
		{"expires soon", now.Add(-time.Hour), now.Add(3 * 24 * time.Hour), "expires within 7 days"},
		{"valid", now.Add(-time.Hour), now.Add(30 * 24 * time.Hour), ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			crt, key := ca.leaf(t, "server", c.notBefore, c.notAfter)
			f := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
			f.write(t, crt, key)
			var buf testutil.SyncBuffer
			log := slog.New(slog.NewTextHandler(&buf, nil))
			m := newTLSMetrics(prometheus.NewRegistry(), nil)
			if _, err := newTLSCerts(&TLSConfig{CertFile: f.cert, KeyFile: f.key}, log, m); err != nil {
				t.Fatal(err)
			}
			warned := strings.Contains(buf.String(), "level=WARN")
			if c.want == "" {
				if warned {
					t.Errorf("a valid certificate warned of: %s", buf.String())
				}
				return
			}
			if !warned || !strings.Contains(buf.String(), c.want) || !strings.Contains(buf.String(), f.cert) {
				t.Errorf("log %q: want a warning %q naming the file", buf.String(), c.want)
			}
		})
	}
}
