package ingress

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// An engine's 200 that is no answer (a non-streamed JSON object cut short
// under a Content-Length that counted it whole; a stream whose first event's
// data is not JSON) fails the attempt before anything reaches the client,
// and the request is served by the next engine. Before, both went to the
// client as a 200 (fault tester: `{"id": "x", "choices": [ {"text": "trunc`
// relayed as a success; a garbage stream relayed whole; then one cut right
// after a '}', which a last-byte test took for whole).
func TestBrokenAnswerBeforeCommitTriesTheNextEngine(t *testing.T) {
	for _, tc := range []struct {
		name, body, answer string
		stream             bool
	}{
		{"cut-short JSON", `{"model":"m","prompt":[1,2],"max_tokens":3}`, `{"id": "x", "choices": [ {"text": "trunc`, false},
		// Cut at an object's end: the last byte is '}' (fault tester 2).
		{"cut-short JSON ending in }", `{"model":"m","prompt":[1,2],"max_tokens":3}`, `{"id": "x", "choices": [ {"index": 0, "text": "trunc"}`, false},
		{"non-JSON first event", `{"model":"m","prompt":[1,2],"max_tokens":3,"stream":true}`, "data: {not json at all\n\ndata: [DONE]\n\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				io.Copy(io.Discard, r.Body)
				if r.URL.Path == "/health" {
					return
				}
				if tc.stream {
					w.Header().Set("Content-Type", "text/event-stream")
				} else {
					w.Header().Set("Content-Type", "application/json")
				}
				io.WriteString(w, tc.answer)
			}))
			t.Cleanup(bad.Close)
			good := startFaultEngine(t, faultOK)
			cfg := testConfig(StaticEngine{ID: "bad", Model: "m", URL: bad.URL}, StaticEngine{ID: "good", Model: "m", URL: good.url()})
			cfg.Scheduler.Policy = "round-robin"
			cfg.MaxAttempts = 2
			s := startIngress(t, cfg, Deps{})
			for i := range 2 { // round-robin: one of them goes to the bad engine first
				st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tc.body)
				if st != 200 || hdr.Get("X-Kvmesh-Engine") != "good" || strings.Contains(string(b), "not json") || strings.Contains(string(b), "trunc") {
					t.Fatalf("request %d: %d via %q: %s", i, st, hdr.Get("X-Kvmesh-Engine"), b)
				}
			}
			if got := val(s.m.attempts.WithLabelValues("empty_response")); got != 1 {
				t.Fatalf("%v attempts counted empty_response, want 1", got)
			}
		})
	}
}

// A whole answer with white space before its object (a proxy's or a
// framework's leading newline) is JSON and is relayed, not taken for a
// broken answer and retried (regression tester 1 F5).
func TestAnswerWithLeadingWhiteSpaceRelayed(t *testing.T) {
	const answer = "\n \t{\"id\":\"x\",\"object\":\"text_completion\",\"choices\":[{\"index\":0,\"text\":\"ok\",\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":2,\"completion_tokens\":1,\"total_tokens\":3}}\n"
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, answer)
	}))
	t.Cleanup(eng.Close)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: eng.URL})
	cfg.MaxAttempts = 1
	s := startIngress(t, cfg, Deps{})
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"m","prompt":[1,2],"max_tokens":1}`)
	if st != 200 || !strings.Contains(string(b), `"text":"ok"`) {
		t.Fatalf("%d %s", st, b)
	}
	if got := val(s.m.attempts.WithLabelValues("empty_response")); got != 0 {
		t.Fatalf("%v attempts counted empty_response", got)
	}
}
