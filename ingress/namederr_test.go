package ingress

import (
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// namedSSEEngine is a FAKE engine (the simulator raises no request errors
// inside its Responses and Messages streams) that answers every inference
// request with a 200 stream of the given events.
func namedSSEEngine(t *testing.T, events string) (url string, hits func() int) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	n := make(chan struct{}, 64)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/health" {
			return
		}
		select {
		case n <- struct{}{}:
		default:
		}
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = w.Write([]byte(events))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	return "http://" + ln.Addr().String(), func() int { return len(n) }
}

// strictIngress is an ingress in front of one namedSSEEngine answering
// events, which ejects the engine at its first failure.
func strictIngress(t *testing.T, events string) (*Server, func() int) {
	t.Helper()
	url, hits := namedSSEEngine(t, events)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: url})
	cfg.Health.ConsecutiveFailures = 1 // one failure would eject
	return startIngress(t, cfg, Deps{}), hits
}

// messagesStreamBody is a streamed Messages API request.
const messagesStreamBody = `{"model":"m","max_tokens":5,"stream":true,"messages":[{"role":"user","content":"hi"}]}`

// An error the engine raises inside a Responses or Messages stream is
// judged by that event, past the Responses preamble (response.created,
// in_progress), and by its type or string code where it carries no status:
// a request's own error (vLLM's 400, Anthropic's invalid_request_error, the
// Responses API's invalid_prompt) reaches the client as the engine sent it,
// once, and the engine stays in routing; an engine's failure (api_error,
// overloaded_error, a 500) is tried on the next engine; one raised after
// output started ends the relayed stream and counts against the engine,
// with nothing added after the engine's event. Before, the code
// was read from response.created (none: a 5xx), so the client got a 503
// quoting the wrong event and three such requests ejected every engine.
func TestNamedStreamErrorEventFirst(t *testing.T) {
	const (
		created  = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"
		progress = "event: response.in_progress\ndata: {\"type\":\"response.in_progress\",\"sequence_number\":1,\"response\":{\"id\":\"resp_1\",\"status\":\"in_progress\"}}\n\n"
		start    = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"msg_1\",\"type\":\"message\",\"role\":\"assistant\",\"content\":[]}}\n\n"
	)
	for _, tc := range []struct {
		name, path, body, events string
		retried                  bool
	}{
		{"responses vLLM 400", "/v1/responses", `{"model":"m","input":"hi","stream":true}`,
			created + progress + "data: {\"error\":{\"message\":\"bad request thing\",\"type\":\"BadRequestError\",\"param\":null,\"code\":400}}\n\n", false},
		{"responses error event", "/v1/responses", `{"model":"m","input":"hi","stream":true}`,
			created + progress + "event: error\ndata: {\"type\":\"error\",\"code\":\"invalid_prompt\",\"message\":\"no\",\"param\":null,\"sequence_number\":2}\n\n", false},
		{"responses 500", "/v1/responses", `{"model":"m","input":"hi","stream":true}`,
			created + progress + "data: {\"error\":{\"message\":\"engine broke\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\n", true},
		{"messages invalid_request_error", "/v1/messages", messagesStreamBody,
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"invalid_request_error\",\"message\":\"prompt is too long\"}}\n\n", false},
		{"messages overloaded", "/v1/messages", messagesStreamBody,
			"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"overloaded_error\",\"message\":\"busy\"}}\n\n", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, hits := strictIngress(t, tc.events)
			for i := range 2 {
				st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, tc.body)
				if tc.retried {
					if st != 503 {
						t.Fatalf("request %d: %d %s, want 503: the engine failed", i+1, st, body)
					}
					return
				}
				if st != 200 || !strings.Contains(string(body), "event: error") && !strings.Contains(string(body), `"error":{`) {
					t.Fatalf("request %d: %d %s, want the engine's stream with its error, as the engine sent it", i+1, st, body)
				}
			}
			if n := hits(); n != 2 || seriesSum(s.health.ejections) != 0 {
				t.Fatalf("%d attempts for 2 requests, %v ejections; want 2 and none: the request's own error", n, seriesSum(s.health.ejections))
			}
		})
	}
	t.Run("messages api_error after output started", func(t *testing.T) {
		s, _ := strictIngress(t, start+"event: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"broke\"}}\n\n")
		st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/messages", messagesStreamBody)
		if st != 200 || strings.Count(string(body), "event: error") != 1 || !strings.Contains(string(body), `"api_error","message":"broke"`) {
			t.Fatalf("%d %s, want the stream as the engine sent it, its one error event", st, body)
		}
		testutil.WaitFor(t, 10*time.Second, "the engine counted failed (ejected at the first failure)", func() bool { return seriesSum(s.health.ejections) == 1 })
	})
}

