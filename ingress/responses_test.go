package ingress

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"testing"

	"github.com/valyala/fasthttp"
)

// TestResponsesRequest checks the chat messages and tools a Responses
// request is routed as (what vLLM renders for it), and its errors.
func TestResponsesRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body     string
		messages       string // JSON, compared as values
		tools          string
		maxTokens      int
		prev           string
		hasRequestID   bool
		wantErr, param string
	}{
		{name: "string input", body: `{"model":"m","input":"hi","max_output_tokens":7}`,
			messages: `[{"role":"user","content":"hi"}]`, maxTokens: 7},
		{name: "instructions first", body: `{"model":"m","instructions":"be brief","input":"hi","previous_response_id":"resp_x","request_id":"r1"}`,
			messages: `[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]`, maxTokens: -1, prev: "resp_x", hasRequestID: true},
		{name: "items", body: `{"model":"m","input":[
			{"role":"developer","content":"d"},
			{"type":"message","role":"user","content":[{"type":"input_text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"input_text","text":"b"}]},
			{"type":"reasoning","summary":[]},
			{"type":"message","role":"assistant","content":[{"type":"output_text","text":"c","annotations":[]}]},
			{"type":"function_call","call_id":"call_1","name":"get","arguments":"{\"q\":1}"},
			{"type":"function_call_output","call_id":"call_1","output":"42"}],
			"tools":[{"type":"function","name":"get","description":"gets","parameters":{"type":"object"}},{"type":"web_search"}],"tool_choice":"auto"}`,
			messages: `[{"role":"developer","content":"d"},
				{"role":"user","content":[{"type":"text","text":"a"},{"type":"input_image","image_url":"x"},{"type":"text","text":"b"}]},
				{"role":"assistant","content":[{"type":"text","text":"c"}]},
				{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get","arguments":"{\"q\":1}"}}]},
				{"role":"tool","content":"42","tool_call_id":"call_1"}]`,
			tools:     `[{"type":"function","function":{"name":"get","description":"gets","parameters":{"type":"object"}}}]`,
			maxTokens: -1},
		{name: "only reasoning first", body: `{"model":"m","input":[{"type":"reasoning"},{"role":"user","content":"x"}]}`,
			messages: `[{"role":"user","content":"x"}]`, maxTokens: -1},
		{name: "chat max_tokens ignored", body: `{"model":"m","input":"x","max_tokens":3}`, messages: `[{"role":"user","content":"x"}]`, maxTokens: -1},
		{name: "no input", body: `{"model":"m"}`, wantErr: "input is required", param: "input"},
		{name: "input number", body: `{"model":"m","input":5}`, wantErr: "input must be", param: "input"},
		{name: "empty items", body: `{"model":"m","input":[]}`, wantErr: "no messages", param: "input"},
		{name: "empty items continuing a response", body: `{"model":"m","input":[],"previous_response_id":"resp_x"}`, messages: `[]`, maxTokens: -1, prev: "resp_x"},
		{name: "only reasoning", body: `{"model":"m","input":[{"type":"reasoning"}]}`, wantErr: "no messages", param: "input"},
		{name: "item not object", body: `{"model":"m","input":["x"]}`, wantErr: "input[0] must be an object", param: "input[0]"},
		{name: "unknown item", body: `{"model":"m","input":[{"type":"computer_call"}]}`, wantErr: "not supported", param: "input[0].type"},
		// The AI SDK's stored-conversation reference: refused saying how to send the item.
		{name: "item reference", body: `{"model":"m","input":[{"role":"user","content":"a"},{"type":"item_reference","id":"msg_1"}]}`,
			wantErr: "providerOptions.openai.store = false", param: "input[1].type"},
		{name: "no role", body: `{"model":"m","input":[{"content":"x"}]}`, wantErr: "role is required", param: "input[0].role"},
		{name: "bad call", body: `{"model":"m","input":[{"type":"function_call","call_id":"c","name":"n"}]}`, wantErr: "needs string call_id, name and arguments", param: "input[0]"},
		{name: "bad output", body: `{"model":"m","input":[{"type":"function_call_output","call_id":"c","output":1}]}`, wantErr: "needs string call_id and output", param: "input[0]"},
		{name: "bad part", body: `{"model":"m","input":[{"role":"user","content":[{"type":"input_text","text":1}]}]}`, wantErr: "text part needs a string", param: "input[0].content"},
		{name: "bad content", body: `{"model":"m","input":[{"role":"user","content":1}]}`, wantErr: "must be a string or an array", param: "input[0].content"},
		{name: "bad instructions", body: `{"model":"m","input":"x","instructions":1}`, wantErr: "instructions must be a string", param: "instructions"},
		{name: "bad previous", body: `{"model":"m","input":"x","previous_response_id":1}`, wantErr: "previous_response_id must be a string", param: "previous_response_id"},
		{name: "bad max_output_tokens", body: `{"model":"m","input":"x","max_output_tokens":-1}`, wantErr: "non-negative integer", param: "max_output_tokens"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r, ok := parseAsChat(t, epResponses, tc.body, tc.messages, tc.tools, tc.wantErr, tc.param)
			if !ok {
				return
			}
			if r.maxTokens != tc.maxTokens || string(r.prevResponse) != tc.prev || r.hasRequestID != tc.hasRequestID {
				t.Fatalf("maxTokens %d prev %q hasRequestID %v, want %d %q %v", r.maxTokens, r.prevResponse, r.hasRequestID, tc.maxTokens, tc.prev, tc.hasRequestID)
			}
		})
	}
}

