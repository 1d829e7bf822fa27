package sim

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

// respPost posts a Responses request and decodes a 200 answer.
func respPost(t *testing.T, s *Server, body map[string]any, hdr ...string) (responseObject, []byte, http.Header) {
	t.Helper()
	code, b, h := post(t, s.URL()+"/v1/responses", body, hdr...)
	if code != http.StatusOK {
		t.Fatalf("POST /v1/responses %v: %d %s", body, code, b)
	}
	var o responseObject
	if err := json.Unmarshal(b, &o); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
	return o, b, h
}

// tokenizeCount is the prompt length /tokenize (and so the chat endpoint)
// gives messages.
func tokenizeCount(t *testing.T, s *Server, msgs []map[string]any, extra ...any) int {
	t.Helper()
	body := map[string]any{"model": "test-model", "messages": msgs}
	for i := 0; i+1 < len(extra); i += 2 {
		body[extra[i].(string)] = extra[i+1]
	}
	code, b, _ := post(t, s.URL()+"/tokenize", body)
	var tr openai.TokenizeResponse
	if code != http.StatusOK || json.Unmarshal(b, &tr) != nil {
		t.Fatalf("tokenize %d %s", code, b)
	}
	return tr.Count
}

func eventResponse(t *testing.T, ev sseEv) responseObject {
	t.Helper()
	var x struct {
		Response responseObject `json:"response"`
	}
	if err := json.Unmarshal(ev.data, &x); err != nil || x.Response.ID == "" {
		t.Fatalf("%s without a response: %s (%v)", ev.typ, ev.data, err)
	}
	return x.Response
}

func TestResponsesNonStreamedShapeAndUsage(t *testing.T) {
	s := startSim(t, nil)
	o, b, hdr := respPost(t, s, map[string]any{"model": "test-model", "input": "hello there", "instructions": "be brief",
		"max_output_tokens": 7, "temperature": 0.5, "metadata": map[string]any{"k": "v"}, "user": "u1", "unknown_field": 1})
	if !strings.HasPrefix(o.ID, "resp_") || len(o.ID) != len("resp_")+32 || hdr.Get("X-Request-Id") != o.ID {
		t.Fatalf("id %q, X-Request-Id %q", o.ID, hdr.Get("X-Request-Id"))
	}
	// Finishing by length is "incomplete" with the reason vLLM gives.
	if o.Object != "response" || o.Model != "test-model" || o.CreatedAt <= 0 || o.Status != "incomplete" ||
		o.IncompleteDetails == nil || o.IncompleteDetails.Reason != "max_output_tokens" {
		t.Fatalf("response %s", b)
	}
	if len(o.Output) != 1 || o.Output[0].Type != "message" || o.Output[0].Role != "assistant" || o.Output[0].Status != "completed" ||
		!strings.HasPrefix(o.Output[0].ID, "msg_") || len(o.Output[0].Content) != 1 || o.Output[0].Content[0].Type != "output_text" ||
		o.outputText() == "" {
		t.Fatalf("output %s", b)
	}
	// input_tokens is the chat endpoint's prompt_tokens for the same messages.
	msgs := []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hello there"}}
	code, cb, _ := post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 1})
	var cc openai.ChatCompletion
	if code != http.StatusOK || json.Unmarshal(cb, &cc) != nil {
		t.Fatalf("chat %d %s", code, cb)
	}
	u := o.Usage
	if u == nil || u.InputTokens != cc.Usage.PromptTokens || u.OutputTokens != 7 || u.TotalTokens != u.InputTokens+7 ||
		u.InputTokensDetails.CachedTokens != 0 {
		t.Fatalf("usage %+v, chat prompt_tokens %d", u, cc.Usage.PromptTokens)
	}
	// Every field of OpenAI's Response object is there, with vLLM's values.
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"error": nil, "previous_response_id": nil, "instructions": "be brief", "max_output_tokens": 7.0,
		"temperature": 0.5, "top_p": 1.0, "tools": []any{}, "tool_choice": "auto", "parallel_tool_calls": true,
		"metadata": map[string]any{"k": "v"}, "user": "u1", "background": false, "truncation": "disabled",
		"service_tier": "auto", "output_tokens_details": map[string]any{"reasoning_tokens": 0.0},
		"annotations": []any{}}
	m["output_tokens_details"] = m["usage"].(map[string]any)["output_tokens_details"]
	m["annotations"] = m["output"].([]any)[0].(map[string]any)["content"].([]any)[0].(map[string]any)["annotations"]
	for k, v := range want {
		if got, ok := m[k]; !ok || !reflect.DeepEqual(got, v) {
			t.Errorf("%s = %#v (present %v), want %#v", k, got, ok, v)
		}
	}
}

