package ingress

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
)

// rawExchange writes req on a new connection to s and reads until the
// ingress closes it (or the bound passes: the connection was kept open),
// returning what came and whether the ingress closed the connection.
func rawExchange(t *testing.T, s *Server, req string) (string, bool) {
	t.Helper()
	conn := dialIngress(t, s) // a 10 s deadline: a bound, not a timing assertion
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	b, err := io.ReadAll(conn)
	return string(b), err == nil
}

// A multipart/form-data body is not parsed by fasthttp before the handler
// (a part over 16 MiB went to a temporary file, outside the body bounds, and
// a body that did not parse was answered with Go's multipart error text):
// it is read as any body, and the JSON endpoints refuse it with 415 and the
// OpenAI error body, keeping the connection.
func TestMultipartBodyRefused(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	part := "--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--x--\r\n"
	for _, body := range []string{`{}`, part} {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize"} {
			req := fmt.Sprintf("POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: multipart/form-data; boundary=x\r\nContent-Length: %d\r\n\r\n%s", path, len(body), body)
			// A second request after it: the refusal keeps the connection.
			got, closed := rawExchange(t, s, req+"GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
			if !strings.HasPrefix(got, "HTTP/1.1 415 ") || !strings.Contains(got, `"code":"unsupported_media_type"`) ||
				!strings.Contains(got, `"type":"invalid_request_error"`) || strings.Contains(got, "NextPart") ||
				!strings.Contains(got, `{"status":"ok"}`) || !closed {
				t.Errorf("%s, body %q: %q; want 415 unsupported_media_type, then the next request served", path, body, got)
			}
		}
	}
}

// A multipart body with a bad or missing credential gets the 401 any body
// gets, not the 415 (which a good credential gets).
func TestMultipartBodyAuthFirst(t *testing.T) {
	const key = "sk-multipart-test-0123456789"
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Auth: keyFileStore(t, "tester "+key+"\n")})
	part := "--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\r\nRIFF\r\n--x--\r\n"
	for hdr, want := range map[string]string{"": "HTTP/1.1 401 ", "Authorization: Bearer wrong\r\n": "HTTP/1.1 401 ", "Authorization: Bearer " + key + "\r\n": "HTTP/1.1 415 "} {
		req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\n%sContent-Type: multipart/form-data; boundary=x\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s", hdr, len(part), part)
		if got, _ := rawExchange(t, s, req); !strings.HasPrefix(got, want) || !strings.Contains(got, `"error":{`) {
			t.Errorf("%q: %q; want %q and an OpenAI error body", hdr, got, want)
		}
	}
}

// A streamed answer to an HTTP/1.0 client is not chunked (RFC 9112 §6.1),
// also when it asked for keep-alive: it is delimited by the connection's
// close, with Connection: close.
func TestHTTP10StreamCloseDelimited(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	body := `{"model":"m","prompt":"hello","max_tokens":3,"stream":true}`
	for _, ka := range []string{"Connection: keep-alive\r\n", ""} {
		req := fmt.Sprintf("POST /v1/completions HTTP/1.0\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s", ka, len(body), body)
		got, closed := rawExchange(t, s, req)
		head, rest, _ := strings.Cut(got, "\r\n\r\n")
		lower := strings.ToLower(head)
		if !closed || !strings.HasPrefix(got, "HTTP/1.1 200 ") || strings.Contains(lower, "transfer-encoding") ||
			strings.Contains(lower, "content-length") || !strings.Contains(lower, "connection: close") ||
			strings.Contains(lower, "keep-alive") || !strings.HasPrefix(rest, "data: {") || !strings.HasSuffix(rest, "data: [DONE]\n\n") {
			t.Errorf("%q: closed %v, %q; want a close-delimited event stream", ka, closed, got)
		}
	}
	// HTTP/1.1 is still chunked on a kept connection.
	req := fmt.Sprintf("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%sGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n", len(body), body)
	got, _ := rawExchange(t, s, req)
	if !strings.Contains(got, "Transfer-Encoding: chunked") || !strings.Contains(got, "0\r\n\r\nHTTP/1.1 200 ") {
		t.Errorf("HTTP/1.1: %q; want a chunked stream and the next request served", got)
	}
}