// checkOutTokens checks ns's output-token count over a stream: one per
// delta event before the usage (head + delta twice: 2), then the usage's
// count once end carries it.
func checkOutTokens(t *testing.T, ns *namedStream, head, delta, end string, usage int) {
	t.Helper()
	p := &proxyStream{c: &call{}, named: ns}
	p.observe([]byte(head + delta + delta))
	if p.c.outTokens != 2 {
		t.Fatalf("%d tokens from two deltas", p.c.outTokens)
	}
	p.observe([]byte(end))
	if p.c.outTokens != usage {
		t.Fatalf("%d tokens after usage %d", p.c.outTokens, usage)
	}
}

// errorEventData checks tail is one "event: error" event and decodes its
// data into v.
func errorEventData(t *testing.T, tail []byte, v any) {
	t.Helper()
	const head = "event: error\ndata: "
	if !strings.HasPrefix(string(tail), head) || !strings.HasSuffix(string(tail), "\n\n") || strings.Count(string(tail), "\n\n") != 1 {
		t.Fatalf("error event %q", tail)
	}
	if err := json.Unmarshal(tail[len(head):], v); err != nil {
		t.Fatalf("error event %q: %v", tail, err)
	}
}

// parseAsChat parses body for endpoint ep and checks the chat messages and
// tools it is routed as (JSON, compared as values; no tools check when
// tools is ""), or, when wantErr is set, its 400 naming param; ok says
// whether the request parsed.
func parseAsChat(t *testing.T, ep endpoint, body, messages, tools, wantErr, param string) (r *request, ok bool) {
	t.Helper()
	r = new(request)
	err := parseRequest(r, ep, []byte(body))
	if wantErr != "" {
		ae := toAPIError(err)
		if err == nil || !strings.Contains(err.Error(), wantErr) || ae.status != 400 || ae.param != param {
			t.Fatalf("err %v (status %d, param %q), want 400 %q at %q", err, ae.status, ae.param, wantErr, param)
		}
		return r, false
	}
	if err != nil {
		t.Fatal(err)
	}
	jsonEq(t, "messages", string(r.messages), messages)
	if tools != "" {
		jsonEq(t, "tools", string(r.tools), tools)
	}
	return r, true
}

// fuzzParsesAsChat parses a fuzzed body for ep: a 400 or valid chat
// messages and tools (ok), never another status or invalid JSON.
func fuzzParsesAsChat(t *testing.T, ep endpoint, body []byte) (r request, ok bool) {
	t.Helper()
	if err := parseRequest(&r, ep, body); err != nil {
		if ae := toAPIError(err); ae.status != 400 {
			t.Fatalf("status %d for %v", ae.status, err)
		}
		return r, false
	}
	if !json.Valid(body) || !json.Valid(r.messages) || (len(r.tools) > 0 && !json.Valid(r.tools)) {
		t.Fatalf("from %q: messages %q tools %q", body, r.messages, r.tools)
	}
	return r, true
}

