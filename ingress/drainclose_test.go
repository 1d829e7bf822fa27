package ingress

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// While the ingress drains, every answer closes its connection: a client
// on a keep-alive connection (the OpenAI SDKs' pools, Envoy's, nginx's)
// reconnects, through its Service, to a live replica. Before, the draining
// replica answered 503 on the same connection for the whole drain, and its
// end closed the idle connection under the client's next request (a broken
// pipe no client retries a POST on).
func TestDrainClosesKeepAliveConnections(t *testing.T) {
	fe := startFaultEngine(t, faultSlowStream) // streams until the client goes away: the drain lasts
	cfg := testConfig(StaticEngine{ID: "slow", Model: "m", URL: fe.url()})
	cfg.DrainTimeout = 10 * time.Minute
	s := startIngress(t, cfg, Deps{})
	stream, err := http.Post("http://"+s.Addr()+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Body.Close()
	if line, err := bufio.NewReader(stream.Body).ReadString('\n'); err != nil || !strings.HasPrefix(line, "data: ") {
		t.Fatalf("first event: %q %v", line, err)
	}

	conn, err := net.Dial("tcp", s.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	br := bufio.NewReader(conn)
	ask := func(req string) *http.Response {
		t.Helper()
		if _, err := io.WriteString(conn, req); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := io.Copy(io.Discard, resp.Body); err != nil {
			t.Fatal(err)
		}
		return resp
	}
	if resp := ask("GET /health HTTP/1.1\r\nHost: x\r\n\r\n"); resp.StatusCode != 200 || resp.Close {
		t.Fatalf("before the drain: status %d, close %v; want 200 on a kept connection", resp.StatusCode, resp.Close)
	}

	closed := make(chan error, 1)
	go func() { closed <- s.Close() }()
	testutil.WaitFor(t, 10*time.Second, "the ingress draining", s.draining.Load)
	body := `{"model":"m","prompt":[1],"max_tokens":1}`
	resp := ask("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: " +
		itoa(len(body)) + "\r\n\r\n" + body)
	if resp.StatusCode != 503 || !resp.Close {
		t.Fatalf("while draining: status %d, Connection: close %v; want 503 closing the connection", resp.StatusCode, resp.Close)
	}
	if n, err := br.ReadByte(); err != io.EOF {
		t.Fatalf("the connection stayed open after the draining answer (read %v, %v)", n, err)
	}

	stream.Body.Close() // the last request in service: the drain ends
	select {
	case err := <-closed:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(time.Minute): // a deadlock guard, not a timing assertion
		t.Fatal("Close did not return after the last stream ended")
	}
}
