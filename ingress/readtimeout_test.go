package ingress

import (
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/valyala/fasthttp"
)

// A connection that sends nothing within readTimeout is closed without an
// answer, counted and logged as no request: net/http and nginx do so, and
// fasthttp for an idle keep-alive connection. It used to get an unasked-for
// 408 (which a client starting its first request just then reads as its
// answer), counted in requests_total{endpoint="unknown",status="408"} and
// logged as "GET /": preconnects and probes inflated the 4xx rate. One that
// sent part of a head still gets its 408 (TestSlowRequestIs408).
func TestNothingSentClosesSilently(t *testing.T) {
	for _, useTLS := range []bool{false, true} {
		t.Run(map[bool]string{false: "plain", true: "tls"}[useTLS], func(t *testing.T) {
			var alog testutil.SyncBuffer
			cfg := testConfig()
			cfg.ReadTimeout = 200 * time.Millisecond
			cfg.AccessLog = true
			var tc *tls.Config
			if useTLS {
				dir := t.TempDir()
				ca := testutil.NewCA(t)
				crt, key := ca.ValidLeaf(t, "server")
				f := tlsFiles{cert: dir + "/tls.crt", key: dir + "/tls.key"}
				f.write(t, crt, key)
				cfg.TLS = TLSConfig{CertFile: f.cert, KeyFile: f.key}
				tc = &tls.Config{RootCAs: ca.Pool(), ServerName: "127.0.0.1"}
			}
			s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
			for i := range 3 {
				var conn net.Conn = dialIngress(t, s)
				if tc != nil {
					tconn := tls.Client(conn, tc)
					if err := tconn.Handshake(); err != nil { // done: the connection is up, and no request comes
						t.Fatal(err)
					}
					conn = tconn
				}
				b, err := io.ReadAll(conn) // bounded: dialIngress's 10 s deadline
				if err != nil || len(b) != 0 {
					t.Fatalf("connection %d: read %q, %v; want a close with nothing written", i, b, err)
				}
			}
			if n := seriesSum(s.m.requests); n != 0 {
				t.Errorf("requests_total = %v, want 0: no request was sent", n)
			}
			if lines := accessLines(t, &alog); len(lines) != 0 {
				t.Errorf("access lines for no request: %v", lines)
			}
		})
	}
}

// A body that stops arriving gets its 408 under the request's own
// endpoint, method, path and X-Request-Id, as a 413 does: fasthttp wipes
// the head when a body read fails, and the answer, the counter and the
// access line said endpoint "unknown", "GET /" and an id of the
// ingress's own, so an operator could not tell which endpoint or client a
// too-low readTimeout cut.
func TestBodyTimeoutKeepsHead(t *testing.T) {
	for _, tc := range []struct{ name, framing, part string }{
		{"content-length", "Content-Length: 119\r\n", `{"model":"m",`},
		{"chunked", "Transfer-Encoding: chunked\r\n", "d\r\n{\"model\":\"m\",\r\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var alog testutil.SyncBuffer
			cfg := testConfig()
			cfg.ReadTimeout = 200 * time.Millisecond
			cfg.MaxBodyBytes = 1 << 10
			cfg.AccessLog = true
			s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
			// A body read whole (the handler answers, 404 for the model
			// here) or refused unread (413) leaves no note behind.
			for _, body := range []string{`{"model":"m","messages":[]}`, strings.Repeat("x", cfg.MaxBodyBytes+1)} {
				resp, err := http.Post("http://"+s.Addr()+"/v1/chat/completions", "application/json", strings.NewReader(body))
				if err != nil {
					t.Fatal(err)
				}
				resp.Body.Close()
			}
			if n := s.heads.n.Load(); n != 0 {
				t.Fatalf("%d head notes left by requests answered", n)
			}
			conn := dialIngress(t, s)
			if _, err := fmt.Fprintf(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvmesh\r\nContent-Type: application/json\r\n"+
				"X-Request-Id: my-req-123\r\n%s\r\n%s", tc.framing, tc.part); err != nil {
				t.Fatal(err)
			}
			resp := read408(t, conn)
			if id := resp.Header.Get("X-Request-Id"); id != "my-req-123" {
				t.Errorf("X-Request-Id %q, want the client's", id)
			}
			if n := val(s.m.requests.WithLabelValues("chat", "408")); n != 1 {
				t.Errorf(`requests_total{endpoint="chat",status="408"} = %v, want 1 (all: %v)`, n, seriesSum(s.m.requests))
			}
			testutil.WaitFor(t, 5*time.Second, "the access line", func() bool { return len(accessLines(t, &alog)) == 3 })
			l := accessLines(t, &alog)[2]
			if l["endpoint"] != "chat" || l["method"] != "POST" || l["path"] != "/v1/chat/completions" ||
				l["request_id"] != "my-req-123" || l["status"] != float64(408) {
				t.Errorf("access line %v", l)
			}
			if n := s.heads.n.Load(); n != 0 {
				t.Errorf("%d head notes left", n)
			}
		})
	}
}