func jsonEq(t *testing.T, what, got, want string) {
	t.Helper()
	var g, w any
	if err := json.Unmarshal([]byte(got), &g); err != nil {
		t.Fatalf("%s: %q is not JSON: %v", what, got, err)
	}
	if err := json.Unmarshal([]byte(want), &w); err != nil {
		t.Fatal(err)
	}
	gb, _ := json.Marshal(g)
	wb, _ := json.Marshal(w)
	if string(gb) != string(wb) {
		t.Fatalf("%s:\n got %s\nwant %s", what, gb, wb)
	}
}

// TestResponseIDTag checks that the engine named in a response id this
// ingress made is found again, and that other ids name none.
func TestResponseIDTag(t *testing.T) {
	c := &call{ep: epResponses}
	c.req.body = []byte(`{"model":"m","input":"x"}`)
	c.responsesBody()
	var body map[string]any
	if err := json.Unmarshal(c.body, &body); err != nil {
		t.Fatalf("body %q: %v", c.body, err)
	}
	if c.path != "/v1/responses" || body["input"] != "x" {
		t.Fatalf("path %q body %s", c.path, c.body)
	}
	ureq := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(ureq)
	ureq.SetBodyRaw(c.body)
	c.stampEngine(ureq, "engine-b")
	if err := json.Unmarshal(ureq.Body(), &body); err != nil {
		t.Fatal(err)
	}
	id, _ := body["request_id"].(string)
	tag := respIDTag([]byte(id))
	if tag == nil || !hasTag("engine-b", tag) || hasTag("engine-a", tag) {
		t.Fatalf("id %q: tag %q does not name engine-b alone", id, tag)
	}
	c.stampEngine(ureq, "engine-a") // a retry elsewhere renames the response
	_ = json.Unmarshal(ureq.Body(), &body)
	if id2, _ := body["request_id"].(string); !hasTag("engine-a", respIDTag([]byte(id2))) || id2[len(respIDPrefix)+respTagLen:] != id[len(respIDPrefix)+respTagLen:] {
		t.Fatalf("restamped %q from %q", id2, id)
	}
	for _, other := range []string{"", "resp_0123", "resp_kvm", "resp_kvm0123456789abcde", "chatcmpl-x"} {
		if respIDTag([]byte(other)) != nil {
			t.Errorf("%q: a tag from an id this ingress did not make", other)
		}
	}
	// A client's own request_id is kept.
	c = &call{ep: epResponses}
	if err := parseRequest(&c.req, epResponses, []byte(`{"model":"m","input":"x","request_id":"mine"}`)); err != nil {
		t.Fatal(err)
	}
	c.responsesBody()
	if len(c.body) != 0 {
		t.Fatalf("body rewritten despite the client's request_id: %s", c.body)
	}
}

// TestResponsesStreamEvents checks the stream helpers on vLLM's event form.
func TestResponsesStreamEvents(t *testing.T) {
	ev := func(typ, data string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + data + "}\n\n"
	}
	pre := ev("response.created", `,"response":{"status":"in_progress","max_output_tokens":9,"usage":null}`) + ev("response.in_progress", "")
	delta := ev("response.output_text.delta", `,"delta":"a.delta\"x"`)
	done := ev("response.completed", `,"response":{"usage":{"input_tokens":5,"output_tokens":12,"output_tokens_details":{"reasoning_tokens":0}}}`)
	if !responsesStream.preambleOnly([]byte(pre)) || responsesStream.preambleOnly([]byte(pre+delta)) {
		t.Fatal("preamble")
	}
	if responsesStream.firstEventFailed([]byte(pre+delta)) || !responsesStream.firstEventFailed([]byte(pre+"event: error\ndata: {\"type\":\"error\"}\n\n")) {
		t.Fatal("first event failed")
	}
	if responsesStream.ended([]byte(pre+delta)) || !responsesStream.ended([]byte(delta+done)) {
		t.Fatal("ended")
	}
	checkOutTokens(t, responsesStream, pre, delta, done, 12)
	tail := appendRespErrorEvent(nil, `engine "x" failed`, 0)
	var e map[string]any
	if errorEventData(t, tail, &e); e["type"] != "error" || e["message"] != `engine "x" failed` {
		t.Fatalf("error event %q", tail)
	}
}

