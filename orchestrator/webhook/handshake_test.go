package webhook

import (
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A failed TLS handshake (here a client that does not trust the served
// certificate) goes through slog, not net/http's own log line: counted,
// logged at debug, and warned of once per interval with the served
// certificate's expiry and issuer.
func TestFailedHandshakesLoggedThroughSlogAndCounted(t *testing.T) {
	certs, err := GenerateCerts("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	var buf testutil.SyncBuffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
	srv, err := listen("127.0.0.1:0", func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &certs.Cert, nil }, nil,
		&Handler{Sidecar: DefaultSidecarConfig(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "webhook server", srv.Serve, buf.String)

	other := testutil.NewCA(t)
	before := promtest.ToFloat64(tlsHandshakeErrors)
	for i := range 2 {
		if c, err := tls.Dial("tcp", srv.Addr(), &tls.Config{RootCAs: other.Pool(), ServerName: "127.0.0.1"}); err == nil {
			c.Close()
			t.Fatal("a client not trusting the certificate completed a handshake")
		}
		testutil.WaitFor(t, time.Minute, "the failed handshake counted", func() bool {
			return promtest.ToFloat64(tlsHandshakeErrors) >= before+float64(i+1)
		})
	}
	testutil.WaitFor(t, time.Minute, "both failures logged at debug", func() bool {
		return strings.Count(buf.String(), "level=DEBUG msg=\"TLS handshake with the webhook failed\"") == 2
	})
	out := buf.String()
	if n := strings.Count(out, "level=WARN"); n != 1 {
		t.Fatalf("%d warnings, want 1:\n%s", n, out)
	}
	if !strings.Contains(out, "servedNotAfter="+certs.NotAfter().UTC().Format(time.RFC3339)) || !strings.Contains(out, `servedIssuer="CN=kvmesh-webhook-ca"`) {
		t.Fatalf("the warning does not name the served certificate:\n%s", out)
	}
	if strings.Contains(out, "http: TLS handshake error") && !strings.Contains(out, "level=") {
		t.Fatalf("an unstructured line:\n%s", out)
	}
}
