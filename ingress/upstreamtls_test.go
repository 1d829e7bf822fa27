package ingress

import (
	"crypto/tls"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// engineTLS is an https engine's config: its certificate from ca, and,
// when clients is not nil, client certificates required from it.
func engineTLS(t *testing.T, ca, clients *testutil.CA, maxVersion uint16) *tls.Config {
	tc := &tls.Config{Certificates: []tls.Certificate{ca.ValidPair(t, "engine")}, MaxVersion: maxVersion}
	if clients != nil {
		tc.ClientCAs, tc.ClientAuth = clients.Pool(), tls.RequireAndVerifyClientCert
	}
	return tc
}

// An engine that refuses the ingress's client certificate (here expired)
// is ejected, as after a connect error: the client gets a 503 that names
// the ingress's client certificate and crypto/tls's alert, and no engine
// address; the failure is counted as client_cert_refused. In TLS 1.3 the
// refusal is an alert after the client's handshake, which fasthttp reported
// as "the server closed connection before returning the first response
// byte", a plain connect_error. Renewing the certificate's files ends it
// without a restart: the engines' probes, made with the certificate in
// force, readmit them. Before (M5), the engine was never ejected, so one
// engine whose trust bundle lacks the ingress's CA was picked forever.
func TestEngineRefusingOurClientCertIsEjectedUntilTheRenewal(t *testing.T) {
	for _, v := range []struct {
		name string
		max  uint16
	}{{"TLS1.3", tls.VersionTLS13}, {"TLS1.2", tls.VersionTLS12}} {
		t.Run(v.name, func(t *testing.T) {
			ca := testutil.NewCA(t)
			fe1 := startTLSFaultEngine(t, faultOK, engineTLS(t, ca, ca, v.max))
			fe2 := startTLSFaultEngine(t, faultOK, engineTLS(t, ca, ca, v.max))
			dir := t.TempDir()
			up := tlsFiles{cert: dir + "/up.crt", key: dir + "/up.key"}
			expCrt, expKey := ca.Leaf(t, "ingress", time.Now().Add(-48*time.Hour), time.Now().Add(-24*time.Hour))
			up.write(t, expCrt, expKey)
			cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe1.url()}, StaticEngine{ID: "e2", Model: "m", URL: fe2.url()})
			cfg.TLS = TLSConfig{UpstreamCAFile: testutil.WriteFile(t, dir, "ca.crt", ca.PEM), UpstreamCertFile: up.cert, UpstreamKeyFile: up.key}
			cfg.Health.EjectionTime, cfg.Health.MaxEjectionTime = 20*time.Millisecond, 40*time.Millisecond
			log, logBuf := syncLog()
			s := startIngress(t, cfg, Deps{Logger: log})
			url := "http://" + s.Addr() + "/v1/completions"
			st, _, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":"hi","max_tokens":1}`)
			if st != 503 {
				t.Fatalf("status %d: %s, want 503", st, body)
			}
			for _, want := range []string{`"code":"ingress_client_certificate_refused"`, "client certificate", "expired certificate"} {
				if !strings.Contains(string(body), want) {
					t.Errorf("body %s does not say %q", body, want)
				}
			}
			for _, fe := range []*faultEngine{fe1, fe2} {
				if addr := fe.ln.Addr().String(); strings.Contains(string(body), addr) {
					t.Errorf("body %s names engine address %s", body, addr)
				}
			}
			for _, id := range []string{"e1", "e2"} {
				if s.health.allowed(id) {
					t.Errorf("engine %s not ejected after refusing the ingress's certificate", id)
				}
			}
			if n := val(s.m.attempts.WithLabelValues("client_cert_refused")); n != 2 {
				t.Errorf("attempts{result=client_cert_refused} = %v, want 2", n)
			}
			if n := val(s.m.attempts.WithLabelValues("connect_error")); n != 0 {
				t.Errorf("attempts{result=connect_error} = %v, want 0", n)
			}
			if n := val(s.m.upstreamTLS.WithLabelValues(tlsCauseRefused)); n != 2 {
				t.Errorf("upstream_tls_errors{cause=client_certificate_refused} = %v, want 2", n)
			}
			if l := logBuf.String(); strings.Count(l, "refused this ingress's client certificate") != 1 {
				t.Errorf("want one warning (at most one per 10 s), log: %s", l)
			}

			// The probes present the expired certificate: still out.
			n := probesFailed(s, "e1")
			testutil.WaitFor(t, 20*time.Second, "two probes of e1 to fail", func() bool { return probesFailed(s, "e1") >= n+2 })
			if ej := s.health.ejected(); len(ej) != 2 {
				t.Fatalf("ejected %v before the renewal, want both", ej)
			}

			newCrt, newKey := ca.ValidLeaf(t, "ingress")
			up.write(t, newCrt, newKey)
			testutil.WaitFor(t, 30*time.Second, "the renewed client certificate in force", func() bool {
				return val(s.certs.m.reloads.WithLabelValues(certClient)) == 2
			})
			testutil.WaitFor(t, 20*time.Second, "the probes to readmit both engines", func() bool { return len(s.health.ejected()) == 0 })
			if st, _, body := post(t, http.DefaultClient, url, `{"model":"m","prompt":"hi","max_tokens":1}`); st != 200 {
				t.Fatalf("after the renewal: %d %s", st, body)
			}
		})
	}
}

