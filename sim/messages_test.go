package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

// msgPost posts a Messages request and decodes a 200 answer.
func msgPost(t *testing.T, s *Server, body any) (messageObject, []byte, http.Header) {
	t.Helper()
	code, b, h := post(t, s.URL()+"/v1/messages", body)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/messages %v: %d %s", body, code, b)
	}
	var m messageObject
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return m, b, h
}

// chatAnswer runs the chat endpoint on msgs (extra: more body fields).
func chatAnswer(t *testing.T, s *Server, msgs []map[string]any, maxTokens int, extra ...any) openai.ChatCompletion {
	t.Helper()
	body := map[string]any{"model": "test-model", "messages": msgs, "max_tokens": maxTokens}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	code, b, _ := post(t, s.URL()+"/v1/chat/completions", body)
	var cc openai.ChatCompletion
	if code != http.StatusOK || json.Unmarshal(b, &cc) != nil {
		t.Fatalf("chat %d %s", code, b)
	}
	return cc
}

func TestMessagesNonStreamed(t *testing.T) {
	s := startSim(t, nil)
	m, b, hdr := msgPost(t, s, map[string]any{"model": "test-model", "max_tokens": 7, "system": "be brief",
		"messages": []any{map[string]any{"role": "user", "content": "hello there"}}, "temperature": 0.5, "unknown_field": 1})
	chatMsgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}
	cc := chatAnswer(t, s, chatMsgs, 7)
	// Every field of vLLM's answer, with its values: the chat completion id,
	// the same text and prompt as the chat endpoint, max_tokens for a
	// generation cut by max_tokens, stop_sequence null, usage with the
	// cache fields (nothing cached yet).
	want := fmt.Sprintf(`{"id":"chatcmpl-%s","type":"message","role":"assistant","content":[{"type":"text","text":%q}],`+
		`"model":"test-model","stop_reason":"max_tokens","stop_sequence":null,`+
		`"usage":{"input_tokens":%d,"output_tokens":7,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`,
		hdr.Get("X-Request-Id"), cc.Choices[0].Message.Content, cc.Usage.PromptTokens)
	if string(b) != want {
		t.Fatalf("answer\n %s\nwant\n %s", b, want)
	}
	if m.Usage.InputTokens != cc.Usage.PromptTokens || hdr.Get("Content-Type") != "application/json" {
		t.Fatalf("usage %+v, chat %+v, content type %q", m.Usage, cc.Usage, hdr.Get("Content-Type"))
	}
	// No model: the served one.
	if m, _, _ := msgPost(t, s, map[string]any{"max_tokens": 1, "messages": []any{map[string]any{"role": "user", "content": "x"}}}); m.Model != "test-model" {
		t.Fatalf("model %q", m.Model)
	}
}

// A natural stop (EOS) is end_turn; a cut by max_tokens is max_tokens.
func TestMessagesStopReasons(t *testing.T) {
	s := startSim(t, func(c *Config) { c.EOSRate = 0.3 })
	stops := 0
	for i := 0; i < 10; i++ {
		m, b, _ := msgPost(t, s, map[string]any{"model": "test-model", "max_tokens": 40,
			"messages": []any{map[string]any{"role": "user", "content": fmt.Sprintf("prompt %d", i)}}})
		want := "end_turn"
		if m.Usage.OutputTokens == 40 {
			want = "max_tokens"
		} else {
			stops++
		}
		if m.StopReason == nil || *m.StopReason != want {
			t.Fatalf("%d tokens of 40: %s", m.Usage.OutputTokens, b)
		}
	}
	if stops == 0 {
		t.Fatal("EOSRate 0.3 never stopped early in 10 requests of 40 tokens")
	}
}

// stepRecorder records an answer with the engine steps rank 0 had taken
// at each write (one write per event) and closes flushed at the first
// flush (the headers).
type stepRecorder struct {
	*httptest.ResponseRecorder
	s       *Server
	flushed chan struct{}
	once    sync.Once
	mu      sync.Mutex
	steps   []int // at each write
}