// Without max_output_tokens the chat default applies; a cap beyond the
// context is cut to what the context has left (vLLM); a prompt that fills
// the context is refused with vLLM's message.
func TestResponsesMaxOutputTokens(t *testing.T) {
	s := startSim(t, func(c *Config) { c.DefaultChatMaxTokens = 5 })
	o, _, _ := respPost(t, s, map[string]any{"model": "test-model", "input": ""})
	if o.MaxOutputTokens != 5 || o.Usage.OutputTokens != 5 {
		t.Fatalf("default: max_output_tokens %d, usage %+v", o.MaxOutputTokens, o.Usage)
	}
	base, maxLen := o.Usage.InputTokens, s.Config().Engine.MaxModelLen
	o, _, _ = respPost(t, s, map[string]any{"model": "test-model", "input": strings.Repeat("a", maxLen-10-base), "max_output_tokens": 500})
	if o.Usage.InputTokens != maxLen-10 || o.MaxOutputTokens != 10 || o.Usage.OutputTokens != 10 {
		t.Fatalf("capped: max_output_tokens %d, usage %+v", o.MaxOutputTokens, o.Usage)
	}
	code, b, _ := post(t, s.URL()+"/v1/responses", map[string]any{"model": "test-model", "input": strings.Repeat("a", maxLen-base)})
	d, ok := openai.DecodeError(b)
	if want := fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", maxLen, maxLen); code != http.StatusBadRequest || !ok || d.Message != want {
		t.Fatalf("too long: %d %s", code, b)
	}
}

// A natural stop (EOS) is status "completed" without incomplete_details.
func TestResponsesCompletedOnStop(t *testing.T) {
	s := startSim(t, func(c *Config) { c.EOSRate = 0.3 })
	stops := 0
	for i := 0; i < 10; i++ {
		o, b, _ := respPost(t, s, map[string]any{"model": "test-model", "input": fmt.Sprintf("prompt %d", i), "max_output_tokens": 40})
		byLength := o.Usage.OutputTokens == 40
		if byLength != (o.Status == "incomplete") || byLength != (o.IncompleteDetails != nil) {
			t.Fatalf("%d tokens of 40 with status %q: %s", o.Usage.OutputTokens, o.Status, b)
		}
		if !byLength {
			stops++
		}
	}
	if stops == 0 {
		t.Fatal("EOSRate 0.3 never stopped early in 10 requests of 40 tokens")
	}
}

