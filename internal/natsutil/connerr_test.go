package natsutil_test

import (
	"context"
	"crypto/tls"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestTLSConnectErrorLogged (tester h-natsops F3): a client connecting in
// the background to a TLS server whose CA it was not given said only
// "nats not reachable yet"; the x509 reason was in no kvmesh log. It is
// warned now, with what to check, and no secret.
func TestTLSConnectErrorLogged(t *testing.T) {
	ca := testutil.NewCA(t)
	certPEM, keyPEM := ca.Leaf(t, "nats", time.Now().Add(-time.Hour), time.Now().Add(time.Hour))
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatal(err)
	}
	srv := testutil.NATSServer(t, server.Options{
		TLS: true, TLSConfig: &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, TLSTimeout: 2,
		Authorization: "tok-s3cret",
	})
	cfg := natsutil.DefaultConfig()
	cfg.URLs = []string{"tls://" + srv.Addr().String()}
	cfg.Token = "tok-s3cret"
	cfg.WaitForServer = true
	cfg.ReconnectWait = 20 * time.Millisecond
	cfg.Stream.Disabled = true
	var logs testutil.SyncBuffer
	c, err := natsutil.Connect(context.Background(), cfg, slog.New(slog.NewTextHandler(&logs, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	testutil.WaitFor(t, 20*time.Second, "the TLS error warned about", func() bool {
		l := logs.String()
		return strings.Contains(l, "level=WARN") && strings.Contains(l, "failed on TLS") && strings.Contains(l, "x509") && strings.Contains(l, "--nats-ca")
	})
	if strings.Contains(logs.String(), "tok-s3cret") {
		t.Fatalf("the token logged:\n%s", logs.String())
	}
}