func FuzzParseResponses(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","input":"hi"}`, `{"model":"m","instructions":"s","input":[{"role":"user","content":[{"type":"input_text","text":"a"}]}]}`,
		`{"model":"m","input":[{"type":"function_call","call_id":"c","name":"n","arguments":"{}"},{"type":"function_call_output","call_id":"c","output":"o"}],"tools":[{"type":"function","name":"n","parameters":{}}]}`,
		`{"model":"m","input":[{"type":"reasoning"}]}`, `{"model":"m","input":[{"role":"user","content":null}],"previous_response_id":"resp_kvm0123456789abcdef"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		r, ok := fuzzParsesAsChat(t, epResponses, body)
		if !ok {
			return
		}
		c := &call{ep: epResponses, req: r}
		c.responsesBody()
		if len(c.body) > 0 && !json.Valid(c.body) {
			t.Fatalf("upstream body %q from %q", c.body, body)
		}
	})
}

// A Responses stream the engine breaks ends with an error event numbered
// after the last event relayed; one the engine ended with its own error
// event (and then closed) gets no second one, on the Messages API too.
func TestNamedStreamBrokenErrorEvent(t *testing.T) {
	s, err := New(DefaultConfig(), Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		t.Fatal(err)
	}
	relay := func(named *namedStream, in string) string {
		c := &call{s: s}
		p := &proxyStream{c: c, up: &upstream{id: "e"}, body: strings.NewReader(in), buf: make([]byte, 256), named: named}
		out, err := io.ReadAll(p)
		if err != nil {
			t.Fatal(err)
		}
		return string(out)
	}
	ev := func(typ string, seq int) string {
		return fmt.Sprintf("event: %s\ndata: {\"type\":\"%s\",\"delta\":\"\\\"sequence_number\\\":99\",\"sequence_number\":%d}\n\n", typ, typ, seq)
	}
	body := ev("response.created", 0) + ev("response.in_progress", 1) + ev("response.output_text.delta", 2) + ev("response.output_text.delta", 3)
	out := relay(responsesStream, body)
	if !strings.HasPrefix(out, body) || strings.Count(out, "event: error\n") != 1 {
		t.Fatalf("broken stream relayed as %q", out)
	}
	var e struct {
		Type string
		Seq  int `json:"sequence_number"`
	}
	if errorEventData(t, []byte(out[len(body):]), &e); e.Type != "error" || e.Seq != 4 {
		t.Fatalf("error event %q: want type error, sequence_number 4", out[len(body):])
	}
	own := body + "event: error\ndata: {\"type\":\"error\",\"code\":\"x\",\"message\":\"sim: closed\",\"param\":null,\"sequence_number\":4}\n\n"
	if out := relay(responsesStream, own); out != own {
		t.Fatalf("a stream the engine ended with its error event relayed as %q", out)
	}
	msgs := "event: message_start\ndata: {\"type\":\"message_start\"}\n\nevent: error\ndata: {\"type\":\"error\",\"error\":{\"type\":\"api_error\",\"message\":\"sim: closed\"}}\n\n"
	if out := relay(messagesStream, msgs); out != msgs {
		t.Fatalf("a Messages stream the engine ended with its error event relayed as %q", out)
	}
	if out := relay(messagesStream, msgs[:strings.Index(msgs, "event: error")]); strings.Count(out, "event: error\n") != 1 {
		t.Fatalf("a broken Messages stream relayed as %q", out)
	}
}

// A 405 names the methods its path takes (RFC 9110's Allow header).
func TestMethodNotAllowedNamesAllow(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	s := startIngress(t, testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()}), Deps{})
	for _, c := range []struct{ method, path, allow string }{
		{"GET", "/v1/completions", "POST"}, {"PUT", "/v1/chat/completions", "POST"},
		{"POST", "/v1/responses/resp_x", "GET, HEAD"}, {"GET", "/v1/responses/resp_x/cancel", "POST"},
	} {
		req, _ := http.NewRequest(c.method, "http://"+s.Addr()+c.path, nil)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 405 || resp.Header.Get("Allow") != c.allow || !strings.Contains(string(b), `"code":"method_not_allowed"`) {
			t.Errorf("%s %s: %d, Allow %q, %s; want 405, Allow %s", c.method, c.path, resp.StatusCode, resp.Header.Get("Allow"), b, c.allow)
		}
	}
}
