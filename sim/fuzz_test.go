package sim

import (
	"bytes"
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
	} {
		f.Add([]byte(s))
	}
	p, _ := engine.LookupProfile("tiny")
	s, err := Start(f.Context(), Config{Model: "m", TimeScale: 1e6, Engine: engine.Config{BlockSize: 4, GPUBlocks: 64, Profile: p},
		Logger: quietLogger()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = s.Close() })
	h := s.httpSrv.Handler
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, path := range []string{"/v1/completions", "/v1/chat/completions", "/tokenize"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
			switch rec.Code {
			case http.StatusOK:
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
