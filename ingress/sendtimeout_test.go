package ingress

import (
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// dialNoRead is a TCP connection to s with a small receive buffer, for a
// client that sends a request and never reads its answer; closed with the
// test.
func dialNoRead(t *testing.T, s *Server) net.Conn {
	t.Helper()
	return dialNoReadAddr(t, s.Addr())
}

// dialNoReadAddr is dialNoRead to addr.
func dialNoReadAddr(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) {
			serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 4096)
		}); err != nil {
			return err
		}
		return serr
	}}
	conn, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return conn
}

// sendRequest writes one HTTP/1.1 POST of body to path on conn.
func sendRequest(t *testing.T, conn net.Conn, path, body string) {
	t.Helper()
	if _, err := fmt.Fprintf(conn, "POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body); err != nil {
		t.Fatal(err)
	}
}

// A client that stops reading a stream is cut after the send timeout with
// no byte taken: the engine sees its request cancelled, the request's
// MaxConcurrent slot is freed, and the access log says 499, client stopped
// reading. Before, the stream stalled with its slot and upstream connection
// until the client closed.
func TestSendTimeoutCutsAClientThatStopsReading(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultFloodStream)
	cfg := testConfig(StaticEngine{ID: "flood", Model: "m", URL: fe.url()})
	cfg.SendTimeout = 200 * time.Millisecond
	cfg.IdleTimeout = time.Hour // no upstream bound can end it
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	conn := dialNoRead(t, s)
	sendRequest(t, conn, "/v1/completions", `{"model":"m","prompt":[1],"stream":true}`)
	testutil.WaitFor(t, 30*time.Second, "the engine's request cancelled", func() bool { return fe.canceled.Load() == 1 })
	waitSettled(t, s)
	testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return strings.Contains(alog.String(), `"msg":"request"`) })
	l := accessLines(t, &alog)[0]
	if st, _ := l["status"].(float64); st != 499 {
		t.Fatalf("status %v, want 499: %v", l["status"], l)
	}
	if e, _ := l["error"].(string); !strings.HasPrefix(e, "client stopped reading") {
		t.Fatalf("error %q, want client stopped reading", e)
	}
}

// A big non-streamed answer to a client that does not read stays in
// service (its MaxConcurrent slot, the in-flight gauge) until it is written
// or the send timeout ends it: the access log says 499, client stopped
// reading, and the ingress settles. Before, the request finished (200) as
// the handler returned, and the answer waited in memory, uncounted, for as
// long as the client kept its connection.
func TestBufferedAnswerInServiceUntilWritten(t *testing.T) {
	var alog testutil.SyncBuffer
	fe := startFaultEngine(t, faultBigAnswer)
	cfg := testConfig(StaticEngine{ID: "big", Model: "m", URL: fe.url()})
	cfg.SendTimeout = 200 * time.Millisecond
	cfg.Health.StallAfter = 0 // a slow read of the answer on a loaded machine is no stall
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	conn := dialNoRead(t, s)
	sendRequest(t, conn, "/v1/completions", `{"model":"m","prompt":[1]}`)
	testutil.WaitFor(t, 2*time.Minute, "the access line", func() bool { return strings.Contains(alog.String(), `"msg":"request"`) }) // a hang guard: the 16 MiB answer costs seconds of CPU under -race
	l := accessLines(t, &alog)[0]
	if st, _ := l["status"].(float64); st != 499 {
		t.Fatalf("status %v, want 499: %v", l["status"], l)
	}
	if e, _ := l["error"].(string); !strings.HasPrefix(e, "client stopped reading") {
		t.Fatalf("error %q, want client stopped reading", e)
	}
	waitSettled(t, s)
	if fe.hits.Load() != 1 {
		t.Fatalf("%d engine requests, want 1", fe.hits.Load())
	}
}

// Once a write has gone the send timeout with nothing taken, the client is
// not reading: later writes fail at once, and closing a TLS connection
// (whose close_notify goes through sendConn) returns promptly. Before, the
// close_notify write replaced crypto/tls's 5 s deadline with the send
// timeout, and the connection lingered for a second whole send timeout.
func TestSendTimeoutTLSCloseIsPrompt(t *testing.T) {
	ca := testutil.NewCA(t)
	srvRaw, cliRaw := net.Pipe()
	defer cliRaw.Close()
	sc := &sendConn{Conn: srvRaw, d: 100 * time.Millisecond}
	crt, key := ca.ValidLeaf(t, "server")
	srv := tls.Server(sc, &tls.Config{Certificates: []tls.Certificate{testutil.Pair(t, crt, key)}})
	cli := tls.Client(cliRaw, &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"})
	hs := make(chan error, 1)
	go func() { hs <- cli.Handshake() }()
	if err := srv.Handshake(); err != nil {
		t.Fatal(err)
	}
	if err := <-hs; err != nil {
		t.Fatal(err)
	}
	// The client reads nothing more: the answer's write is cut.
	if _, err := srv.Write(make([]byte, 64<<10)); !errors.Is(err, errSendTimeout) {
		t.Fatalf("write to a client that does not read: %v, want %v", err, errSendTimeout)
	}
	// Were another wait started, it would take this long: far beyond the
	// bounds below, which only a prompt failure meets.
	sc.d = time.Hour
	done := make(chan error, 1)
	go func() {
		_, err := sc.Write([]byte("more"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errSendTimeout) {
			t.Fatalf("write after the send timeout: %v, want %v", err, errSendTimeout)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a write after the send timeout fired waits again")
	}
	go func() { done <- srv.Close() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("closing the TLS connection waits for a second send timeout")
	}
}

// A write deadline the caller sets (crypto/tls's for its close_notify, the
// admin server's WriteTimeout) ends a write before the send timeout, with
// the deadline's own error.
func TestSendConnKeepsTheCallersDeadline(t *testing.T) {
	srvRaw, cliRaw := net.Pipe()
	defer cliRaw.Close()
	sc := &sendConn{Conn: srvRaw, d: time.Hour}
	if err := sc.SetWriteDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := sc.Write([]byte("x"))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, os.ErrDeadlineExceeded) || errors.Is(err, errSendTimeout) {
			t.Fatalf("write past the caller's deadline: %v, want the deadline's error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the caller's write deadline is ignored")
	}
}