func TestResponsesStreamEvents(t *testing.T) {
	s := startSim(t, nil)
	rk := s.ranks[0]
	rk.hold(true) // the engine takes no step: nothing is prefilled until released
	t.Cleanup(func() { rk.hold(false) })
	resp, ev := respStreamPost(t, s, map[string]any{"model": "test-model", "input": "stream this", "max_output_tokens": 10})
	created, inProgress := ev.must(), ev.must()
	if created.typ != "response.created" || inProgress.typ != "response.in_progress" {
		t.Fatalf("first events %s, %s", created.typ, inProgress.typ)
	}
	if l := s.Load(0); l.Running != 0 || l.Waiting != 1 || l.Steps != 0 {
		t.Fatalf("before the engine was released: %+v", l)
	}
	c0 := eventResponse(t, created)
	if c0.Status != "in_progress" || len(c0.Output) != 0 || c0.Usage != nil || c0.ID != resp.Header.Get("X-Request-Id") {
		t.Fatalf("response.created %s", created.data)
	}
	rk.hold(false)
	rest := ev.rest()
	var types []string
	for _, e := range rest {
		types = append(types, e.typ)
	}
	n := len(rest)
	if n < 6 || types[0] != "response.output_item.added" || types[1] != "response.content_part.added" ||
		types[n-4] != "response.output_text.done" || types[n-3] != "response.content_part.done" ||
		types[n-2] != "response.output_item.done" || types[n-1] != "response.completed" {
		t.Fatalf("event order %v", types)
	}
	item := rest[0].m["item"].(map[string]any)
	itemID := item["id"].(string)
	if item["status"] != "in_progress" || item["role"] != "assistant" || rest[1].m["item_id"] != itemID {
		t.Fatalf("item added %s / %s", rest[0].data, rest[1].data)
	}
	var deltas string
	for _, e := range rest[2 : n-4] {
		if e.typ != "response.output_text.delta" || e.m["item_id"] != itemID || e.m["output_index"] != 0.0 ||
			e.m["content_index"] != 0.0 || !reflect.DeepEqual(e.m["logprobs"], []any{}) {
			t.Fatalf("delta %s", e.data)
		}
		deltas += e.m["delta"].(string)
	}
	done := rest[n-4].m["text"]
	part := rest[n-3].m["part"].(map[string]any)["text"]
	itemText := rest[n-2].m["item"].(map[string]any)["content"].([]any)[0].(map[string]any)["text"]
	final := eventResponse(t, rest[n-1])
	if deltas == "" || done != deltas || part != deltas || itemText != deltas || final.outputText() != deltas {
		t.Fatalf("deltas %q, done %q, part %q, item %q, completed %q", deltas, done, part, itemText, final.outputText())
	}
	// The generation is the prompt's (seeded): the same request unstreamed
	// gives the same text, so no token was lost between deltas.
	if o, _, _ := respPost(t, s, map[string]any{"model": "test-model", "input": "stream this", "max_output_tokens": 10}); o.outputText() != deltas {
		t.Fatalf("streamed %q, unstreamed %q", deltas, o.outputText())
	}
	if final.ID != c0.ID || final.Status != "incomplete" || final.Output[0].ID != itemID || final.Usage == nil ||
		final.Usage.OutputTokens != 10 || final.Usage.InputTokens != tokenizeCount(t, s, []map[string]any{{"role": "user", "content": "stream this"}}) {
		t.Fatalf("response.completed %s", rest[n-1].data)
	}
}

