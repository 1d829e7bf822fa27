package ingress

import (
	"bytes"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestCompressedBody: a request body sent with Content-Encoding gzip,
// deflate, br or zstd is decoded at the edge and served like a plain one
// (the simulator, like vLLM, would refuse the compressed bytes as JSON); a
// body that decodes past MaxBodyBytes gets 413 however small it was on the
// wire, an unknown coding 415, a corrupt one 400, each with an OpenAI error
// body, and the ingress keeps serving.
func TestCompressedBody(t *testing.T) {
	cfg := testConfig(simEngines(startSims(t, 1, "m"), "m")...)
	cfg.MaxBodyBytes = 64 << 10
	s := startIngress(t, cfg, Deps{})
	url := "http://" + s.Addr() + "/v1/completions"
	body := []byte(`{"model":"m","prompt":"compressed on the wire","max_tokens":2}`)
	send := func(enc string, b []byte) (int, []byte) {
		t.Helper()
		req, err := http.NewRequest("POST", url, bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", "application/json")
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		resp, err := http.DefaultTransport.RoundTrip(req) // no transparent decoding of anything
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var out bytes.Buffer
		if _, err := out.ReadFrom(resp.Body); err != nil {
			t.Fatal(err)
		}
		return resp.StatusCode, out.Bytes()
	}
	for _, c := range []struct {
		enc string
		b   []byte
	}{
		{"gzip", fasthttp.AppendGzipBytes(nil, body)},
		{"GZIP", fasthttp.AppendGzipBytes(nil, body)},
		{"x-gzip", fasthttp.AppendGzipBytes(nil, body)}, // RFC 9110 §8.4.1.3; it was a 415
		{"deflate", fasthttp.AppendDeflateBytes(nil, body)},
		{"br", fasthttp.AppendBrotliBytes(nil, body)},
		{"zstd", fasthttp.AppendZstdBytes(nil, body)},
		{"identity", body},
	} {
		st, b := send(c.enc, c.b)
		var r struct {
			Choices []struct{ Text string } `json:"choices"`
		}
		if st != 200 || json.Unmarshal(b, &r) != nil || len(r.Choices) != 1 {
			t.Errorf("%s: %d %s", c.enc, st, b)
		}
	}
	if st, b := send("", fasthttp.AppendGzipBytes(nil, body)); st != 400 {
		t.Errorf("gzip bytes without Content-Encoding: %d %s, want 400", st, b)
	}

	// A bomb: 1 MiB of spaces inside a JSON object compresses to ~1 KiB.
	bomb := append(append([]byte(`{"model":"m","prompt":"x","max_tokens":1,"pad":"`), bytes.Repeat([]byte(" "), 1<<20)...), `"}`...)
	for _, c := range []struct {
		name, enc string
		b         []byte
		status    int
		code      string
	}{
		{"gzip bomb", "gzip", fasthttp.AppendGzipBytes(nil, bomb), 413, "request_too_large"},
		{"zstd bomb", "zstd", fasthttp.AppendZstdBytes(nil, bomb), 413, "request_too_large"},
		{"unknown coding", "compress", body, 415, "unsupported_content_encoding"},
		{"two codings", "gzip, br", body, 415, "unsupported_content_encoding"},
		{"corrupt gzip", "gzip", body, 400, ""},
	} {
		if len(c.b) >= int(cfg.MaxBodyBytes) {
			t.Fatalf("%s: %d bytes on the wire, not a bomb", c.name, len(c.b))
		}
		st, b := send(c.enc, c.b)
		var e openAIError
		if st != c.status || json.Unmarshal(b, &e) != nil || e.Error.Type != "invalid_request_error" || e.Error.Message == "" {
			t.Errorf("%s: %d %s, want %d with an OpenAI error body", c.name, st, b, c.status)
			continue
		}
		if code, _ := e.Error.Code.(string); code != c.code {
			t.Errorf("%s: code %v, want %q", c.name, e.Error.Code, c.code)
		}
		if c.status == 415 && !strings.Contains(e.Error.Message, "gzip, deflate, br, zstd") {
			t.Errorf("%s: message %q does not say what is supported", c.name, e.Error.Message)
		}
	}
	if st, b := send("gzip", fasthttp.AppendGzipBytes(nil, body)); st != 200 {
		t.Fatalf("after the bad ones: %d %s", st, b)
	}
}