// A client that closes its connection during its body is a client gone:
// 499 under the request's own endpoint, path and X-Request-Id (it was a 400
// under endpoint "unknown", "GET /", with a fresh id).
func TestBodyCutByClientKeepsHead(t *testing.T) {
	var alog testutil.SyncBuffer
	cfg := testConfig()
	cfg.AccessLog = true
	s := startIngress(t, cfg, Deps{AccessLog: slog.New(slog.NewJSONHandler(&alog, nil))})
	conn := dialIngress(t, s)
	if _, err := fmt.Fprint(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: kvmesh\r\nContent-Type: application/json\r\n"+
		"X-Request-Id: cut-mid-body-1\r\nContent-Length: 1000\r\n\r\n{\"model\":\"m\","); err != nil {
		t.Fatal(err)
	}
	conn.Close()
	testutil.WaitFor(t, 10*time.Second, "the access line", func() bool { return len(accessLines(t, &alog)) == 1 })
	l := accessLines(t, &alog)[0]
	if l["endpoint"] != "chat" || l["method"] != "POST" || l["path"] != "/v1/chat/completions" ||
		l["request_id"] != "cut-mid-body-1" || l["status"] != float64(499) {
		t.Errorf("access line %v", l)
	}
	if n := val(s.m.requests.WithLabelValues("chat", "499")); n != 1 {
		t.Errorf(`requests_total{endpoint="chat",status="499"} = %v, want 1 (all: %v)`, n, seriesSum(s.m.requests))
	}
	testutil.WaitFor(t, 10*time.Second, "no head note left", func() bool { return s.heads.n.Load() == 0 })
}

// Keeping the head of every request with a body costs an inference request
// no allocation (its method and path are constants; a client's
// X-Request-Id is copied when it sends one).
func TestHeadNoteAllocatesNothing(t *testing.T) {
	s, err := New(testConfig(), Deps{Logger: quietLog()})
	if err != nil {
		t.Fatal(err)
	}
	var h fasthttp.RequestHeader
	h.SetMethod("POST")
	h.SetRequestURI("/v1/chat/completions")
	h.SetContentLength(100)
	if n := testing.AllocsPerRun(200, func() {
		s.headerReceived(&h)
		s.heads.forget(&h)
	}); n != 0 {
		t.Errorf("%v allocations per request", n)
	}
	s.headerReceived(&h)
	if n := s.heads.take(&h); n.endpoint != "chat" || n.method != "POST" || n.path != "/v1/chat/completions" {
		t.Errorf("note %+v", n)
	}
}

// A keep-alive connection idle between requests is closed after
// clientIdleTimeout (config; default 90 s), so a load balancer whose idle
// timeout is longer can be matched.
func TestClientIdleTimeoutClosesKeepAlive(t *testing.T) {
	cfg := testConfig()
	cfg.ClientIdleTimeout = 200 * time.Millisecond
	s := startIngress(t, cfg, Deps{})
	conn := dialIngress(t, s)
	if _, err := io.WriteString(conn, "GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn) // bounded: dialIngress's 10 s deadline
	if err != nil {
		t.Fatalf("the idle keep-alive connection was not closed: %v (read %q)", err, b)
	}
	if !strings.HasPrefix(string(b), "HTTP/1.1 200") || strings.Count(string(b), "HTTP/1.1") != 1 {
		t.Fatalf("want one 200 answer, then the close: %q", b)
	}
}
