package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"testing"
)

// FuzzMessagesRequest feeds arbitrary bodies to the Messages decoder and
// converter and to POST /v1/messages and /v1/messages/count_tokens: the
// decoder never panics and fails only with a 400; what it accepts becomes
// chat messages with valid roles, contents and tool-call arguments; the
// Python json.dumps of any JSON value reads back as that value; the
// endpoints answer a message, a well-formed event stream, a token count, or
// an Anthropic error body with a defined status.
func FuzzMessagesRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":3,"messages":[{"role":"user","content":"hi"}]}`,
		`{"max_tokens":2,"stream":true,"system":"be brief","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","max_tokens":1,"system":[{"type":"text","text":"x-anthropic-billing-header: a"},{"type":"text","text":"S"}],` +
			`"messages":[{"role":"system","content":"inline"},{"role":"ctx","content":[{"type":"image","source":{"type":"base64","media_type":null,"data":"AA"}},` +
			`{"type":"image","source":{"type":"url","url":"http://x/y.png"}}]}]}`,
		`{"max_tokens":1,"messages":[{"role":"user","content":"q"},{"role":"assistant","content":[{"type":"thinking","thinking":"t"},` +
			`{"type":"redacted_thinking","data":"d"},{"type":"tool_use","id":"a","name":"f","input":{"k":[1,2.5,1e400,"é\u0000",{"k":null,"k":true}]}}]},` +
			`{"role":"user","content":[{"type":"tool_result","tool_use_id":"a","content":[{"type":"text","text":"r"},` +
			`{"type":"image","source":{}},{"type":"tool_reference","tool_name":"f"}]},{"type":"text","text":"next"}]}]}`,
		`{"max_tokens":1,"messages":[{"role":"assistant","content":[{"type":"tool_result","content":[{"a":"it's \"q\""}]}]}],` +
			`"tools":[{"name":"f","input_schema":{"properties":{}}}],"tool_choice":{"type":"tool","name":"f"},"chat_template_kwargs":{"x":1}}`,
		`{"max_tokens":1,"messages":[{"role":"user","content":[{"type":"tool_use"}]}]}`,
		`{"max_tokens":0,"messages":[]}`,
		`{"max_tokens":"5","messages":[{"role":"robot","content":5}],"tools":[{"input_schema":[]}],"tool_choice":{"type":"tool"}}`,
		`{"model":"other","max_tokens":1,"messages":[{"role":"user","content":"x"}],"temperature":-1,"top_p":0,"top_k":-2,"cache_salt":""}`,
		`{"max_tokens":100000,"messages":[{"role":"user","content":"x"}],"output_config":{"effort":"low","format":{"type":"json_schema"}}}`,
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1} trailing`,
		`[1, 2.0, -0, "s", {"a": {"b": [true, false, null]}}]`,
	} {
		f.Add([]byte(s))
	}
	h := fuzzHandler(f, Config{})
	f.Fuzz(func(t *testing.T, body []byte) {
		checkMessagesDecode(t, body)
		checkPyDumps(t, body)
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, path, bytes.NewReader(body)))
			checkMessagesAnswer(t, path, body, rec)
		}
	})
}

// checkMessagesDecode checks the decoder on body: a 400, or chat messages
// the renderer takes.
func checkMessagesDecode(t *testing.T, body []byte) {
	t.Helper()
	r, err := decodeMessagesRequest(body)
	if checkDecodeErr(t, body, err); err != nil {
		return
	}
	if len(r.chat) == 0 {
		t.Fatalf("%q: accepted without a chat message", body)
	}
	for i, m := range r.chat {
		switch m.Role {
		case "system", "user", "assistant", "tool":
		default:
			t.Fatalf("%q: chat message %d has role %q", body, i, m.Role)
		}
		if m.Content != nil && (!json.Valid(m.Content) || m.Content[0] != '"' && m.Content[0] != '[') {
			t.Fatalf("%q: chat message %d content %s", body, i, m.Content)
		}
		for _, tc := range m.ToolCalls {
			if a := tc.Function.Arguments; !json.Valid([]byte(a)) && !bytes.Contains([]byte(a), []byte("Infinity")) || a[0] != '{' {
				t.Fatalf("%q: tool call arguments %q", body, a)
			}
		}
	}
	if _, err := json.Marshal(r.chat); err != nil {
		t.Fatalf("%q: chat messages do not marshal: %v", body, err)
	}
}

// checkPyDumps checks that Python's json.dumps of a JSON value Go can read
// (no number out of float range) reads back as the same value; repr must
// not fail either.
func checkPyDumps(t *testing.T, body []byte) {
	t.Helper()
	var want any
	if json.Unmarshal(body, &want) != nil {
		return
	}
	v, err := parsePy(body)
	if err != nil {
		t.Fatalf("%q: Go reads it but parsePy fails: %v", body, err)
	}
	_ = v.repr()
	var got any
	if d := v.dumps(); json.Unmarshal([]byte(d), &got) != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("%q: json.dumps gave %s", body, d)
	}
}

// checkMessagesAnswer checks an endpoint's answer: an Anthropic error with
// a defined status, or a message, an event stream or a token count.
func checkMessagesAnswer(t *testing.T, path string, body []byte, rec *httptest.ResponseRecorder) {
	t.Helper()
	switch rec.Code {
	case http.StatusOK:
	case http.StatusBadRequest, http.StatusNotFound, http.StatusRequestEntityTooLarge, http.StatusServiceUnavailable:
		if _, ok := anthropicErr(rec.Body.Bytes()); !ok {
			t.Fatalf("%s %q: status %d without an Anthropic error body: %q", path, body, rec.Code, rec.Body.String())
		}
		return
	default:
		t.Fatalf("%s %q: status %d", path, body, rec.Code)
	}
	switch {
	case path == "/v1/messages/count_tokens":
		var a countTokensAnswer
		if err := json.Unmarshal(rec.Body.Bytes(), &a); err != nil || a.InputTokens < 1 || a.ContextManagement.OriginalInputTokens != a.InputTokens {
			t.Fatalf("%q: count %s (%v)", body, rec.Body.Bytes(), err)
		}
	case rec.Header().Get("Content-Type") == "application/json":
		var m messageObject
		if err := json.Unmarshal(rec.Body.Bytes(), &m); err != nil || m.Type != "message" || m.Role != "assistant" ||
			m.StopReason == nil || m.Usage.OutputTokens < 1 || m.Usage.CacheReadInputTokens == nil {
			t.Fatalf("%q: answer %s (%v)", body, rec.Body.Bytes(), err)
		}
	default:
		checkMessagesStream(t, body, rec.Body)
	}
}

// checkMessagesStream checks an event stream's order: message_start, an
// optional text block (start, deltas, stop), message_delta, message_stop.
func checkMessagesStream(t *testing.T, body []byte, r io.Reader) {
	t.Helper()
	ev := &sseEvents{t: t, r: bufio.NewReader(r)}
	var types []string
	for {
		e, err := ev.read()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%q: stream: %v", body, err)
		}
		types = append(types, e.typ)
	}
	n := len(types)
	if n < 3 || types[0] != "message_start" || types[n-2] != "message_delta" || types[n-1] != "message_stop" {
		t.Fatalf("%q: stream events %v", body, types)
	}
	if block := types[1 : n-2]; len(block) > 0 &&
		(len(block) < 3 || block[0] != "content_block_start" || block[len(block)-1] != "content_block_stop") {
		t.Fatalf("%q: stream events %v", body, types)
	}
}