func (r *stepRecorder) Write(p []byte) (int, error) {
	r.mu.Lock()
	r.steps = append(r.steps, int(r.s.Load(0).Steps))
	r.mu.Unlock()
	return r.ResponseRecorder.Write(p)
}

func (r *stepRecorder) Flush() {
	r.ResponseRecorder.Flush()
	r.once.Do(func() { close(r.flushed) })
}

func TestMessagesStreamEvents(t *testing.T) {
	s := startSim(t, nil)
	rk := s.ranks[0]
	rk.hold(true) // the engine takes no step: nothing is prefilled until released
	t.Cleanup(func() { rk.hold(false) })
	body := func() map[string]any {
		return map[string]any{"model": "test-model", "max_tokens": 10, "messages": []any{map[string]any{"role": "user", "content": "stream this"}}}
	}
	b := mustJSON(t, map[string]any{"model": "test-model", "max_tokens": 10, "stream": true,
		"messages": []any{map[string]any{"role": "user", "content": "stream this"}}})
	rec := &stepRecorder{ResponseRecorder: httptest.NewRecorder(), s: s, flushed: make(chan struct{})}
	done := make(chan struct{})
	go func() {
		defer close(done)
		s.httpSrv.Handler.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/messages", bytes.NewReader(b)))
	}()
	// The headers go out before the prefill (vLLM's StreamingResponse).
	select {
	case <-rec.flushed:
	case <-time.After(10 * time.Second):
		t.Fatal("no headers")
	}
	if l := s.Load(0); l.Waiting != 1 || l.Steps != 0 {
		t.Fatalf("before the engine was released: %+v", l)
	}
	rk.hold(false)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
	if ct := rec.Header().Get("Content-Type"); rec.Code != http.StatusOK || ct != "text/event-stream; charset=utf-8" {
		t.Fatalf("status %d, content type %q", rec.Code, ct)
	}
	ev := &sseEvents{t: t, r: bufio.NewReader(bytes.NewReader(rec.Body.Bytes()))}
	all := ev.rest()
	// message_start comes with the first output token, after the prefill:
	// when it was written, the engine had taken a step.
	if len(rec.steps) != len(all) || rec.steps[0] == 0 {
		t.Fatalf("%d events in %d writes, the first after %v engine steps", len(all), len(rec.steps), rec.steps)
	}
	id := "chatcmpl-" + rec.Header().Get("X-Request-Id")
	prompt := tokenizeCount(t, s, []map[string]any{{"role": "user", "content": "stream this"}})
	want := fmt.Sprintf(`{"type":"message_start","message":{"id":%q,"content":[],"model":"test-model","stop_reason":null,`+
		`"stop_sequence":null,"usage":{"input_tokens":%d,"output_tokens":0}}}`, id, prompt)
	if all[0].typ != "message_start" || string(all[0].data) != want {
		t.Fatalf("first event %q %s, want %s", all[0].typ, all[0].data, want)
	}
	rest := all[1:]
	n := len(rest)
	if n < 5 || string(rest[0].data) != `{"type":"content_block_start","content_block":{"type":"text","text":""},"index":0}` ||
		string(rest[n-3].data) != `{"type":"content_block_stop","index":0}` || string(rest[n-1].data) != `{"type":"message_stop"}` {
		t.Fatalf("events %v", rest)
	}
	var text string
	for _, e := range rest[1 : n-3] {
		d, _ := e.m["delta"].(map[string]any)
		if e.typ != "content_block_delta" || e.m["index"] != 0.0 || len(e.m) != 3 || d["type"] != "text_delta" || len(d) != 2 || d["text"] == "" {
			t.Fatalf("delta %s", e.data)
		}
		text += d["text"].(string)
	}
	wantDelta := fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"max_tokens"},"usage":{"input_tokens":%d,`+
		`"output_tokens":10,"cache_creation_input_tokens":0,"cache_read_input_tokens":0}}`, prompt)
	if string(rest[n-2].data) != wantDelta {
		t.Fatalf("message_delta %s, want %s", rest[n-2].data, wantDelta)
	}
	// The generation is the prompt's (seeded): unstreamed it is the same
	// text, so no token was lost between deltas.
	if m, _, _ := msgPost(t, s, body()); len(m.Content) != 1 || m.Content[0].Text != text {
		t.Fatalf("streamed %q, unstreamed %+v", text, m.Content)
	}
}

// The conversion makes the chat messages vLLM makes.
func TestMessagesConversion(t *testing.T) {
	user := func(content any) map[string]any { return map[string]any{"role": "user", "content": content} }
	assistant := func(content any) map[string]any { return map[string]any{"role": "assistant", "content": content} }
	text := func(s string) map[string]any { return map[string]any{"type": "text", "text": s} }
	cases := []struct {
		name   string
		system any
		msgs   []any
		want   string
	}{
		{"strings", "Be brief.", []any{user("hi"), assistant("hello"), user("")},
			`[{"role":"system","content":"Be brief."},{"role":"user","content":"hi"},{"role":"assistant","content":"hello"},{"role":"user","content":""}]`},
		{"system blocks joined, billing header dropped, inline system hoisted",
			[]any{text("x-anthropic-billing-header: cc_version=2.1; cch=1f2e;"), text("You are Claude Code."), text(""), text(" Be brief.")},
			[]any{map[string]any{"role": "system", "content": []any{text(" Inline."), text("x-anthropic-billing-header: x")}}, user("hi"),
				map[string]any{"role": "system", "content": " Late."}},
			`[{"role":"system","content":"You are Claude Code. Be brief. Inline. Late."},{"role":"user","content":"hi"}]`},
		{"no system: none", "", []any{user("hi")}, `[{"role":"user","content":"hi"}]`},
		{"single text part collapsed, empty text dropped, ctx is user", nil,
			[]any{map[string]any{"role": "ctx", "content": []any{text(""), text("hello")}}},
			`[{"role":"user","content":"hello"}]`},
		{"images to image_url parts", nil, []any{user([]any{
			text("what is this?"),
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="}},
			map[string]any{"type": "image", "source": map[string]any{"type": "base64", "data": "AAAA"}},
			map[string]any{"type": "image", "source": map[string]any{"type": "url", "url": "https://example.com/cat.jpg"}},
			map[string]any{"type": "image", "source": map[string]any{}},
		})},
			`[{"role":"user","content":[{"type":"text","text":"what is this?"},` +
				`{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgo="}},` +
				`{"type":"image_url","image_url":{"url":"data:image/jpeg;base64,AAAA"}},` +
				`{"type":"image_url","image_url":{"url":"https://example.com/cat.jpg"}}]}]`},
		{"thinking to reasoning, tool_use to tool_calls, tool_result to tool messages", nil, []any{
			user("weather in Paris?"),
			assistant([]any{
				map[string]any{"type": "thinking", "thinking": "Let me ", "signature": "sig"},
				map[string]any{"type": "redacted_thinking", "data": "opaque"},
				map[string]any{"type": "thinking", "thinking": "check."},
				text("Checking."),
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": map[string]any{"city": "Paris"}},
				map[string]any{"type": "tool_use", "id": "toolu_2", "name": "clock"},
			}),
			user([]any{
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
				map[string]any{"type": "tool_result", "tool_use_id": "toolu_2", "content": []any{text("12:00"), text("UTC"),
					map[string]any{"type": "image", "source": map[string]any{"type": "base64", "media_type": "image/gif", "data": "R0lG"}},
					map[string]any{"type": "tool_reference", "tool_name": "clock"}}},
				text("Thanks"),
			}),
			user([]any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_3", "is_error": true}}),
			user([]any{map[string]any{"type": "thinking", "thinking": "dropped: a user message without content"}}),
			assistant([]any{map[string]any{"type": "tool_use", "id": "toolu_4", "name": "f", "input": map[string]any{}}}),
		},
			`[{"role":"user","content":"weather in Paris?"},` +
				`{"role":"assistant","reasoning":"Let me check.","tool_calls":[` +
				`{"id":"toolu_1","type":"function","function":{"name":"weather","arguments":"{\"city\": \"Paris\"}"}},` +
				`{"id":"toolu_2","type":"function","function":{"name":"clock","arguments":"{}"}}],"content":"Checking."},` +
				`{"role":"tool","tool_call_id":"toolu_1","content":"sunny"},` +
				`{"role":"tool","tool_call_id":"toolu_2","content":"12:00\nUTC"},` +
				`{"role":"user","content":[{"type":"image_url","image_url":{"url":"data:image/gif;base64,R0lG"}}]},` +
				`{"role":"tool","tool_call_id":"toolu_2","content":[{"type":"tool_reference","name":"clock"}]},` +
				`{"role":"user","content":"Thanks"},` +
				`{"role":"tool","tool_call_id":"toolu_3","content":""},` +
				`{"role":"assistant","tool_calls":[{"id":"toolu_4","type":"function","function":{"name":"f","arguments":"{}"}}]}]`},
		{"tool_result in an assistant message is text, with Python's str of the content", nil, []any{
			assistant([]any{map[string]any{"type": "tool_result", "tool_use_id": "t", "content": json.RawMessage(`[{"type":"text","text":"it's"}]`)}}),
			assistant([]any{map[string]any{"type": "tool_result", "tool_use_id": "t", "content": "plain"}, text("more")}),
			assistant([]any{map[string]any{"type": "tool_result", "tool_use_id": "t"}}),
			assistant([]any{}),
		},
			`[{"role":"assistant","content":"Tool result: [{'type': 'text', 'text': \"it's\"}]"},` +
				`{"role":"assistant","content":[{"type":"text","text":"Tool result: plain"},{"type":"text","text":"more"}]},` +
				`{"role":"assistant","content":"Tool result: "},{"role":"assistant"}]`},
	}
	for _, c := range cases {
		body := map[string]any{"model": "m", "max_tokens": 1, "messages": c.msgs}
		if c.system != nil {
			body["system"] = c.system
		}
		r, err := decodeMessagesRequest(mustJSON(t, body))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if got := mustJSON(t, r.chat); !jsonEqual(t, got, []byte(c.want)) {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// A tool_use input's arguments are Python's json.dumps of it, byte for
// byte (key order and duplicates as Python keeps them, ints and floats as
// written, ensure_ascii); Python's repr is what an assistant's tool_result
// list becomes. The expectations are CPython 3's output.
func TestMessagesPythonRenderings(t *testing.T) {
	cases := []struct{ in, dumps, repr string }{
		{`{"city":"Paris","n":1,"f":1.0,"nested":{"a":[true,null,false]},"u":"é\u2028😀","q":"say \"hi\"\n\t\u0001\u007f"}`,
			`{"city": "Paris", "n": 1, "f": 1.0, "nested": {"a": [true, null, false]}, "u": "\u00e9\u2028\ud83d\ude00", "q": "say \"hi\"\n\t\u0001\u007f"}`,
			`{'city': 'Paris', 'n': 1, 'f': 1.0, 'nested': {'a': [True, None, False]}, 'u': 'é\u2028😀', 'q': 'say "hi"\n\t\x01\x7f'}`},
		{`{"a":1,"b":2,"a":3}`, `{"a": 3, "b": 2}`, `{'a': 3, 'b': 2}`},
		{`{"big":123456789012345678901234567890,"neg0":-0,"fneg0":-0.0,"e":1e16,"small":1e-5,"p":0.0001,"x":123.456,"y":1.5E+300,"z":100e-2,"w":1e15}`,
			`{"big": 123456789012345678901234567890, "neg0": 0, "fneg0": -0.0, "e": 1e+16, "small": 1e-05, "p": 0.0001, "x": 123.456, "y": 1.5e+300, "z": 1.0, "w": 1000000000000000.0}`,
			`{'big': 123456789012345678901234567890, 'neg0': 0, 'fneg0': -0.0, 'e': 1e+16, 'small': 1e-05, 'p': 0.0001, 'x': 123.456, 'y': 1.5e+300, 'z': 1.0, 'w': 1000000000000000.0}`},
		{`[{"type":"text","text":"it's"},{"type":"text","text":"both ' and \""},{"k":"tab\there\u00a0nbsp\u200b zw é 😀 \\ back"}]`,
			`[{"type": "text", "text": "it's"}, {"type": "text", "text": "both ' and \""}, {"k": "tab\there\u00a0nbsp\u200b zw \u00e9 \ud83d\ude00 \\ back"}]`,
			`[{'type': 'text', 'text': "it's"}, {'type': 'text', 'text': 'both \' and "'}, {'k': 'tab\there\xa0nbsp\u200b zw é 😀 \\ back'}]`},
		{`{}`, `{}`, `{}`},
		{`[]`, `[]`, `[]`},
		{`{"inf":1e400}`, `{"inf": Infinity}`, `{'inf': inf}`},
	}
	for _, c := range cases {
		v, err := parsePy([]byte(c.in))
		if err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if got := v.dumps(); got != c.dumps {
			t.Errorf("json.dumps(%s)\n got %s\nwant %s", c.in, got, c.dumps)
		}
		if got := v.repr(); got != c.repr {
			t.Errorf("repr(%s)\n got %s\nwant %s", c.in, got, c.repr)
		}
	}
}

// With a model's chat template, the converted messages and tools render
// exactly as the chat endpoint renders them; count_tokens counts that
// prompt.
func TestMessagesUsageMatchesChatWithTools(t *testing.T) {
	const src = `{%- for m in messages -%}<{{ m.role }}>{{ m.content }}` +
		`{%- if m.reasoning -%}(thought {{ m.reasoning }}){%- endif -%}` +
		`{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}[{{ tc.id }} {{ tc.function.name }} {{ tc.function.arguments | tojson }}]{%- endfor -%}{%- endif -%}` +
		`{%- if m.tool_call_id -%}(for {{ m.tool_call_id }}){%- endif -%}</{{ m.role }}>{%- endfor -%}` +
		`{%- if tools -%}TOOLS{{ tools | tojson }}{%- endif -%}{%- if mode -%}MODE {{ mode }}{%- endif -%}` +
		`{%- if add_generation_prompt -%}<assistant>{%- endif -%}`
	ct, err := tokenizer.NewChatTemplate(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startSim(t, func(c *Config) { c.Chat = TemplateChat{T: ct} })
	schema := map[string]any{"properties": map[string]any{"city": map[string]any{"type": "string"}}}
	body := map[string]any{"model": "test-model", "max_tokens": 2, "system": "Use tools.",
		"tools":       []any{map[string]any{"name": "weather", "description": "Weather of a city", "input_schema": schema}},
		"tool_choice": map[string]any{"type": "auto"}, "chat_template_kwargs": map[string]any{"mode": "fast"},
		"messages": []any{
			map[string]any{"role": "user", "content": "weather in Paris?"},
			map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "thinking", "thinking": "Use the tool."},
				map[string]any{"type": "tool_use", "id": "toolu_1", "name": "weather", "input": map[string]any{"city": "Paris"}}}},
			map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"}}},
		}}
	chatMsgs := []map[string]any{
		{"role": "system", "content": "Use tools."},
		{"role": "user", "content": "weather in Paris?"},
		{"role": "assistant", "reasoning": "Use the tool.", "tool_calls": []any{map[string]any{"id": "toolu_1", "type": "function",
			"function": map[string]any{"name": "weather", "arguments": `{"city": "Paris"}`}}}},
		{"role": "tool", "tool_call_id": "toolu_1", "content": "sunny"},
	}
	// vLLM adds "type": "object" to a schema without a type.
	chatTools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "weather", "description": "Weather of a city",
		"parameters": map[string]any{"properties": schema["properties"], "type": "object"}, "defer_loading": nil}}}
	want := tokenizeCount(t, s, chatMsgs, "tools", chatTools, "chat_template_kwargs", map[string]any{"mode": "fast"})
	code, b, _ := post(t, s.URL()+"/v1/messages/count_tokens", body)
	if wantCount := fmt.Sprintf(`{"input_tokens":%d,"context_management":{"original_input_tokens":%d}}`, want, want); code != http.StatusOK || string(b) != wantCount {
		t.Fatalf("count_tokens %d %s, want %s", code, b, wantCount)
	}
	m, _, _ := msgPost(t, s, body)
	if m.Usage.InputTokens+*m.Usage.CacheReadInputTokens != want || want <= tokenizeCount(t, s, chatMsgs) {
		t.Fatalf("usage %+v, want %d prompt tokens", m.Usage, want)
	}
	// The whole prompt the chat endpoint renders for the same request is
	// now cached up to its last block: the same tokens.
	bs := s.Config().Engine.BlockSize
	cc := chatAnswer(t, s, chatMsgs, 1, "tools", chatTools, "chat_template_kwargs", map[string]any{"mode": "fast"})
	if cc.Usage.PromptTokens != want || cc.Usage.CachedTokens() != (want-1)/bs*bs {
		t.Fatalf("chat usage %+v for a prompt of %d tokens", cc.Usage, want)
	}
}