// An engine (or a proxy in front of one) writing JSON as Python's
// json.dumps does, with a space after each colon: a Messages stream's
// message_stop and a Responses stream's response.completed still end their
// streams cleanly (before, each such stream got an error event after its
// last event and counted against the engine, ejected after three).
func TestSpacedJSONStreams(t *testing.T) {
	const (
		msgs = "event: message_start\ndata: {\"type\": \"message_start\", \"message\": {\"id\": \"msg_1\", \"type\": \"message\", \"role\": \"assistant\", \"content\": []}}\n\n" +
			"event: content_block_delta\ndata: {\"type\": \"content_block_delta\", \"index\": 0, \"delta\": {\"type\": \"text_delta\", \"text\": \"hi\"}}\n\n" +
			"event: message_stop\ndata: {\"type\": \"message_stop\"}\n\n"
		resp = "event: response.created\ndata: {\"type\": \"response.created\", \"sequence_number\": 0, \"response\": {\"id\": \"resp_1\"}}\n\n" +
			"event: response.output_text.delta\ndata: {\"type\": \"response.output_text.delta\", \"sequence_number\": 1, \"delta\": \"hi\"}\n\n" +
			"event: response.completed\ndata: {\"type\": \"response.completed\", \"sequence_number\": 2, \"response\": {\"id\": \"resp_1\", \"status\": \"completed\"}}\n\n"
	)
	for _, tc := range []struct{ name, path, body, events string }{
		{"messages", "/v1/messages", messagesStreamBody, msgs},
		{"responses", "/v1/responses", `{"model":"m","input":"hi","stream":true}`, resp},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, _ := strictIngress(t, tc.events)
			for i := range 3 {
				st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+tc.path, tc.body)
				if st != 200 || strings.Contains(string(body), "event: error") || strings.Contains(string(body), "failed mid-stream") {
					t.Fatalf("request %d: %d %s, want the engine's stream, ended cleanly", i+1, st, body)
				}
			}
			if n := seriesSum(s.health.ejections); n != 0 {
				t.Fatalf("%v ejections of an engine whose streams all ended cleanly", n)
			}
		})
	}
}

// The usage chunk the ingress asked for itself (stream_options) is kept
// from a chat client that did not ask for it also when the engine writes
// "choices": [] with a space (Python's json.dumps); it reached the client,
// whose chunk.choices[0] then fails.
func TestDropUsageEventsSpaced(t *testing.T) {
	const (
		text  = "data: {\"id\": \"c1\", \"choices\": [{\"index\": 0, \"delta\": {\"content\": \"hi\"}}]}\n\n"
		usage = "data: {\"id\": \"c1\", \"choices\": [], \"usage\": {\"prompt_tokens\": 3, \"completion_tokens\": 1}}\n\n"
		done  = "data: [DONE]\n\n"
	)
	for _, u := range []string{usage, strings.ReplaceAll(usage, ": ", ":")} {
		if got := string(dropUsageEvents(nil, []byte(text+u+done))); got != text+done {
			t.Errorf("usage chunk %q: relayed %q, want it dropped", u, got)
		}
	}
}