// previous_response_id continues a stored conversation: the prompt is the
// earlier messages, the earlier answer and the new input, and its prefix
// is served from the cache.
func TestResponsesPreviousResponseID(t *testing.T) {
	s := startSim(t, func(c *Config) { c.ResponsesStore = true })
	r1, b1, _ := respPost(t, s, map[string]any{"model": "test-model", "input": "What is the capital of France?",
		"instructions": "Answer briefly.", "max_output_tokens": 8})
	turn1 := []map[string]any{{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "What is the capital of France?"}}
	if r1.Usage.InputTokens != tokenizeCount(t, s, turn1) {
		t.Fatalf("turn 1 input_tokens %d", r1.Usage.InputTokens)
	}
	// Turn 2, streamed, with a message item of content parts.
	_, ev := respStreamPost(t, s, map[string]any{"model": "test-model", "previous_response_id": r1.ID, "max_output_tokens": 6,
		"input": []any{map[string]any{"type": "message", "role": "user", "content": []any{map[string]any{"type": "input_text", "text": "And of Spain?"}}}}})
	events := ev.rest()
	r2ev := events[len(events)-1]
	r2 := eventResponse(t, r2ev)
	turn2 := append(append([]map[string]any{}, turn1...), map[string]any{"role": "assistant", "content": r1.outputText()},
		map[string]any{"role": "user", "content": "And of Spain?"})
	blockSize := s.Config().Engine.BlockSize
	if r2.PreviousResponseID == nil || *r2.PreviousResponseID != r1.ID || r2.Usage.InputTokens <= r1.Usage.InputTokens ||
		r2.Usage.InputTokens != tokenizeCount(t, s, turn2) ||
		r2.Usage.InputTokensDetails.CachedTokens < r1.Usage.InputTokens/blockSize*blockSize { // turn 1's whole prompt blocks
		t.Fatalf("turn 2 %s (turn 1 input_tokens %d)", r2ev.data, r1.Usage.InputTokens)
	}
	// Turn 3 chains on turn 2, which was stored from its stream.
	r3, _, _ := respPost(t, s, map[string]any{"model": "test-model", "previous_response_id": r2.ID, "input": "Thanks", "max_output_tokens": 2})
	turn3 := append(append([]map[string]any{}, turn2...), map[string]any{"role": "assistant", "content": r2.outputText()},
		map[string]any{"role": "user", "content": "Thanks"})
	if r3.Usage.InputTokens != tokenizeCount(t, s, turn3) || r3.Usage.InputTokensDetails.CachedTokens <= r2.Usage.InputTokensDetails.CachedTokens {
		t.Fatalf("turn 3 usage %+v (turn 2 %+v)", r3.Usage, r2.Usage)
	}
	// GET returns what was answered.
	for _, c := range []struct {
		id   string
		want []byte
	}{{r1.ID, b1}, {r2.ID, mustJSON(t, r2ev.m["response"])}} {
		resp, err := http.Get(s.URL() + "/v1/responses/" + c.id)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || !jsonEqual(t, got, c.want) {
			t.Fatalf("GET %s: %d %s, want %s", c.id, resp.StatusCode, got, c.want)
		}
	}
	// A finished response cannot be cancelled; unknown ids are 404s.
	code, b, _ := post(t, s.URL()+"/v1/responses/"+r1.ID+"/cancel", nil)
	if d, ok := openai.DecodeError(b); code != http.StatusBadRequest || !ok || d.Message != "Cannot cancel a synchronous response." || d.Type != "invalid_request_error" {
		t.Fatalf("cancel: %d %s", code, b)
	}
	checkNotFound(t, s, "resp_unknown")
	// store=false keeps nothing.
	r4, _, _ := respPost(t, s, map[string]any{"model": "test-model", "input": "x", "max_output_tokens": 1, "store": false})
	checkNotFound(t, s, r4.ID)
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func jsonEqual(t *testing.T, a, b []byte) bool {
	t.Helper()
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	return reflect.DeepEqual(x, y)
}

// checkNotFound checks that id is unknown to previous_response_id, GET and
// cancel, with vLLM's error.
func checkNotFound(t *testing.T, s *Server, id string) {
	t.Helper()
	want := "Response with id '" + id + "' not found."
	check := func(what string, code int, b []byte) {
		t.Helper()
		d, ok := openai.DecodeError(b)
		if code != http.StatusNotFound || !ok || d.Message != want || d.Type != "invalid_request_error" || string(d.Code) != "404" {
			t.Fatalf("%s %s: %d %s", what, id, code, b)
		}
	}
	code, b, _ := post(t, s.URL()+"/v1/responses", map[string]any{"model": "test-model", "input": "again", "previous_response_id": id})
	check("previous_response_id", code, b)
	resp, err := http.Get(s.URL() + "/v1/responses/" + id)
	if err != nil {
		t.Fatal(err)
	}
	b, _ = io.ReadAll(resp.Body)
	resp.Body.Close()
	check("GET", resp.StatusCode, b)
	code, b, _ = post(t, s.URL()+"/v1/responses/"+id+"/cancel", nil)
	check("cancel", code, b)
}

// Without --responses-store, store=true is silently ignored (vLLM's
// default): nothing can be continued or fetched.
func TestResponsesStoreOff(t *testing.T) {
	s := startSim(t, nil)
	o, _, _ := respPost(t, s, map[string]any{"model": "test-model", "input": "remember me", "max_output_tokens": 2, "store": true})
	checkNotFound(t, s, o.ID)
}

// request_id is the response id (and the engine request id).
func TestResponsesRequestID(t *testing.T) {
	s := startSim(t, func(c *Config) { c.ResponsesStore = true })
	o, _, hdr := respPost(t, s, map[string]any{"model": "test-model", "input": "x", "max_output_tokens": 2, "request_id": "resp_mine-1"})
	if o.ID != "resp_mine-1" || hdr.Get("X-Request-Id") != "resp_mine-1" {
		t.Fatalf("id %q, header %q", o.ID, hdr.Get("X-Request-Id"))
	}
	resp, err := http.Get(s.URL() + "/v1/responses/resp_mine-1")
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET by request_id: %v %v", resp, err)
	}
	resp.Body.Close()
	_, ev := respStreamPost(t, s, map[string]any{"model": "test-model", "input": "x", "max_output_tokens": 2, "request_id": "mine-2"})
	if r := eventResponse(t, ev.must()); r.ID != "mine-2" {
		t.Fatalf("streamed id %q", r.ID)
	}
	ev.rest()
}

