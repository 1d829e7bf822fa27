package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

func TestPromptShapes(t *testing.T) {
	cases := []struct {
		in   string
		want Prompt
	}{
		{`"hello"`, Prompt{Texts: []string{"hello"}}},
		{`["a","b"]`, Prompt{Texts: []string{"a", "b"}, List: true}},
		{`[1,2,4294967295]`, Prompt{Tokens: [][]uint32{{1, 2, 4294967295}}}},
		{`[[1,2],[3]]`, Prompt{Tokens: [][]uint32{{1, 2}, {3}}, List: true}},
	}
	for _, c := range cases {
		var p Prompt
		if err := json.Unmarshal([]byte(c.in), &p); err != nil {
			t.Fatalf("%s: %v", c.in, err)
		}
		if !reflect.DeepEqual(p, c.want) {
			t.Fatalf("%s: got %+v want %+v", c.in, p, c.want)
		}
		out, err := json.Marshal(p)
		if err != nil || string(out) != c.in {
			t.Fatalf("%s: re-encoded as %s (%v)", c.in, out, err)
		}
	}
	for _, bad := range []string{`null`, `5`, `[]`, `[1,"a"]`, `["a",1]`, `[-1]`, `[4294967296]`, `[1.5]`, `[[]]`, `[[1],"a"]`, `{}`} {
		var p Prompt
		if err := json.Unmarshal([]byte(bad), &p); err == nil {
			t.Errorf("%s: accepted as %+v", bad, p)
		} else if !errors.Is(err, ErrBadRequest) {
			t.Errorf("%s: error %v does not wrap ErrBadRequest", bad, err)
		}
	}
}

func TestDecodeCompletionRequest(t *testing.T) {
	body := `{"model":"m","prompt":[1,2,3],"max_tokens":5,"min_tokens":2,"ignore_eos":true,"stream":true,
		"stream_options":{"include_usage":true},"cache_salt":"s","unknown_field":{"x":1}}`
	r, err := DecodeCompletionRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Model != "m" || r.MaxOutput() != 5 || r.MinTokens != 2 || !r.IgnoreEOS || !bool(r.Stream) || !r.IncludeUsage() || r.CacheSalt != "s" {
		t.Fatalf("decoded %+v", r)
	}
	if !reflect.DeepEqual(r.Prompt.Tokens, [][]uint32{{1, 2, 3}}) {
		t.Fatalf("prompt %+v", r.Prompt)
	}
	bad := map[string]string{
		`{"model":"m"}`: "prompt",
		`{"model":"m","prompt":"x","max_tokens":0}`:                          "max_tokens",
		`{"model":"m","prompt":"x","max_tokens":2,"min_tokens":3}`:           "min_tokens",
		`{"model":"m","prompt":"x","stream_options":{"include_usage":true}}`: "stream_options",
		`{"model":"m","prompt":"x","n":0}`:                                   "n 0: must be at least 1",
		`{"model":"m","prompt":"x","n":257}`:                                 "n 257: the simulator samples at most 256",
		`{"model":"m","prompt":"x"} {}`:                                      "trailing",
		`{"model":"m","prompt":"x"}}`:                                        "trailing",
		`{"model":"m","prompt":[1,-2]}`:                                      "token id",
		`{"model":1,"prompt":"x"}`:                                           "model",
		`not json`:                                                           "invalid",
	}
	for b, want := range bad {
		_, err := DecodeCompletionRequest([]byte(b))
		if err == nil || !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: error %v, want ErrBadRequest mentioning %q", b, err, want)
		}
	}
	// A model is optional, as in vLLM (the server's own); every problem is
	// listed at once.
	if _, err := DecodeCompletionRequest([]byte(`{"prompt":"x"}`)); err != nil {
		t.Errorf("no model: %v", err)
	}
	if _, err := DecodeCompletionRequest([]byte(`{"prompt":"x","n":1}`)); err != nil {
		t.Errorf("n 1: %v", err)
	}
	_, err = DecodeCompletionRequest([]byte(`{"max_tokens":0}`))
	for _, w := range []string{"prompt", "max_tokens"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("error %v does not list %q", err, w)
		}
	}
}