// A second identical request is served from the prefix cache, through
// both the unstreamed and the streamed answer.
func TestMessagesPrefixCache(t *testing.T) {
	s := startSim(t, nil)
	body := func() map[string]any {
		return map[string]any{"model": "test-model", "max_tokens": 3, "system": []any{map[string]any{"type": "text", "text": "A long system prompt for the cache."}},
			"messages": []any{map[string]any{"role": "user", "content": "What is the capital of France?"}}}
	}
	first, _, _ := msgPost(t, s, body())
	prompt := first.Usage.InputTokens
	bs := s.Config().Engine.BlockSize
	if *first.Usage.CacheReadInputTokens != 0 || *first.Usage.CacheCreationInputTokens != 0 {
		t.Fatalf("cold usage %+v", first.Usage)
	}
	second, _, _ := msgPost(t, s, body())
	if cached := *second.Usage.CacheReadInputTokens; cached != (prompt-1)/bs*bs || second.Usage.InputTokens != prompt-cached {
		t.Fatalf("warm usage %+v (prompt %d)", second.Usage, prompt)
	}
	_, ev := msgStreamPost(t, s, body())
	start := ev.must()
	rest := ev.rest()
	delta := rest[len(rest)-2]
	usage := delta.m["usage"].(map[string]any)
	if start.m["message"].(map[string]any)["usage"].(map[string]any)["input_tokens"] != float64(prompt) ||
		usage["cache_read_input_tokens"] != float64((prompt-1)/bs*bs) || usage["input_tokens"] != float64(prompt-(prompt-1)/bs*bs) {
		t.Fatalf("streamed: %s … %s", start.data, delta.data)
	}
}

