package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// FuzzHandlers posts arbitrary bodies to every POST route: the simulator
// answers with a defined status and, on errors, an OpenAI error body; it
// never panics or hangs.
func FuzzHandlers(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","max_tokens":3}`,
		`{"model":"m","prompt":[[1,2],[3]],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","prompt":"","max_tokens":1}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}],"min_tokens":5,"max_tokens":2}`,
		`{"prompt":"x","messages":[]}`,
		`{"model":"m","prompt":[4294967295],"max_tokens":100000}`,
		`{"model":"m","prompt":"hi","max_tokens":3,"logprobs":2}`,
		`{"model":"m","prompt":["a","b"],"max_tokens":3,"logprobs":0,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":2,"logprobs":true,"top_logprobs":20,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false,"top_logprobs":1}`,
		`{"model":"m","prompt":"hi","max_tokens":9,"stop":[" l","o","\u00e9"],"min_tokens":2,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"stop":"e","include_stop_str_in_output":true,"n":2}`,
		`{"model":"m","prompt":[5,6,7],"max_tokens":12,"stop_token_ids":[100,101,102,103,104,105,106,107,108,109,110,111,112,113,114,115],"min_tokens":1,"stream":true}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":9,"stop_token_ids":[-1,4294967296],"stop":"a","include_stop_str_in_output":true}`,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler(f, Config{})
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
			switch rec.Code {
			case http.StatusOK:
				checkJSONBody(t, path, body, rec.Body.Bytes())
			case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
				if _, ok := openai.DecodeError(rec.Body.Bytes()); !ok {
					t.Fatalf("%s %q: status %d without an OpenAI error body: %q", path, body, rec.Code, rec.Body.String())
				}
			default:
				t.Fatalf("%s %q: status %d", path, body, rec.Code)
			}
		}
	})
}

// checkJSONBody fails unless a 200 answer is JSON, or an event stream whose
// every data payload but [DONE] is.
func checkJSONBody(t *testing.T, path string, req, body []byte) {
	t.Helper()
	if !bytes.HasPrefix(body, []byte("data: ")) {
		if !json.Valid(body) {
			t.Fatalf("%s %q: answer is not JSON: %q", path, req, body)
		}
		return
	}
	for _, ev := range bytes.Split(bytes.TrimSpace(body), []byte("\n\n")) {
		data, ok := bytes.CutPrefix(ev, []byte("data: "))
		if !ok || !bytes.Equal(data, []byte("[DONE]")) && !json.Valid(data) {
			t.Fatalf("%s %q: bad event %q", path, req, ev)
		}
	}
}

// fuzzHandler starts a simulator for a fuzz target (model "m", the tiny
// profile, 4-token blocks, 64 of them, time scale 10^6; cfg's other fields
// as given) and returns its HTTP handler.
func fuzzHandler(f *testing.F, cfg Config) http.Handler {
	p, _ := engine.LookupProfile("tiny")
	cfg.Model, cfg.TimeScale, cfg.Logger = "m", 1e6, quietLogger()
	cfg.Engine = engine.Config{BlockSize: 4, GPUBlocks: 64, Profile: p}
	s, err := Start(f.Context(), cfg)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	return s.httpSrv.Handler
}

// checkDecodeErr fails unless err, a request decoder's, is nil or a 400.
func checkDecodeErr(t *testing.T, body []byte, err error) {
	t.Helper()
	var he *httpError
	if err != nil && (!errors.As(err, &he) || he.status != http.StatusBadRequest) {
		t.Fatalf("%q: decode error %v is not a 400", body, err)
	}
}