func TestDecodeChatRequest(t *testing.T) {
	body := `{"model":"m","messages":[{"role":"system","content":"be brief"},
		{"role":"user","content":[{"type":"text","text":"hi "},{"type":"image_url"},{"type":"text","text":"there"}]},
		{"role":"assistant","content":null}],"max_completion_tokens":7,"max_tokens":3}`
	r, err := DecodeChatRequest([]byte(body))
	if err != nil {
		t.Fatal(err)
	}
	if r.Messages[1].Content.Text != "hi there" || !r.Messages[2].Content.Null || r.MaxOutput() != 7 {
		t.Fatalf("decoded %+v", r)
	}
	// A role of the client's own is vLLM's CustomChatCompletionMessageParam:
	// taken, the template decides; a message without one is refused.
	if r, err := DecodeChatRequest([]byte(`{"model":"m","messages":[{"role":"wizard","content":"x"}]}`)); err != nil || r.Messages[0].Role != "wizard" {
		t.Fatalf("a custom role refused: %v", err)
	}
	if _, err := DecodeChatRequest([]byte(`{"model":"m","messages":[{"content":"x"}]}`)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("a message without a role accepted: %v", err)
	}
	if _, err := DecodeChatRequest([]byte(`{"model":"m","messages":[{"role":"user","content":5}]}`)); !errors.Is(err, ErrBadRequest) {
		t.Fatalf("numeric content accepted: %v", err)
	}
}

func TestAppendStringMatchesEncodingJSON(t *testing.T) {
	for _, s := range []string{"", "plain", "quote\" back\\slash", "ctl\x00\x01\x1f\n\r\t", "ünïcödé 日本", "bad\xffutf8", "\u2028\u2029", "<html>&"} {
		got := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(got, &back); err != nil {
			t.Fatalf("%q: %s is not JSON: %v", s, got, err)
		}
		want := strings.ToValidUTF8(s, "\ufffd")
		if back != want {
			t.Fatalf("%q: round trip %q", s, back)
		}
	}
}

func TestChunkAppendersDecodeIntoTypes(t *testing.T) {
	f := &ChunkFields{ID: "cmpl-1", Created: 42, Model: "m\"x"}
	var c Completion
	if err := json.Unmarshal(AppendCompletionChunk(nil, f, "tok\n", ""), &c); err != nil {
		t.Fatal(err)
	}
	if c.ID != "cmpl-1" || c.Object != ObjectCompletion || c.Model != "m\"x" || c.Choices[0].Text != "tok\n" || c.Choices[0].FinishReason != nil || c.Usage != nil {
		t.Fatalf("chunk %+v", c)
	}
	if err := json.Unmarshal(AppendCompletionChunk(nil, f, "", FinishLength), &c); err != nil || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("final chunk %+v %v", c, err)
	}
	var cc ChatCompletionChunk
	empty := ""
	if err := json.Unmarshal(AppendChatChunk(nil, f, "assistant", &empty, ""), &cc); err != nil {
		t.Fatal(err)
	}
	if cc.Object != ObjectChatChunk || cc.Choices[0].Delta.Role != "assistant" || cc.Choices[0].Delta.Content == nil || *cc.Choices[0].Delta.Content != "" {
		t.Fatalf("first chat chunk %+v", cc)
	}
	u := &Usage{PromptTokens: 10, CompletionTokens: 3, TotalTokens: 13, PromptTokensDetails: &PromptTokensDetails{CachedTokens: 8}}
	var uc Completion
	if err := json.Unmarshal(AppendUsageChunk(nil, f, ObjectCompletion, u), &uc); err != nil {
		t.Fatal(err)
	}
	if len(uc.Choices) != 0 || uc.Choices == nil || !reflect.DeepEqual(uc.Usage, u) || uc.Usage.CachedTokens() != 8 {
		t.Fatalf("usage chunk %+v", uc)
	}
}

func TestAppendError(t *testing.T) {
	var r ErrorResponse
	if err := json.Unmarshal(AppendStatusError(nil, 404, `model "x" not found`), &r); err != nil {
		t.Fatal(err)
	}
	if r.Error.Message != `model "x" not found` || r.Error.Type != TypeNotFound || r.Error.Param != nil || string(r.Error.Code) != "404" {
		t.Fatalf("%+v", r)
	}
	b := AppendError(nil, "slow down", TypeRateLimit, "model", "rate_limit")
	d, ok := DecodeError(b)
	if !ok || *d.Param != "model" || string(d.Code) != `"rate_limit"` {
		t.Fatalf("%s → %+v %v", b, d, ok)
	}
	if _, ok := DecodeError([]byte(`{"id":"x","choices":[]}`)); ok {
		t.Fatal("a chunk decoded as an error")
	}
}