// anthropicErr decodes an Anthropic error body strictly.
func anthropicErr(b []byte) (anthropicError, bool) {
	var e struct {
		Type  string          `json:"type"`
		Error *anthropicError `json:"error"`
	}
	var keys map[string]json.RawMessage
	if json.Unmarshal(b, &e) != nil || json.Unmarshal(b, &keys) != nil || len(keys) != 2 || e.Type != "error" || e.Error == nil {
		return anthropicError{}, false
	}
	return *e.Error, true
}

func TestMessagesMalformedRequests(t *testing.T) {
	s := startSim(t, nil)
	msgs := []any{map[string]any{"role": "user", "content": "x"}}
	maxLen := s.Config().Engine.MaxModelLen
	cases := []struct {
		body any
		code int
		typ  string
		msg  string
	}{
		{map[string]any{"max_tokens": 1}, 400, "invalid_request_error", "messages: required"},
		{map[string]any{"max_tokens": 1, "messages": []any{}}, 400, "invalid_request_error", "messages: at least one message"},
		{map[string]any{"max_tokens": 1, "messages": "hi"}, 400, "invalid_request_error", "messages: expected an array, got string"},
		{map[string]any{"messages": msgs}, 400, "invalid_request_error", "max_tokens: required"},
		{map[string]any{"messages": msgs, "max_tokens": 0}, 400, "invalid_request_error", "max_tokens 0: must be positive"},
		{map[string]any{"messages": msgs, "max_tokens": "10"}, 400, "invalid_request_error", "max_tokens: expected an integer, got string"},
		{map[string]any{"messages": msgs, "max_tokens": 1.5}, 400, "invalid_request_error", "max_tokens: expected an integer, got number 1.5"},
		{map[string]any{"model": 5, "messages": msgs, "max_tokens": 1}, 400, "invalid_request_error", "model: expected a string"},
		{map[string]any{"model": "other", "messages": msgs, "max_tokens": 1}, 404, "NotFoundError", "The model `other` does not exist."},
		{map[string]any{"messages": []any{"hi"}, "max_tokens": 1}, 400, "invalid_request_error", "messages[0]: expected an object, got string"},
		{map[string]any{"messages": []any{map[string]any{"content": "x"}}, "max_tokens": 1}, 400, "invalid_request_error", "messages[0].role: required"},
		{map[string]any{"messages": []any{map[string]any{"role": "tool", "content": "x"}}, "max_tokens": 1}, 400, "invalid_request_error", `messages[0].role "tool"`},
		{map[string]any{"messages": []any{map[string]any{"role": "user"}}, "max_tokens": 1}, 400, "invalid_request_error", "messages[0].content: required"},
		{map[string]any{"messages": []any{map[string]any{"role": "user", "content": 5}}, "max_tokens": 1}, 400, "invalid_request_error", "messages[0].content: must be a string or a list"},
		{map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "video"}}}}, "max_tokens": 1},
			400, "invalid_request_error", `messages[0].content[0].type "video"`},
		{map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "text", "text": 5}}}}, "max_tokens": 1},
			400, "invalid_request_error", "messages[0].content[0].text: expected a string, got number"},
		{map[string]any{"messages": []any{map[string]any{"role": "assistant", "content": []any{map[string]any{"type": "tool_use", "input": "x"}}}}, "max_tokens": 1},
			400, "invalid_request_error", "messages[0].content[0].input: must be an object"},
		{map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_result", "content": []any{1}}}}}, "max_tokens": 1},
			400, "invalid_request_error", "messages[0].content[0].content: must be a string or a list of objects"},
		{map[string]any{"messages": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "tool_use", "id": "t", "name": "f"}}}}, "max_tokens": 1},
			400, "invalid_request_error", "no message left to render"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "system": 5}, 400, "invalid_request_error", "system: must be a string or a list"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "tools": []any{map[string]any{"name": "f"}}}, 400, "invalid_request_error", "tools[0].input_schema: required"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "tools": []any{map[string]any{"input_schema": map[string]any{}}}}, 400, "invalid_request_error", "tools[0].name: required"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "tool_choice": map[string]any{"type": "tool"}}, 400, "invalid_request_error", "tool_choice.name is required"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "tool_choice": map[string]any{"type": "some"}}, 400, "invalid_request_error", "tool_choice.type"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "stream": "maybe"}, 400, "invalid_request_error", "stream: expected a boolean"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "stop_sequences": "END"}, 400, "invalid_request_error", "stop_sequences: expected an array"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "temperature": -1, "top_p": 2}, 400, "invalid_request_error", "temperature: must not be negative; top_p: must be in (0, 1]"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "chat_template_kwargs": []any{}}, 400, "invalid_request_error", "chat_template_kwargs: must be an object"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "output_config": map[string]any{"effort": "huge"}}, 400, "invalid_request_error", "output_config.effort"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "output_config": map[string]any{"effort": "low medium"}}, 400, "invalid_request_error", "output_config.effort"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "tool_choice": map[string]any{"type": "any tool"}}, 400, "invalid_request_error", "tool_choice.type"},
		{map[string]any{"messages": msgs, "max_tokens": 1, "metadata": 1, "kv_transfer_params": []any{}}, 400, "invalid_request_error",
			"metadata: must be an object; kv_transfer_params: must be an object"},
		{map[string]any{"messages": msgs, "max_tokens": maxLen}, 400, "invalid_request_error", fmt.Sprintf("This model's maximum context length is %d tokens", maxLen)},
		{"a string", 400, "invalid_request_error", "decode body: expected an object, got string"},
	}
	for _, c := range cases {
		code, b, _ := post(t, s.URL()+"/v1/messages", c.body)
		e, ok := anthropicErr(b)
		if code != c.code || !ok || e.Type != c.typ || !strings.Contains(e.Message, c.msg) {
			t.Errorf("%v: %d %s, want %d %s with %q", c.body, code, b, c.code, c.typ, c.msg)
		}
	}
	for raw, msg := range map[string]string{
		`{not json`: "decode body",
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1} {}`: "trailing data",
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":1}]`:   "trailing data",
		``: "decode body",
	} {
		for _, path := range []string{"/v1/messages", "/v1/messages/count_tokens"} {
			resp, err := http.Post(s.URL()+path, "application/json", strings.NewReader(raw))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if e, ok := anthropicErr(b); resp.StatusCode != http.StatusBadRequest || !ok || !strings.Contains(e.Message, msg) {
				t.Errorf("%s %q: %d %s", path, raw, resp.StatusCode, b)
			}
		}
	}
	// count_tokens takes no max_tokens but checks the rest as /v1/messages.
	for body, want := range map[string]string{
		`{"messages":[{"role":"user","content":"x"}],"max_tokens":"ignored"}`: "",
		`{"model":"other","messages":[{"role":"user","content":"x"}]}`:        "NotFoundError",
		`{"messages":[{"role":"robot","content":"x"}]}`:                       "invalid_request_error",
	} {
		code, b, _ := post(t, s.URL()+"/v1/messages/count_tokens", json.RawMessage(body))
		e, isErr := anthropicErr(b)
		if want == "" && code != http.StatusOK || want != "" && (code == http.StatusOK || !isErr || e.Type != want) {
			t.Errorf("count_tokens %s: %d %s", body, code, b)
		}
	}
}

// An engine restart mid-stream ends the stream with an error event; a
// client that goes away aborts the engine request.
func TestMessagesStreamRestartAndDisconnect(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 })
	body := func() map[string]any {
		return map[string]any{"model": "test-model", "max_tokens": 500, "messages": []any{map[string]any{"role": "user", "content": "a long answer"}}}
	}
	last := streamRestartAndDisconnect(t, s, func() (*http.Response, *sseEvents) { return msgStreamPost(t, s, body()) }, "content_block_delta")
	if want := `{"type":"error","error":{"type":"internal_error","message":"request aborted: engine restarted"}}`; string(last.data) != want {
		t.Fatalf("last event %s %s", last.typ, last.data)
	}
}
