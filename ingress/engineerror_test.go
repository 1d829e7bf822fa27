package ingress

import (
	"encoding/json"
	"net"
	"net/http"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// rawErrorEngine is a FAKE engine (the simulator answers errors as vLLM
// does): it answers an inference request with the status, content type
// and body its prompt names, as a proxy or a framework in front of an
// engine may.
func rawErrorEngine(t *testing.T, answers map[string]rawAnswer) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Prompt string }
		if r.URL.Path == "/health" || json.NewDecoder(r.Body).Decode(&req) != nil {
			return
		}
		a := answers[req.Prompt]
		w.Header().Set("Content-Type", a.ctype)
		w.WriteHeader(a.status)
		_, _ = w.Write([]byte(a.body))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String()
}

type rawAnswer struct {
	status      int
	ctype, body string
}

// An engine's 4xx is relayed with its status; a body that is not an error
// body the SDKs read (FastAPI's {"detail": ...}, plain text, HTML) comes in
// the OpenAI error shape with the engine's message, while an OpenAI error
// and vLLM's older flat error pass byte for byte. Before, the client got
// the body as the engine wrote it, which the openai SDK reports without
// the engine's message.
func TestEngineNonOpenAIErrorsComeAsOpenAIErrors(t *testing.T) {
	const (
		openaiErr = `{"error":{"message":"max_tokens is too large","type":"BadRequestError","param":null,"code":400}}`
		vllmFlat  = `{"object":"error","message":"old vLLM says no","type":"BadRequestError","param":null,"code":400}`
	)
	url := rawErrorEngine(t, map[string]rawAnswer{
		"detail": {400, "application/json", `{"detail":"bad thing"}`},
		"list":   {422, "application/json", `{"detail":[{"loc":["body","prompt"],"msg":"field required","type":"missing"}]}`},
		"text":   {400, "text/plain", "plain bad\n"},
		"html":   {403, "text/html", "<html><body><h1>403 Forbidden</h1></body></html>"},
		"empty":  {400, "text/plain", ""},
		"openai": {400, "application/json", openaiErr},
		"flat":   {400, "application/json", vllmFlat},
		"strerr": {400, "application/json", `{"error":"a string, not an object"}`},
		"binary": {400, "application/octet-stream", "\xff\xfe\x00"},
	})
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: url}), Deps{})
	for _, tc := range []struct {
		prompt, says, typ string
		status            int
		verbatim          string
	}{
		{"detail", "bad thing", "invalid_request_error", 400, ""},
		{"list", "field required", "invalid_request_error", 422, ""},
		{"text", "plain bad", "invalid_request_error", 400, ""},
		{"html", "403 Forbidden", "permission_error", 403, ""},
		{"empty", "the engine answered 400", "invalid_request_error", 400, ""},
		{"strerr", "a string, not an object", "invalid_request_error", 400, ""},
		{"binary", "the engine answered 400", "invalid_request_error", 400, ""},
		{"openai", "", "", 400, openaiErr},
		{"flat", "", "", 400, vllmFlat},
	} {
		st, h, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":"`+tc.prompt+`","max_tokens":1}`)
		if st != tc.status {
			t.Errorf("%s: %d %s, want the engine's %d", tc.prompt, st, body, tc.status)
			continue
		}
		if tc.verbatim != "" {
			if string(body) != tc.verbatim {
				t.Errorf("%s: %s, want the engine's error body as it is: %s", tc.prompt, body, tc.verbatim)
			}
			continue
		}
		d, ok := openai.DecodeError(body)
		if !ok || !strings.Contains(d.Message, tc.says) || d.Type != tc.typ || !strings.HasPrefix(h.Get("Content-Type"), "application/json") {
			t.Errorf("%s: %s (Content-Type %q), want an OpenAI error body of type %s saying %q", tc.prompt, body, h.Get("Content-Type"), tc.typ, tc.says)
		}
	}
	// On the Messages API, Anthropic's shape.
	st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/messages",
		`{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"hi"}],"prompt":"detail"}`)
	var ant struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if st != 400 || json.Unmarshal(body, &ant) != nil || ant.Type != "error" || ant.Error.Type != "invalid_request_error" || ant.Error.Message != "bad thing" {
		t.Errorf("Messages API: %d %s, want 400 in Anthropic's error shape saying the engine's detail", st, body)
	}
}

// Whatever an engine's 4xx body holds, the client gets an error body the
// SDKs read: the engine's own when it is one, else a valid OpenAI (or
// Anthropic) error body with a valid UTF-8 message.
func FuzzEngineErrorBody(f *testing.F) {
	for _, s := range []string{`{"detail":"x"}`, `{"detail":[{"msg":"m"}]}`, `{"error":{"message":"m"}}`, `{"object":"error","message":"m"}`,
		`{"error":"s"}`, "plain", "", "\xff", `{"message":"m"}`, `{"detail":null}`, "<html>x</html>"} {
		f.Add([]byte(s), uint16(400), false)
		f.Add([]byte(s), uint16(422), true)
	}
	f.Fuzz(func(t *testing.T, b []byte, status uint16, messages bool) {
		st := 400 + int(status%100)
		out, rewritten := engineErrorBody(st, b, messages)
		if !rewritten {
			if !isErrorBody(b) || string(out) != string(b) {
				t.Fatalf("%q kept as it is, yet it is not an error body", b)
			}
			return
		}
		if !json.Valid(out) || !utf8.Valid(out) {
			t.Fatalf("%q rewritten to invalid JSON %q", b, out)
		}
		if !isErrorBody(out) {
			t.Fatalf("%q rewritten to %q, which is no error body", b, out)
		}
	})
}