// A chunked body with "Expect: 100-continue" and a failing credential gets
// the 401 from its head, without "100 Continue": the client never starts a
// body that would be cut at 64 KiB.
func TestExpectContinueChunkedBadKey(t *testing.T) {
	const key = "sk-expect-test-0123456789"
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e1", Model: "m", URL: fe.url()}), Deps{Auth: keyFileStore(t, "tester "+key+"\n")})
	for _, c := range []struct {
		hdr    string
		status int
	}{{"", 401}, {"Authorization: Bearer wrong\r\n", 401}, {"Authorization: Bearer " + key + "\r\n", 100}} {
		conn := dialIngress(t, s)
		fmt.Fprintf(conn, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nExpect: 100-continue\r\n%sTransfer-Encoding: chunked\r\n\r\n", c.hdr)
		resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
		if err != nil {
			t.Fatal(err)
		}
		var b []byte
		if resp.StatusCode != 100 {
			b, _ = io.ReadAll(resp.Body)
		}
		resp.Body.Close()
		if resp.StatusCode != c.status || c.status == 401 && !strings.Contains(string(b), `"error":{`) {
			t.Errorf("%q: %d %s, want %d", c.hdr, resp.StatusCode, b, c.status)
		}
	}
}

// Every answer carries Date (RFC 9110 §6.6.1), the successful ones too.
func TestDateOnEveryAnswer(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	base := "http://" + s.Addr()
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/health", ""}, {"HEAD", "/v1/models", ""}, {"GET", "/nope", ""},
		{"POST", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2}`},
		{"POST", "/v1/completions", `{"model":"m","prompt":"hi","max_tokens":2,"stream":true}`},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		_, _ = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if d, err := http.ParseTime(resp.Header.Get("Date")); err != nil || d.Year() < 2000 {
			t.Errorf("%s %s %s: %d, Date %q", c.method, c.path, c.body, resp.StatusCode, resp.Header.Get("Date"))
		}
	}
}

// /ping takes GET and POST (vLLM's), and HEAD as every GET route; other
// methods get 405 naming them.
func TestPingMethods(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	waitSettled(t, s)
	for _, m := range []string{"GET", "POST", "HEAD", "PUT", "DELETE", "PATCH"} {
		req, _ := http.NewRequest(m, "http://"+s.Addr()+"/ping", nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		want := 200
		if m != "GET" && m != "POST" && m != "HEAD" {
			want = 405
		}
		if resp.StatusCode != want || want == 405 && (resp.Header.Get("Allow") != "GET, HEAD, POST" || !strings.Contains(string(b), `"code":"method_not_allowed"`)) {
			t.Errorf("%s /ping: %d, Allow %q, %s; want %d", m, resp.StatusCode, resp.Header.Get("Allow"), b, want)
		}
	}
}

// HEAD /v1/responses/{id} is served as its GET, without the body, as every
// other GET route.
func TestResponseByIDHead(t *testing.T) {
	asked := make(chan string, 1)
	const stored = `{"id":"x","object":"response","status":"completed"}`
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		select {
		case asked <- r.Method:
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, stored)
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://" + ln.Addr().String()}), Deps{})
	var tag [respTagLen]byte
	engineTag(tag[:], "e")
	id := respIDPrefix + string(tag[:]) + strings.Repeat("0", 32)
	got, _ := rawExchange(t, s, "HEAD /v1/responses/"+id+" HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if !strings.HasPrefix(got, "HTTP/1.1 200 ") || !strings.Contains(got, fmt.Sprintf("Content-Length: %d\r\n", len(stored))) || !strings.HasSuffix(got, "\r\n\r\n") {
		t.Fatalf("HEAD: %q; want 200 with the GET's Content-Length and no body", got)
	}
	if m := <-asked; m != "GET" { // asked: the 200 came from it
		t.Errorf("the engine was asked %s", m)
	}
}

// A request line of another major version (HTTP/2.0 sent as text) gets 505
// with the OpenAI error body; a later HTTP/1 minor version (HTTP/1.2) is
// served as HTTP/1.1, its connection kept.
func TestHTTPVersions(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	for _, v := range []string{"HTTP/2.0", "HTTP/9.9"} {
		got, closed := rawExchange(t, s, "GET /v1/models "+v+"\r\nHost: x\r\n\r\n")
		if !strings.HasPrefix(got, "HTTP/1.1 505 ") || !strings.Contains(got, `"code":"http_version_not_supported"`) || !closed {
			t.Errorf("%s: %q; want 505 and close", v, got)
		}
	}
	got, closed := rawExchange(t, s, "GET /health HTTP/1.2\r\nHost: x\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
	if strings.Count(got, `{"status":"ok"}`) != 2 || strings.Contains(got, "Connection: keep-alive") || !closed {
		t.Errorf("HTTP/1.2: %q; want both requests served on one connection", got)
	}
	got, _ = rawExchange(t, s, "GET /health HTTP/1.2\r\nHost: x\r\nConnection: close\r\n\r\nGET /health HTTP/1.1\r\nHost: x\r\n\r\n")
	if strings.Count(got, `{"status":"ok"}`) != 1 {
		t.Errorf("HTTP/1.2 with Connection: close: %q; want one answer and close", got)
	}
}