// One engine whose trust bundle lacks the ingress's CA (the others take
// its certificate) is ejected by the first refusal: that request moves to
// another engine before its first byte, and later requests are not sent
// to it. Before (M5), affinity kept picking it, and each request routed
// there paid a dial, a handshake and a failed attempt.
func TestEngineWithWrongTrustBundleIsEjected(t *testing.T) {
	ca, other := testutil.NewCA(t), testutil.NewCA(t)
	bad := startTLSFaultEngine(t, faultOK, engineTLS(t, ca, other, 0))
	good := startTLSFaultEngine(t, faultOK, engineTLS(t, ca, ca, 0))
	dir := t.TempDir()
	up := tlsFiles{cert: dir + "/up.crt", key: dir + "/up.key"}
	crt, key := ca.ValidLeaf(t, "ingress")
	up.write(t, crt, key)
	cfg := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.url()}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
	cfg.Scheduler.Policy = "round-robin"
	cfg.TLS = TLSConfig{UpstreamCAFile: testutil.WriteFile(t, dir, "ca.crt", ca.PEM), UpstreamCertFile: up.cert, UpstreamKeyFile: up.key}
	s := startIngress(t, cfg, Deps{})
	for i := range 6 {
		if st, hdr, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`); st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" {
			t.Fatalf("request %d: %d from %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), body)
		}
	}
	if n := val(s.m.attempts.WithLabelValues("client_cert_refused")); n != 1 {
		t.Errorf("attempts{result=client_cert_refused} = %v, want 1 (then ejected)", n)
	}
	if ej := s.health.ejected(); len(ej) != 1 || ej[0] != "bad" {
		t.Errorf("ejected %v, want [bad]", ej)
	}
}

// An engine whose own certificate does not verify (here from a CA the
// ingress does not trust) stays the engine's failure (connect_error), but
// the handshake is made at dial time, so the log and
// kvmesh_ingress_upstream_tls_errors_total name the TLS cause; the client
// reads that the engine's certificate did not verify, without x509's text
// (it can name the engine's address).
func TestEngineCertFailureNamesTLS(t *testing.T) {
	engineCA, ourCA := testutil.NewCA(t), testutil.NewCA(t)
	fe := startTLSFaultEngine(t, faultOK, engineTLS(t, engineCA, nil, 0))
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.TLS = TLSConfig{UpstreamCAFile: testutil.WriteFile(t, t.TempDir(), "ca.crt", ourCA.PEM)}
	log, logBuf := syncLog()
	s := startIngress(t, cfg, Deps{Logger: log})
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
	if st != 503 || !strings.Contains(string(body), "engine e1") || !strings.Contains(string(body), "certificate did not verify") {
		t.Fatalf("status %d: %s, want 503 saying engine e1's certificate did not verify", st, body)
	}
	if strings.Contains(string(body), fe.ln.Addr().String()) || strings.Contains(string(body), "x509") {
		t.Errorf("body %s quotes x509 or the engine's address", body)
	}
	if n := val(s.m.attempts.WithLabelValues("connect_error")); n != 1 {
		t.Errorf("attempts{result=connect_error} = %v, want 1", n)
	}
	if n := val(s.m.upstreamTLS.WithLabelValues(tlsCauseEngineCert)); n != 1 {
		t.Errorf("upstream_tls_errors{cause=engine_certificate} = %v, want 1", n)
	}
	if l := logBuf.String(); !strings.Contains(l, "engine=e1") || !strings.Contains(l, "x509: certificate signed by unknown authority") {
		t.Errorf("log does not name the engine and the TLS cause: %s", l)
	}
}
