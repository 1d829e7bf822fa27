package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A client's error body names the engine by id, never by address (which
// docs/SECURITY.md keeps from unauthenticated readers); the access log
// keeps the address for the operator. Three paths say an engine failed: a
// failed attempt (503), a request for a stored response whose engine
// cannot be reached (GET /v1/responses/{id} and its cancel, 503) and a
// stream that breaks after its commit (the SSE error event).
func TestClientErrorsNameNoEngineAddress(t *testing.T) {
	closedAddr := func(t *testing.T) string {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := ln.Addr().String()
		ln.Close() // nothing listens there now: the dial is refused
		return addr
	}
	// start starts an ingress routing to engine id at url, with an access
	// log (returned) and its other logs kept out of the test's output.
	start := func(t *testing.T, id, url string) (*Server, *testutil.SyncBuffer) {
		log, _ := syncLog()
		alog, abuf := syncLog()
		cfg := testConfig(StaticEngine{ID: id, Model: "m", URL: url})
		cfg.AccessLog = true
		return startIngress(t, cfg, Deps{Logger: log, AccessLog: alog}), abuf
	}
	// check fails t when the client's text lacks the engine's id or the
	// cause or names an address, or when the access log lost the address.
	check := func(t *testing.T, client, engine, cause, addr string, alog *testutil.SyncBuffer) {
		t.Helper()
		if !strings.Contains(client, "engine "+engine) || !strings.Contains(client, cause) {
			t.Errorf("the client read %s; want it to name engine %s and %q", client, engine, cause)
		}
		if strings.Contains(client, addr) || strings.Contains(client, "127.0.0.1") {
			t.Errorf("the client's text names the engine's address: %s", client)
		}
		testutil.WaitFor(t, 10*time.Second, "the access line with the engine's address", func() bool {
			return strings.Contains(alog.String(), addr)
		})
	}

	t.Run("failed attempt", func(t *testing.T) {
		addr := closedAddr(t)
		s, abuf := start(t, "e1", "http://"+addr)
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
		if st != 503 {
			t.Fatalf("status %d %s; want 503", st, body)
		}
		check(t, string(body), "e1", "connection refused", addr, abuf)
	})

	t.Run("stored response", func(t *testing.T) {
		addr := closedAddr(t)
		s, abuf := start(t, "e1", "http://"+addr)
		tag := make([]byte, respTagLen)
		engineTag(tag, "e1")
		id := respIDPrefix + string(tag) + strings.Repeat("0", 32)
		for _, r := range []struct{ method, path string }{
			{"GET", "/v1/responses/" + id},
			{"POST", "/v1/responses/" + id + "/cancel"},
		} {
			req, _ := http.NewRequest(r.method, "http://"+s.Addr()+r.path, nil)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 503 {
				t.Fatalf("%s %s: status %d %s; want 503", r.method, r.path, resp.StatusCode, body)
			}
			check(t, string(body), "e1", "connection refused", addr, abuf)
		}
		if n := strings.Count(abuf.String(), addr); n != 2 {
			t.Errorf("%d access lines name the engine's address, want 2 (GET and cancel):\n%s", n, abuf.String())
		}
	})

	t.Run("stream broken mid-way", func(t *testing.T) {
		// The engine sends a stream's headers and first event, then, once
		// the client has read that event (so the stream is committed),
		// resets the connection: the ingress's next read fails with
		// "read tcp <ingress>-><engine>: read: connection reset by peer".
		reset, quit := make(chan struct{}), make(chan struct{})
		t.Cleanup(func() { close(quit) })
		engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method != "POST" { // a health probe
				return
			}
			io.Copy(io.Discard, r.Body)
			conn, bw, err := w.(http.Hijacker).Hijack()
			if err != nil {
				return
			}
			ev := completionEvent(0, "tok", "")
			fmt.Fprintf(bw, "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n", len(ev), ev)
			bw.Flush()
			select {
			case <-reset:
			case <-quit:
			}
			conn.(*net.TCPConn).SetLinger(0) // Close sends RST
			conn.Close()
		}))
		t.Cleanup(engine.Close)
		addr := strings.TrimPrefix(engine.URL, "http://")
		s, abuf := start(t, "broken", engine.URL)
		req, _ := http.NewRequest("POST", "http://"+s.Addr()+"/v1/completions", strings.NewReader(`{"model":"m","prompt":[1],"stream":true}`))
		req.Header.Set("Content-Type", "application/json")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		if line, err := br.ReadString('\n'); resp.StatusCode != 200 || err != nil || !strings.HasPrefix(line, "data: ") {
			t.Fatalf("status %d, first line %q: %v", resp.StatusCode, line, err)
		}
		close(reset)
		rest, _ := io.ReadAll(br)
		var errEv string
		for _, ev := range sseEvents(rest) {
			if strings.HasPrefix(ev, `{"error"`) {
				errEv = ev
			}
		}
		if !strings.Contains(errEv, "failed mid-stream") {
			t.Fatalf("no mid-stream error event after the reset: %q", rest)
		}
		check(t, errEv, "broken", "connection reset by peer", addr, abuf)
	})
}