func TestSSEWriterReaderRoundTrip(t *testing.T) {
	var buf bytes.Buffer
	w := NewSSEWriter(&buf)
	payloads := []string{`{"a":1}`, `{"b":"x y"}`, `[]`}
	for _, p := range payloads {
		if err := w.Data([]byte(p)); err != nil {
			t.Fatal(err)
		}
	}
	if err := w.Data([]byte("a\nb")); !errors.Is(err, ErrBadStream) {
		t.Fatal("line break in payload accepted")
	}
	if err := w.Done(); err != nil {
		t.Fatal(err)
	}
	var got []string
	if err := ReadAll(&buf, func(p []byte) error { got = append(got, string(p)); return nil }); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, payloads) {
		t.Fatalf("got %v", got)
	}
}

func TestSSEReaderStrictness(t *testing.T) {
	good := []string{
		"data: {}\n\ndata: [DONE]\n\n",
		"data: {}\r\n\r\ndata: [DONE]\r\n\r\n",
		": keep-alive\ndata: {}\n\n: ping\ndata: [DONE]\n\n",
		"data: [DONE]\n\n",
	}
	for _, s := range good {
		if err := ReadAll(strings.NewReader(s), func([]byte) error { return nil }); err != nil {
			t.Errorf("%q: %v", s, err)
		}
	}
	bad := []string{
		"",                              // no [DONE]
		"data: {}\n\n",                  // truncated: no [DONE]
		"data: {}\n",                    // ends inside the event
		"data: {}",                      // ends inside a line
		"data:{}\n\ndata: [DONE]\n\n",   // no space
		"data:  {}\n\ndata: [DONE]\n\n", // payload " {}" is fine JSON? no: leading space kept and still valid → see below
		"event: x\ndata: {}\n\ndata: [DONE]\n\n",
		"id: 1\n\ndata: [DONE]\n\n",
		"data: {}\ndata: {}\n\ndata: [DONE]\n\n", // multi-line event
		"\ndata: [DONE]\n\n",                     // blank line outside an event
		"data: \n\ndata: [DONE]\n\n",             // empty payload
		"data: {\n\ndata: [DONE]\n\n",            // not JSON
		"data: {}\r\rdata: [DONE]\n\n",           // bare CR
		"data: [DONE]\n\ndata: {}\n\n",           // after [DONE]
		"data: [DONE]\n\n\n",                     // trailing garbage
	}
	for _, s := range bad {
		err := ReadAll(strings.NewReader(s), func([]byte) error { return nil })
		if s == "data:  {}\n\ndata: [DONE]\n\n" {
			// " {}" is valid JSON; vLLM never writes it, but it is not malformed SSE.
			continue
		}
		if err == nil || !errors.Is(err, ErrBadStream) {
			t.Errorf("%q: err %v, want ErrBadStream", s, err)
		}
	}
	// An over-long line is rejected without reading it all into memory first.
	long := "data: \"" + strings.Repeat("x", MaxEventBytes) + "\"\n\ndata: [DONE]\n\n"
	if err := ReadAll(strings.NewReader(long), func([]byte) error { return nil }); !errors.Is(err, ErrBadStream) {
		t.Errorf("long line: %v", err)
	}
	// Next after the end keeps returning io.EOF.
	r := NewSSEReader(strings.NewReader("data: [DONE]\n\n"))
	for i := 0; i < 2; i++ {
		if _, err := r.Next(); err != io.EOF {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}

func BenchmarkAppendCompletionChunk(b *testing.B) {
	f := &ChunkFields{ID: "cmpl-0123456789", Created: 1700000000, Model: "meta-llama/Llama-3-8B"}
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		buf = AppendEvent(buf[:0], AppendCompletionChunk(buf[256:256], f, " token", ""))
	}
}

func BenchmarkSSEReader(b *testing.B) {
	f := &ChunkFields{ID: "cmpl-1", Created: 1, Model: "m"}
	var stream []byte
	for i := 0; i < 100; i++ {
		stream = AppendEvent(stream, AppendCompletionChunk(nil, f, " tok", ""))
	}
	stream = AppendDone(stream)
	rd := bytes.NewReader(stream)
	b.ReportAllocs()
	b.SetBytes(int64(len(stream)))
	for i := 0; i < b.N; i++ {
		rd.Reset(stream)
		if err := ReadAll(rd, func([]byte) error { return nil }); err != nil {
			b.Fatal(err)
		}
	}
}

// A decoded request re-encodes (e.g. by a router replacing the prompt with
// token ids) into a body that decodes to the same request.
func TestRequestsRoundTrip(t *testing.T) {
	in := `{"model":"m","prompt":"hi","max_tokens":4,"min_tokens":1,"ignore_eos":true,"stream":true,` +
		`"stream_options":{"include_usage":true},"cache_salt":"s","stop":["x"],"temperature":0.5}`
	r, err := DecodeCompletionRequest([]byte(in))
	if err != nil {
		t.Fatal(err)
	}
	r.Prompt = TokenPrompt([]uint32{1, 2, 3})
	b, err := json.Marshal(r)
	if err != nil {
		t.Fatal(err)
	}
	r2, err := DecodeCompletionRequest(b)
	if err != nil || !reflect.DeepEqual(r, r2) {
		t.Fatalf("round trip %s:\n%+v\n%+v (%v)", b, r, r2, err)
	}
	if !strings.Contains(string(b), `"prompt":[1,2,3]`) {
		t.Fatalf("prompt not a flat id list: %s", b)
	}
	cin := `{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":[{"type":"text","text":"b"}]},{"role":"assistant","content":null}],"max_completion_tokens":3}`
	c, err := DecodeChatRequest([]byte(cin))
	if err != nil {
		t.Fatal(err)
	}
	b, err = json.Marshal(c)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := DecodeChatRequest(b)
	if err != nil || !reflect.DeepEqual(c, c2) {
		t.Fatalf("chat round trip %s: %v", b, err)
	}
}

// A wrongly typed field is reported by its JSON path and JSON type, not by
// Go struct field or Go type names.
func TestTypeErrorsNameJSONFields(t *testing.T) {
	for body, want := range map[string]string{
		`{"model":"m","messages":[{"role":1,"content":"x"}]}`:                       "messages.role: expected a string, got number",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"n":"2"}`:          "n: expected an integer, got string",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":2}`:       "stream: expected a boolean, got number",
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stream":"maybe"}`: "stream: expected a boolean, got string",
	} {
		_, err := DecodeChatRequest([]byte(body))
		if err == nil || !strings.Contains(err.Error(), want) || strings.Contains(err.Error(), "Go ") || strings.Contains(err.Error(), "ChatRequest") {
			t.Errorf("%s: %v, want %q", body, err, want)
		}
	}
}

