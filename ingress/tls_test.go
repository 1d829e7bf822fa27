package ingress

import (
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
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
	// client's handshake is done: a request's answer (any HTTP status) or
	// the server's alert is its verdict, however long a loaded machine
	// takes to give it (the deadline only guards a hang).
	_ = c.SetDeadline(time.Now().Add(60 * time.Second))
	if _, err := c.Write([]byte("GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")); err != nil {
		return nil, err
	}
	if _, err := c.Read(make([]byte, 1)); err != nil {
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
	ca1, ca2 := testutil.NewCA(t), testutil.NewCA(t)
	srv := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
	crt1, key1 := ca1.ValidLeaf(t, "server-1")
	srv.write(t, crt1, key1)
	caFile := testutil.WriteFile(t, dir, "ca.crt", ca1.PEM)
	cfg := testConfig()
	cfg.TLS = TLSConfig{CertFile: srv.cert, KeyFile: srv.key, ClientCAFile: caFile}
	reg := prometheus.NewRegistry()
	s := startIngress(t, cfg, Deps{Registry: reg})
	cli1, cli2 := ca1.ValidPair(t, "client-1"), ca2.ValidPair(t, "client-2")
	roots := ca1.Pool()
	roots.AppendCertsFromPEM(ca2.PEM)
	expiry := func() float64 { return val(s.certs.m.expiry.WithLabelValues(certServer)) }

	got, err := servedCert(s.Addr(), roots, &cli1)
	if err != nil || got.Subject.CommonName != "server-1" {
		t.Fatalf("before the rotation: %v %v, want server-1", got, err)
	}
	leaf1 := testutil.Pair(t, crt1, key1).Leaf
	if expiry() != float64(leaf1.NotAfter.Unix()) {
		t.Errorf("expiry gauge %v, want %v", expiry(), leaf1.NotAfter.Unix())
	}

	// The certificate first: it does not match the key in place.
	crt2, key2 := ca2.Leaf(t, "server-2", time.Now().Add(-time.Hour), time.Now().Add(48*time.Hour))
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
	if want := float64(testutil.Pair(t, crt2, key2).Leaf.NotAfter.Unix()); expiry() != want {
		t.Errorf("expiry gauge %v after the rotation, want %v", expiry(), want)
	}

	// The client CA: clients of the new one are let in, of the old one not.
	testutil.WriteFile(t, dir, "ca.crt", ca2.PEM)
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
	ca := testutil.NewCA(t)
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
			crt, key := ca.Leaf(t, "server", c.notBefore, c.notAfter)
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

// Failed TLS handshakes are counted by reason in
// kvmesh_ingress_tls_handshake_errors_total, not as requests answered:
// nothing can be written on such a connection. Plain HTTP sent to the TLS
// port gets net/http's hint as a 400 (with the OpenAI error body). Before,
// each was counted as requests_total{endpoint="unknown",status="400"} (or
// 408) and plain HTTP got an empty reply.
func TestTLSHandshakeErrorsAreNotRequests(t *testing.T) {
	dir := t.TempDir()
	ca := testutil.NewCA(t)
	crt, key := ca.ValidLeaf(t, "server")
	f := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
	f.write(t, crt, key)
	cfg := testConfig()
	cfg.TLS = TLSConfig{CertFile: f.cert, KeyFile: f.key, ClientCAFile: testutil.WriteFile(t, dir, "ca.crt", ca.PEM)}
	cfg.ReadTimeout = 500 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	hs := func(reason string) float64 { return val(s.certs.m.handshakeErrs.WithLabelValues(reason)) }
	raw := func(send string, closeAfter bool) string {
		t.Helper()
		c, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if _, err := c.Write([]byte(send)); err != nil {
			t.Fatal(err)
		}
		if closeAfter {
			return ""
		}
		_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
		b, _ := io.ReadAll(c)
		return string(b)
	}

	answer := raw("GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", false)
	if !strings.HasPrefix(answer, "HTTP/1.0 400 Bad Request\r\n") || !strings.Contains(answer, "client sent an HTTP request to an HTTPS server") ||
		!strings.Contains(answer, `"type":"invalid_request_error"`) {
		t.Errorf("plain HTTP to the TLS port: %q", answer)
	}
	testutil.WaitFor(t, 10*time.Second, "not_tls counted", func() bool { return hs(hsNotTLS) == 1 })

	if _, err := servedCert(s.Addr(), ca.Pool(), nil); err == nil {
		t.Error("a client without a certificate was let in")
	}
	testutil.WaitFor(t, 10*time.Second, "client_cert counted", func() bool { return hs(hsClientCert) == 1 })

	c, err := tls.Dial("tcp", s.Addr(), &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1", MinVersion: tls.VersionTLS10, MaxVersion: tls.VersionTLS11})
	if err == nil {
		c.Close()
		t.Error("TLS 1.1 accepted")
	}
	testutil.WaitFor(t, 10*time.Second, "protocol counted", func() bool { return hs(hsProtocol) == 1 })

	raw("\x16\x03\x01", true) // a ClientHello's start, then gone
	testutil.WaitFor(t, 10*time.Second, "closed counted", func() bool { return hs(hsClosed) == 1 })

	stalled, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer stalled.Close()
	if _, err := stalled.Write([]byte("\x16\x03\x01\x00")); err != nil { // and nothing more: readTimeout ends it
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "timeout counted", func() bool { return hs(hsTimeout) == 1 })

	for _, st := range []string{"400", "408"} {
		if n := val(s.m.requests.WithLabelValues("unknown", st)); n != 0 {
			t.Errorf("requests_total{endpoint=unknown,status=%s} = %v, want 0: no request was answered", st, n)
		}
	}
}

// TestTLSLogKeysUnique: the warning of a certificate near its expiry, on
// the server's JSON log, names each key once. It used to add
// component=tls to the server's component=ingress, and log pipelines keep
// the first or the last of a repeated key as they please.
func TestTLSLogKeysUnique(t *testing.T) {
	ca := testutil.NewCA(t)
	dir := t.TempDir()
	crt, key := ca.Leaf(t, "server", time.Now().Add(-time.Hour), time.Now().Add(24*time.Hour))
	f := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
	f.write(t, crt, key)
	var buf testutil.SyncBuffer
	cfg := DefaultConfig()
	cfg.TLS = TLSConfig{CertFile: f.cert, KeyFile: f.key}
	cfg.Engines = []StaticEngine{{ID: "e1", Model: "m", URL: "http://127.0.0.1:1"}}
	startIngress(t, cfg, Deps{Logger: slog.New(slog.NewJSONHandler(&buf, nil))})
	warned := false
	for _, line := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		warned = warned || strings.Contains(line, "expires within 7 days")
		if k, dup := repeatedKey([]byte(line)); dup {
			t.Errorf("key %q twice in %s", k, line)
		}
	}
	if !warned {
		t.Errorf("no expiry warning in %s", buf.String())
	}
}
