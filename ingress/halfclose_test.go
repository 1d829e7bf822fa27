package ingress

import (
	"bufio"
	"net"
	"net/http"
	"testing"
	"time"
)

// A client that shuts only its sending side while its request is served is
// seen leaving (499, as nginx and vLLM take it); one still reading gets the
// 499 with nginx's reason phrase, not fasthttp's "Unknown Status Code"
// (tester h-cancel F3).
func TestHalfClosedClientGets499(t *testing.T) {
	fe := startFaultEngine(t, faultHang)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	body := `{"model":"m","prompt":"hi","max_tokens":4}`
	for name, req := range map[string]string{
		"whole request": "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			itoa(len(body)) + "\r\n\r\n" + body,
		// The body cut short (h-reg7 F3): the head came, then the client
		// shut its side.
		"short body": "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
			itoa(len(body)+100) + "\r\n\r\n" + body,
	} {
		conn, err := net.Dial("tcp", s.Addr())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := conn.Write([]byte(req)); err != nil {
			t.Fatal(err)
		}
		if err := conn.(*net.TCPConn).CloseWrite(); err != nil {
			t.Fatal(err)
		}
		_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatalf("%s: no answer to a half-closed client: %v", name, err)
		}
		resp.Body.Close()
		conn.Close()
		if resp.StatusCode != 499 || resp.Status != "499 Client Closed Request" {
			t.Errorf("%s: status %q, want 499 Client Closed Request", name, resp.Status)
		}
		// h-reg7 F4: the client that reads the line can match it to the
		// access log.
		if resp.Header.Get("X-Request-Id") == "" {
			t.Errorf("%s: 499 without X-Request-Id: %v", name, resp.Header)
		}
	}
}