func TestResponsesSSEReader(t *testing.T) {
	for _, c := range []struct {
		in   string
		want int // payloads; -1: rejected
	}{
		{"event: response.created\ndata: {\"a\":1}\n\nevent: response.completed\ndata: {}\n\n", 2},
		{"data: {}\r\n\r\nevent: x\r\ndata: [1]\r\n\r\n", 2},
		{": keep-alive\nevent: x\ndata: {}\n\n", 1},
		{"event: x\ndata: {}\n\ndata: [DONE]\n\n", 1},
		{"", -1},
		{"event: x\n\n", -1},
		{"event: x\nevent: y\ndata: {}\n\n", -1},
		{"event: x\ndata: {}\n", -1},
		{"event: x\ndata: {}\n\nevent: y\n", -1},
		{"id: 1\ndata: {}\n\n", -1},
	} {
		n := 0
		err := ReadAllResponses(strings.NewReader(c.in), func([]byte) error { n++; return nil })
		if (err != nil) != (c.want < 0) || (err == nil && n != c.want) || (err != nil && !errors.Is(err, ErrBadStream)) {
			t.Errorf("%q: %d payloads, err %v; want %d", c.in, n, err, c.want)
		}
	}
	// The plain form still refuses event lines and a missing [DONE].
	if err := ReadAll(strings.NewReader("event: x\ndata: {}\n\n"), func([]byte) error { return nil }); !errors.Is(err, ErrBadStream) {
		t.Errorf("plain reader accepted an event line: %v", err)
	}
}