// Function calls and their outputs become the chat messages vLLM makes of
// them; reasoning items add nothing.
func TestResponsesFunctionCallItems(t *testing.T) {
	s := startSim(t, nil)
	o, _, _ := respPost(t, s, map[string]any{"model": "test-model", "max_output_tokens": 2, "input": []any{
		map[string]any{"role": "user", "content": "weather in Paris?"},
		map[string]any{"type": "reasoning", "id": "rs_1", "summary": []any{}},
		map[string]any{"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": `{"city":"Paris"}`},
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
		map[string]any{"type": "message", "role": "assistant", "content": []any{map[string]any{"type": "output_text", "text": "It is sunny."}}},
	}})
	want := tokenizeCount(t, s, []map[string]any{
		{"role": "user", "content": "weather in Paris?"},
		{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "weather", "arguments": `{"city":"Paris"}`}}}},
		{"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
		{"role": "assistant", "content": "It is sunny."},
	})
	if o.Usage.InputTokens != want {
		t.Fatalf("input_tokens %d, want %d", o.Usage.InputTokens, want)
	}
}

// With a model's chat template, tool calls, tool messages and function
// tools reach the template as the chat endpoint passes them.
func TestResponsesTemplateWithTools(t *testing.T) {
	const src = `{%- for m in messages -%}<{{ m.role }}>{{ m.content }}` +
		`{%- if m.tool_calls -%}{%- for tc in m.tool_calls -%}[{{ tc.id }} {{ tc.function.name }} {{ tc.function.arguments | tojson }}]{%- endfor -%}{%- endif -%}` +
		`{%- if m.tool_call_id -%}(for {{ m.tool_call_id }}){%- endif -%}</{{ m.role }}>{%- endfor -%}` +
		`{%- if tools -%}TOOLS{{ tools | tojson }}{%- endif -%}{%- if add_generation_prompt -%}<assistant>{%- endif -%}`
	ct, err := tokenizer.NewChatTemplate(src, nil)
	if err != nil {
		t.Fatal(err)
	}
	s := startSim(t, func(c *Config) { c.Chat = TemplateChat{T: ct} })
	tool := map[string]any{"type": "function", "name": "weather", "description": "Weather of a city",
		"parameters": map[string]any{"type": "object", "properties": map[string]any{"city": map[string]any{"type": "string"}}}}
	input := []any{
		map[string]any{"role": "user", "content": "weather in Paris?"},
		map[string]any{"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": `{"city":"Paris"}`},
		map[string]any{"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
	}
	chatMsgs := []map[string]any{
		{"role": "user", "content": "weather in Paris?"},
		{"role": "assistant", "content": nil, "tool_calls": []any{map[string]any{"id": "call_1", "type": "function",
			"function": map[string]any{"name": "weather", "arguments": `{"city":"Paris"}`}}}},
		{"role": "tool", "content": "sunny", "tool_call_id": "call_1"},
	}
	chatTools := []any{map[string]any{"type": "function", "function": map[string]any{"name": "weather", "description": "Weather of a city",
		"parameters": tool["parameters"]}}}
	with, _, _ := respPost(t, s, map[string]any{"model": "test-model", "max_output_tokens": 1, "input": input,
		"tools": []any{tool, map[string]any{"type": "web_search_preview"}}})
	without, _, _ := respPost(t, s, map[string]any{"model": "test-model", "max_output_tokens": 1, "input": input})
	wantWith, wantWithout := tokenizeCount(t, s, chatMsgs, "tools", chatTools), tokenizeCount(t, s, chatMsgs)
	if with.Usage.InputTokens != wantWith || without.Usage.InputTokens != wantWithout || wantWith == wantWithout {
		t.Fatalf("input_tokens %d and %d, want %d and %d", with.Usage.InputTokens, without.Usage.InputTokens, wantWith, wantWithout)
	}
	if !strings.Contains(string(with.Tools), "web_search_preview") {
		t.Fatalf("tools not echoed as sent: %s", with.Tools)
	}
}

func TestResponsesMalformedRequests(t *testing.T) {
	s := startSim(t, nil)
	cases := []struct {
		body any
		code int
		msg  string
	}{
		{map[string]any{"model": 5, "input": "x"}, 400, "model: expected a string"},
		{map[string]any{"model": "other", "input": "x"}, 404, "does not exist"},
		{map[string]any{"model": "test-model"}, 400, "input: required"},
		{map[string]any{"model": "test-model", "input": nil}, 400, "input: required"},
		{map[string]any{"model": "test-model", "input": 5}, 400, "input: must be a string or an array"},
		{map[string]any{"model": "test-model", "input": []any{}}, 400, "input: has no messages"},
		{map[string]any{"model": "test-model", "input": []any{"hi"}}, 400, "input[0]: must be an object"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"content": "hi"}}}, 400, "input[0].role: required"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"role": 1, "content": "hi"}}}, 400, "input[0].role: required"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"role": "tool", "content": "hi"}}}, 400, `input[0].role "tool"`},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"role": "user", "content": 5}}}, 400, "input[0].content: must be a string or an array"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"role": "user", "content": []any{"x"}}}}, 400, "input[0].content[0]: must be an object"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"role": "user", "content": []any{map[string]any{"type": "input_text", "text": 1}}}}}, 400, "a text part needs a string text"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"type": "function_call", "call_id": "c", "arguments": "{}"}}}, 400, "a function_call needs string call_id, name and arguments"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"type": "function_call_output", "call_id": "c", "output": []any{}}}}, 400, "a function_call_output needs string call_id and output"},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"type": "computer_call", "role": "user"}}}, 400, `input[0].type "computer_call" is not supported`},
		{map[string]any{"model": "test-model", "input": []any{map[string]any{"type": 7, "role": "user"}}}, 400, "input[0].type: must be a string"},
		{map[string]any{"model": "test-model", "input": "x", "max_output_tokens": 0}, 400, "max_output_tokens 0: must be at least 1"},
		{map[string]any{"model": "test-model", "input": "x", "max_output_tokens": "many"}, 400, "max_output_tokens: expected an integer, got string"},
		{map[string]any{"model": "test-model", "input": "x", "instructions": 5}, 400, "instructions: expected a string, got number"},
		{map[string]any{"model": "test-model", "input": "x", "previous_response_id": 5}, 400, "previous_response_id: expected a string"},
		{map[string]any{"model": "test-model", "input": "x", "stream": "maybe"}, 400, "stream: expected a boolean"},
		{map[string]any{"model": "test-model", "input": "x", "temperature": -1}, 400, "temperature: must not be negative"},
		{map[string]any{"model": "test-model", "input": "x", "top_p": 0}, 400, "top_p: must be in (0, 1]"},
		{map[string]any{"model": "test-model", "input": "x", "request_id": ""}, 400, "request_id: must not be empty"},
		{map[string]any{"model": "test-model", "input": "x", "prompt": map[string]any{"id": "p"}}, 400, "prompt template is not supported"},
		{map[string]any{"model": "test-model", "input": "x", "tools": "all"}, 400, "tools: must be an array"},
		{map[string]any{"model": "test-model", "input": "x", "tools": []any{1}}, 400, "tools[0]: must be an object"},
		{map[string]any{"model": "test-model", "input": "x", "background": true}, 400, "does not support the background mode"},
		{map[string]any{"model": "test-model", "input": "x", "background": true, "store": false}, 400, "background can only be used when `store` is true"},
		{map[string]any{"model": "test-model", "input": "x", "metadata": []any{}}, 400, "metadata: must be an object"},
		{"a string", 400, "decode body: expected an object, got string"},
	}
	for _, c := range cases {
		code, b, _ := post(t, s.URL()+"/v1/responses", c.body)
		d, ok := openai.DecodeError(b)
		if code != c.code || !ok || !strings.Contains(d.Message, c.msg) || d.Type == "" {
			t.Errorf("%v: %d %s, want %d with %q", c.body, code, b, c.code, c.msg)
		}
	}
	for raw, msg := range map[string]string{
		`{not json`:                             "decode body",
		`{"model":"test-model","input":"x"} {}`: "trailing data",
		`{"model":"test-model","input":"x"}}`:   "trailing data",
		``:                                      "decode body",
	} {
		resp, err := http.Post(s.URL()+"/v1/responses", "application/json", strings.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if d, ok := openai.DecodeError(b); resp.StatusCode != http.StatusBadRequest || !ok || !strings.Contains(d.Message, msg) {
			t.Errorf("%q: %d %s", raw, resp.StatusCode, b)
		}
	}
}

