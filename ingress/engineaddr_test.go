package ingress

import (
	"net"
	"net/http"
	"strings"
	"testing"
)

// A client's error body names the engine by id, never by address (which
// docs/SECURITY.md keeps from unauthenticated readers); the access log
// keeps the address for the operator.
func TestClientErrorsNameNoEngineAddress(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close() // nothing listens there now: the dial is refused
	log, buf := syncLog()
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: "http://" + addr})
	cfg.AccessLog = true
	s := startIngress(t, cfg, Deps{Logger: log, AccessLog: log})
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"hi","max_tokens":1}`)
	if st != 503 || !strings.Contains(string(body), "engine e1") || !strings.Contains(string(body), "connection refused") {
		t.Fatalf("status %d %s; want 503 naming engine e1 and the cause", st, body)
	}
	if strings.Contains(string(body), addr) || strings.Contains(string(body), "127.0.0.1") {
		t.Errorf("the client's body names the engine's address: %s", body)
	}
	if !strings.Contains(buf.String(), addr) {
		t.Errorf("the log lost the engine's address:\n%s", buf.String())
	}
}
