package ingress

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// With authentication on, a request announcing a body over
// unauthBodyLimit is answered 401 from its headers when its credential
// fails, without waiting for the body (the test sends none: before, the
// ingress waited to buffer all 16 MB of it); with a good key the body is
// read whole (here: too long a prompt, a 400 from the request path).
func TestLargeBodyNeedsCredential(t *testing.T) {
	const key = "sk-body-test-0123456789"
	store := keyFileStore(t, "tester "+key+"\n")
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()})
	cfg.MaxPromptTokens = 1000
	s := startIngress(t, cfg, Deps{Auth: store})
	for _, c := range []struct{ name, hdr string }{
		{"no key", ""},
		{"wrong key", "Authorization: Bearer wrong\r\n"},
		{"x-api-key off the Messages API", "X-Api-Key: " + key + "\r\n"},
	} {
		conn, err := net.DialTimeout("tcp", s.Addr(), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		_ = conn.SetDeadline(time.Now().Add(20 * time.Second))
		fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n", c.hdr, 16<<20)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		conn.Close()
		if err != nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("%s: %v %v, want 401 before any body byte", c.name, resp, err)
		}
		resp.Body.Close()
	}
	big := `{"model":"m","max_tokens":1,"prompt":"` + strings.Repeat("word ", 400_000) + `"}` // 2 MB
	if st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", big, "Authorization", "Bearer "+key); st != http.StatusBadRequest {
		t.Fatalf("good key: %d %.200s, want the request path's 400", st, b)
	}
}