// An engine restart mid-stream ends the stream with an error event; a
// client that goes away aborts the engine request.
func TestResponsesStreamRestartAndDisconnect(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 })
	body := func() map[string]any {
		return map[string]any{"model": "test-model", "input": "a long answer", "max_output_tokens": 500}
	}
	last := streamRestartAndDisconnect(t, s, func() (*http.Response, *sseEvents) { return respStreamPost(t, s, body()) }, "response.output_text.delta")
	if last.typ != "error" || last.m["code"] == nil || last.m["message"] != "request aborted: engine restarted" ||
		last.m["param"] != nil || !hasKey(last.m, "param") {
		t.Fatalf("last event %s %s", last.typ, last.data)
	}
}

func hasKey(m map[string]any, k string) bool { _, ok := m[k]; return ok }

// The store keeps the newest responses and evicts the oldest first.
func TestResponseStoreBound(t *testing.T) {
	st := newResponseStore(3)
	put := func(id string) { st.put(&storedResponse{resp: &responseObject{ID: id}}) }
	for _, id := range []string{"a", "b", "c", "b", "d", "e"} {
		put(id)
	}
	for id, want := range map[string]bool{"a": false, "b": false, "c": true, "d": true, "e": true} {
		if got := st.get(id) != nil; got != want {
			t.Errorf("%s stored %v, want %v", id, got, want)
		}
	}
	if len(st.byID) != 3 {
		t.Fatalf("%d stored", len(st.byID))
	}
	var nilStore *responseStore
	nilStore.put(&storedResponse{resp: &responseObject{ID: "x"}})
	if nilStore.get("x") != nil {
		t.Fatal("a disabled store returned a response")
	}
}
