package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

// expectResponse sends a POST head with "Expect: 100-continue" and hdr, and
// returns the first response the ingress answers the head alone with (a
// 100 Continue, or the final answer without it) and the connection.
func expectResponse(t *testing.T, addr, hdr string, contentLength int) (*http.Response, []byte, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second)) // a bound for a broken server, not a timing assertion
	fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n%sContent-Length: %d\r\n\r\n", hdr, contentLength)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	var body []byte
	if resp.StatusCode != http.StatusContinue {
		body, _ = io.ReadAll(resp.Body)
	}
	resp.Body.Close()
	return resp, body, conn, br
}

// A request with "Expect: 100-continue" whose body the ingress will refuse
// gets the refusal at once, with its OpenAI error body, and no "100
// Continue" that would invite the body: too large by Content-Length (413),
// a failing credential on a large body (401). One it will read gets 100
// and then its answer.
func TestExpectContinueRefusesEarly(t *testing.T) {
	const key = "sk-expect-test-0123456789"
	store := keyFileStore(t, "tester "+key+"\n")
	fe := startFaultEngine(t, faultOK)
	open := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{})
	keyed := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Auth: store})

	for _, c := range []struct {
		name, addr, hdr string
		length, status  int
		want            string
	}{
		{"too large", open.Addr(), "", 40_000_000, 413, "limit is 33554432 bytes"},
		{"too large, good key", keyed.Addr(), "Authorization: Bearer " + key + "\r\n", 40_000_000, 413, "limit is 33554432 bytes"},
		{"wrong key", keyed.Addr(), "Authorization: Bearer wrong\r\n", 1_000_000, 401, "invalid_api_key"},
		{"no key", keyed.Addr(), "", 1_000_000, 401, `"type":"invalid_request_error"`},
	} {
		resp, body, _, _ := expectResponse(t, c.addr, c.hdr, c.length)
		if resp.StatusCode != c.status || !strings.Contains(string(body), `"error":{`) || !strings.Contains(string(body), c.want) {
			t.Errorf("%s: %d %s, want %d with an OpenAI error body saying %q and no 100 Continue first", c.name, resp.StatusCode, body, c.status, c.want)
		}
	}

	body := `{"model":"m","prompt":"hi","max_tokens":1}`
	resp, _, conn, br := expectResponse(t, keyed.Addr(), "Authorization: Bearer "+key+"\r\n", len(body))
	if resp.StatusCode != http.StatusContinue {
		t.Fatalf("good key, small body: %d, want 100 Continue", resp.StatusCode)
	}
	if _, err := io.WriteString(conn, body); err != nil {
		t.Fatal(err)
	}
	final, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(final.Body)
	final.Body.Close()
	if final.StatusCode != 200 {
		t.Fatalf("good key after 100 Continue: %d %s", final.StatusCode, b)
	}
}
