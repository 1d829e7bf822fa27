package ingress

import (
	"crypto/tls"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// startHangIngress is an ingress in front of one engine that never answers,
// with tlsOn a TLS listener (a certificate from testutil.ServerCert); the client's
// leaving is the only way its requests end.
func startHangIngress(t *testing.T, tlsOn bool, adjust ...func(*Config)) (*Server, *faultEngine) {
	t.Helper()
	hang := startFaultEngine(t, faultHang)
	cfg := testConfig(StaticEngine{ID: "hang", Model: "m", URL: hang.url()})
	for _, f := range adjust {
		f(&cfg)
	}
	cfg.IdleTimeout = time.Minute
	cfg.Health.StallAfter = 0 // the hang is the client's to end, not the stall watch's
	if tlsOn {
		_, cfg.TLS.CertFile, cfg.TLS.KeyFile = testutil.ServerCert(t, t.TempDir())
	}
	return startIngress(t, cfg, Deps{}), hang
}

// leaveMidRequest sends one non-streamed request on conn, waits until the
// engine has it, runs then (the client's last act before closing) and closes
// conn; it checks that the engine's request is canceled and the request
// counted as 499.
func leaveMidRequest(t *testing.T, s *Server, hang *faultEngine, conn net.Conn, then func()) {
	t.Helper()
	body := `{"model":"m","prompt":[1,2]}`
	if _, err := fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: kvmesh\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(body), body); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the request on the hanging engine", func() bool { return hang.hits.Load() == 1 })
	if then != nil {
		then()
	}
	conn.Close()
	testutil.WaitFor(t, 10*time.Second, "the engine's request canceled", func() bool { return hang.canceled.Load() == 1 })
	waitSettled(t, s)
	if got := val(s.m.requests.WithLabelValues("completions", "499")); got != 1 {
		t.Fatalf("499 count %v", got)
	}
}

// A TLS client that closes its connection while its non-streamed request
// runs: its close_notify alert reaches the socket ahead of its FIN, and the
// watcher still sees it leave (POLLRDHUP behind the unread record).
func TestClientDisconnectOverTLSCancelsUpstream(t *testing.T) {
	if !finBehindBytes {
		t.Skip("TLS connections are not watched on this platform")
	}
	s, hang := startHangIngress(t, true)
	conn, err := tls.Dial("tcp", s.Addr(), &tls.Config{InsecureSkipVerify: true}) // the test's own CA signed it
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	leaveMidRequest(t, s, hang, conn, nil)
}

// A plain-HTTP client that pipelines the start of a next request and then
// closes: the unread bytes do not hide its FIN from the watcher.
func TestClientDisconnectAfterPipelinedBytesCancelsUpstream(t *testing.T) {
	if !finBehindBytes {
		t.Skip("unread bytes end the watch on this platform")
	}
	s, hang := startHangIngress(t, false)
	conn := dialIngress(t, s)
	leaveMidRequest(t, s, hang, conn, func() {
		if _, err := fmt.Fprint(conn, "POST /v1/completions HTTP/1.1\r\n"); err != nil {
			t.Fatal(err)
		}
	})
}

// A client that leaves after the server's read timeout (the deadline for
// reading its request, which the connection still carries while the answer
// is awaited) is seen leaving: the watch does not end at that deadline.
func TestClientDisconnectAfterReadTimeoutCancelsUpstream(t *testing.T) {
	const readTimeout = 100 * time.Millisecond
	s, hang := startHangIngress(t, false, func(c *Config) { c.ReadTimeout = readTimeout })
	conn := dialIngress(t, s)
	leaveMidRequest(t, s, hang, conn, func() {
		// The request's read deadline has passed once this much wall time
		// has; the client leaves only then.
		<-time.After(3 * readTimeout)
	})
}
