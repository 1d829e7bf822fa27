package ingress

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestMessagesRequest checks the chat messages and tools an Anthropic
// Messages request is routed as (what vLLM's _convert_anthropic_to_openai_
// request renders), and its errors.
func TestMessagesRequest(t *testing.T) {
	for _, tc := range []struct {
		name, body     string
		messages       string // JSON, compared as values
		tools          string
		wantErr, param string
	}{
		{name: "string content", body: `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
			messages: `[{"role":"user","content":"hi"}]`},
		{name: "system string and blocks, billing header dropped, system messages joined",
			body: `{"max_tokens":5,"system":[{"type":"text","text":"x-anthropic-billing-header: cc_version=1; cch=ab12;"},{"type":"text","text":"You are "},{"type":"text","text":"Claude Code.","cache_control":{"type":"ephemeral"}}],
				"messages":[{"role":"system","content":" Be brief."},{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
			messages: `[{"role":"system","content":"You are Claude Code. Be brief."},{"role":"user","content":"hi"}]`},
		{name: "image blocks, url and base64", body: `{"max_tokens":5,"messages":[{"role":"user","content":[
				{"type":"image","source":{"type":"base64","media_type":"image/png","data":"iVBOR"}},
				{"type":"image","source":{"type":"url","url":"https://x/a.jpg"}},
				{"type":"image","source":{"type":"base64","data":"AAA"}},
				{"type":"text","text":"what?"}]}]}`,
			messages: `[{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBOR"}},
				{"type":"image_url","image_url":{"url":"https://x/a.jpg"}},{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AAA"}},
				{"type":"text","text":"what?"}]}]`},
		{name: "a tool round trip", body: `{"max_tokens":5,"tools":[{"name":"get_weather","description":"Weather.","input_schema":{"type":"object","properties":{"city":{"type":"string"}}}}],
				"tool_choice":{"type":"auto"},
				"messages":[{"role":"user","content":"Weather in Rome?"},
				{"role":"assistant","content":[{"type":"thinking","thinking":"need ","signature":"s"},{"type":"thinking","thinking":"the tool"},{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_1","name":"get_weather","input":{"city":"Rome"}}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_1","content":[{"type":"text","text":"21 C"},{"type":"text","text":"sunny"},{"type":"image","source":{"type":"url","url":"https://x/map.png"}}]},{"type":"text","text":"Thanks"}]},
				{"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_2","content":"ok"}]}]}`,
			messages: `[{"role":"user","content":"Weather in Rome?"},
				{"role":"assistant","content":"Checking.","reasoning":"need the tool","tool_calls":[{"id":"toolu_1","type":"function","function":{"name":"get_weather","arguments":{"city":"Rome"}}}]},
				{"role":"tool","tool_call_id":"toolu_1","content":"21 C\nsunny"},
				{"role":"user","content":[{"type":"image_url","image_url":{"url":"https://x/map.png"}}]},
				{"role":"user","content":"Thanks"},
				{"role":"tool","tool_call_id":"toolu_2","content":"ok"}]`,
			tools: `[{"type":"function","function":{"name":"get_weather","description":"Weather.","parameters":{"type":"object","properties":{"city":{"type":"string"}}},"defer_loading":null}}]`},
		{name: "assistant tool_result as text", body: `{"max_tokens":5,"messages":[{"role":"user","content":"a"},{"role":"assistant","content":[{"type":"tool_result","tool_use_id":"t","content":"42"}]}]}`,
			messages: `[{"role":"user","content":"a"},{"role":"assistant","content":"Tool result: 42"}]`},
		{name: "empty user message dropped", body: `{"max_tokens":5,"messages":[{"role":"user","content":[{"type":"text","text":""}]},{"role":"user","content":"b"}]}`,
			messages: `[{"role":"user","content":"b"}]`},
		{name: "no max_tokens", body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`, wantErr: "max_tokens is required", param: "max_tokens"},
		{name: "no messages", body: `{"model":"m","max_tokens":5}`, wantErr: "messages is required", param: "messages"},
		{name: "messages not array", body: `{"max_tokens":5,"messages":"hi"}`, wantErr: "messages must be an array", param: "messages"},
		{name: "only system", body: `{"max_tokens":5,"messages":[{"role":"system","content":"x"}]}`, messages: `[{"role":"system","content":"x"}]`},
		{name: "empty messages", body: `{"max_tokens":5,"messages":[]}`, wantErr: "no message to render", param: "messages"},
		{name: "no role", body: `{"max_tokens":5,"messages":[{"content":"x"}]}`, wantErr: "role is required", param: "messages[0].role"},
		{name: "bad content", body: `{"max_tokens":5,"messages":[{"role":"user","content":1}]}`, wantErr: "must be a string or an array of content blocks", param: "messages[0].content"},
		{name: "bad block", body: `{"max_tokens":5,"messages":[{"role":"user","content":[1]}]}`, wantErr: "must be an object", param: "messages[0].content[0]"},
		{name: "bad system", body: `{"max_tokens":5,"system":1,"messages":[{"role":"user","content":"x"}]}`, wantErr: "system must be", param: "system"},
		{name: "bad tools", body: `{"max_tokens":5,"tools":[{"description":"x"}],"messages":[{"role":"user","content":"x"}]}`, wantErr: "tools[0].name", param: "tools"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parseAsChat(t, epMessages, tc.body, tc.messages, tc.tools, tc.wantErr, tc.param)
		})
	}
}

// TestMessagesError: the ingress's own errors on the Messages API are in
// Anthropic's shape, typed by status.
func TestMessagesError(t *testing.T) {
	for _, c := range []struct {
		ae   *apiError
		want string
	}{
		{badRequest("max_tokens", ErrBadRequest), `{"type":"error","error":{"type":"invalid_request_error","message":"invalid request"}}`},
		{&apiError{status: 429, msg: "slow down"}, `{"type":"error","error":{"type":"rate_limit_error","message":"slow down"}}`},
		{&apiError{status: 503, msg: "no engine"}, `{"type":"error","error":{"type":"overloaded_error","message":"no engine"}}`},
		{&apiError{status: 502, msg: "up"}, `{"type":"error","error":{"type":"api_error","message":"up"}}`},
	} {
		if got := string(appendMessagesError(nil, c.ae)); got != c.want {
			t.Errorf("got %s, want %s", got, c.want)
		}
	}
}

// FuzzParseMessages: any body parses into valid chat messages and tools or
// fails with a 400, never a panic.
func FuzzParseMessages(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`,
		`{"max_tokens":5,"system":[{"type":"text","text":"s"}],"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","data":"A"}},{"type":"text","text":"q"}]}]}`,
		`{"max_tokens":5,"tools":[{"name":"n","input_schema":{}}],"messages":[{"role":"assistant","content":[{"type":"thinking","thinking":"t"},{"type":"tool_use","id":"i","name":"n","input":{"a":1}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"i","content":[{"type":"text","text":"r"},{"type":"image","source":{"type":"url","url":"u"}},{"type":"tool_reference","tool_name":"x"}]}]}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) { fuzzParsesAsChat(t, epMessages, body) })
}

// TestMessagesStreamEvents checks the stream helpers on vLLM's Messages
// events: no preamble (message_start comes after the prefill), the end at
// message_stop, output tokens from message_delta's usage (message_start's
// zero ignored), and a broken stream's last event in Anthropic's shape.
func TestMessagesStreamEvents(t *testing.T) {
	ev := func(typ, data string) string {
		return "event: " + typ + "\ndata: {\"type\":\"" + typ + "\"" + data + "}\n\n"
	}
	start := ev("message_start", `,"message":{"id":"m","content":[],"usage":{"input_tokens":5,"output_tokens":0}}`)
	delta := ev("content_block_delta", `,"delta":{"type":"text_delta","text":"hi"},"index":0`)
	end := ev("message_delta", `,"delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":5,"output_tokens":7}`) + ev("message_stop", "")
	if messagesStream.preambleOnly([]byte(start)) || messagesStream.firstEventFailed([]byte(start)) ||
		!messagesStream.firstEventFailed([]byte(ev("error", `,"error":{"type":"overloaded_error","message":"x"}`))) {
		t.Fatal("first event")
	}
	if messagesStream.ended([]byte(start+delta)) || !messagesStream.ended([]byte(delta+end)) {
		t.Fatal("ended")
	}
	checkOutTokens(t, messagesStream, start, delta, end, 7)
	tail := appendMessagesErrorEvent(nil, `engine "x" failed`, 0)
	var e struct {
		Type  string
		Error struct{ Type, Message string }
	}
	if errorEventData(t, tail, &e); e.Type != "error" || e.Error.Type != "api_error" || e.Error.Message != `engine "x" failed` {
		t.Fatalf("error event %q", tail)
	}
}

// Every error the ingress itself answers on the Messages API's paths,
// count_tokens and the transport's 413 included, is in Anthropic's shape;
// the other endpoints keep OpenAI's.
func TestMessagesPathsErrorShape(t *testing.T) {
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "m", URL: fe.url()})
	cfg.MaxBodyBytes = 4096
	s := startIngress(t, cfg, Deps{})
	base := "http://" + s.Addr()
	big := `{"model":"m","max_tokens":5,"messages":[{"role":"user","content":"` + strings.Repeat("x", 5000) + `"}]}`
	for _, c := range []struct {
		method, path, body string
		status             int
		typ                string
	}{
		{"POST", "/v1/messages", big, 413, "request_too_large"},
		{"POST", "/v1/messages", `{"model":"nope","max_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
		{"POST", "/v1/messages/count_tokens", `{"model":"m",`, 400, "invalid_request_error"},
		{"POST", "/v1/messages/count_tokens", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, 404, "not_found_error"},
		{"POST", "/v1/messages/count_tokens", big, 413, "request_too_large"},
		{"GET", "/v1/messages/count_tokens", "", 405, "invalid_request_error"},
	} {
		req, _ := http.NewRequest(c.method, base+c.path, strings.NewReader(c.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e struct {
			Type  string
			Error struct{ Type, Message string }
		}
		if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != c.status || e.Type != "error" || e.Error.Type != c.typ || e.Error.Message == "" {
			t.Errorf("%s %s: %d %s, want %d in Anthropic's shape, type %s", c.method, c.path, resp.StatusCode, b, c.status, c.typ)
		}
	}
	st, _, b := post(t, http.DefaultClient, base+"/v1/chat/completions", big)
	var oe struct {
		Error struct{ Type, Message string }
	}
	if err := json.Unmarshal(b, &oe); err != nil || st != 413 || oe.Error.Type != "invalid_request_error" {
		t.Errorf("chat: %d %s, want 413 in OpenAI's shape", st, b)
	}
}
