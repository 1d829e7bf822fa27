package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// FuzzResponses feeds arbitrary bodies to the Responses decoder and to POST
// /v1/responses: the decoder never panics and fails only with a 400; the
// endpoint answers a well-formed response, a well-formed event stream, or
// an OpenAI error body with a defined status.
func FuzzResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi","max_output_tokens":3}`,
		`{"model":"m","input":"hi","max_output_tokens":2,"stream":true,"instructions":"be brief"}`,
		`{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":"x"},{"type":"input_image","image_url":"u"}]}],"max_output_tokens":1}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"f","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],"max_output_tokens":1}`,
		`{"model":"m","input":"again","previous_response_id":"r1","max_output_tokens":1}`,
		`{"model":"m","input":"x","request_id":"r1","max_output_tokens":1,"tools":[{"type":"function","name":"f"}],"tool_choice":"none"}`,
		`{"model":"m","input":[{"type":"message","role":"assistant","content":null},{"type":"reasoning"}]}`,
		`{"model":"m","input":[],"max_output_tokens":0}`,
		`{"model":"m","input":{"role":"user"}}`,
		`{"model":"m","input":"x","max_output_tokens":100000,"temperature":-1,"top_p":2}`,
		`{"model":"m","input":[{"content":[1]}]} trailing`,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler(f, Config{ResponsesStore: true})
	f.Fuzz(func(t *testing.T, body []byte) {
		_, err := decodeResponsesRequest(body)
		checkDecodeErr(t, body, err)
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/responses", bytes.NewReader(body)))
		switch rec.Code {
		case http.StatusOK:
			checkResponsesAnswer(t, body, rec)
		case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
			if _, ok := openai.DecodeError(rec.Body.Bytes()); !ok {
				t.Fatalf("%q: status %d without an OpenAI error body: %q", body, rec.Code, rec.Body.String())
			}
		default:
			t.Fatalf("%q: status %d", body, rec.Code)
		}
	})
}

// checkResponsesAnswer checks a 200: a response object, or an event stream
// numbered from 0 that ends with response.completed.
func checkResponsesAnswer(t *testing.T, body []byte, rec *httptest.ResponseRecorder) {
	t.Helper()
	if rec.Header().Get("Content-Type") == "application/json" {
		var o responseObject
		if err := json.Unmarshal(rec.Body.Bytes(), &o); err != nil || o.Object != "response" || o.Usage == nil ||
			(o.Status != "completed" && o.Status != "incomplete") {
			t.Fatalf("%q: answer %s (%v)", body, rec.Body.Bytes(), err)
		}
		return
	}
	ev := &sseEvents{t: t, r: bufio.NewReader(rec.Body), seq: true}
	var last sseEv
	for {
		e, err := ev.read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%q: stream: %v", body, err)
		}
		last = e
	}
	if last.typ != "response.completed" {
		t.Fatalf("%q: stream ends with %q", body, last.typ)
	}
}
