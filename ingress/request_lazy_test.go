package ingress

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// benchChatBody is a two-message chat like the endpoint picker's benchmark:
// a ~600-word system prompt (with escapes) and a short question.
func benchChatBody() []byte {
	var sys strings.Builder
	for i := range 600 {
		if i%50 == 49 {
			sys.WriteString(`\n`)
		}
		sys.WriteString("word ")
	}
	return []byte(`{"model":"m","messages":[{"role":"system","content":"` + sys.String() +
		`"},{"role":"user","content":"what now?"}],"max_tokens":3,"stream":true}`)
}

// BenchmarkParseChatRequest is the request parse of a chat body alone (no
// consumer of the flattened messages: the renderer reads the raw JSON).
func BenchmarkParseChatRequest(b *testing.B) {
	body := benchChatBody()
	var r request
	b.ReportAllocs()
	b.SetBytes(int64(len(body)))
	for b.Loop() {
		r.reset()
		if err := parseRequest(&r, epChat, body); err != nil {
			b.Fatal(err)
		}
	}
}

// eagerParseMessages is parseMessages as it was before the flattening
// became lazy (verbatim but for the names): the reference the lazy
// validation and chatMessages must agree with.
func eagerParseMessages(r *request) error {
	r.chat = r.chat[:0]
	i := 0
	err := jsonscan.ForEachElem(r.messages, func(m []byte) error {
		if m[0] != '{' {
			return badRequest(fmt.Sprintf("messages[%d]", i), fmt.Errorf("%w: messages[%d] must be an object", ErrBadRequest, i))
		}
		var msg Message
		var err error
		sawRole := false
		if ferr := jsonscan.ForEachMember(m, func(k, v []byte, _, _ int) error {
			switch string(k) {
			case "role":
				if v[0] != '"' {
					return badRequest(fmt.Sprintf("messages[%d].role", i), fmt.Errorf("%w: messages[%d].role must be a string", ErrBadRequest, i))
				}
				msg.Role, sawRole = string(jsonscan.AppendUnquote(nil, v)), true
			case "content":
				msg.Content, err = eagerContentText(v, i)
			}
			return err
		}); ferr != nil {
			return ferr
		}
		if !sawRole || msg.Role == "" {
			return badRequest(fmt.Sprintf("messages[%d].role", i), fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, i))
		}
		r.chat = append(r.chat, msg)
		i++
		return nil
	})
	var ae *apiError
	if errors.As(err, &ae) {
		return err
	}
	if err != nil {
		return badRequest("messages", fmt.Errorf("%w: messages: %w", ErrBadRequest, err))
	}
	if len(r.chat) == 0 {
		return badRequest("messages", fmt.Errorf("%w: messages must not be empty", ErrBadRequest))
	}
	return nil
}

// contentText flattens a message's content (string, parts or null) to its
// text parts; whether the other parts are acceptable is the renderer's call.
func eagerContentText(v []byte, i int) (string, error) {
	param := fmt.Sprintf("messages[%d].content", i)
	switch v[0] {
	case 'n':
		return "", nil
	case '"':
		return string(jsonscan.AppendUnquote(nil, v)), nil
	case '[':
	default:
		return "", badRequest(param, fmt.Errorf("%w: %s must be a string, an array of content parts or null", ErrBadRequest, param))
	}
	var text []byte
	j := 0
	err := jsonscan.ForEachElem(v, func(p []byte) error {
		defer func() { j++ }()
		if p[0] != '{' {
			return badRequest(param, fmt.Errorf("%w: %s[%d] must be an object", ErrBadRequest, param, j))
		}
		var typ, t []byte
		_ = jsonscan.ForEachMember(p, func(k, pv []byte, _, _ int) error {
			switch string(k) {
			case "type":
				typ = pv
			case "text":
				t = pv
			}
			return nil
		})
		if string(typ) == `"text"` && len(t) > 0 && t[0] == '"' {
			text = jsonscan.AppendUnquote(text, t)
		}
		return nil
	})
	return string(text), err
}

// lazyVsEager parses body as chat and checks that the lazy validation gives
// what the eager parse gave for its messages: the same error (message and
// API error), or no error and the same flattened messages.
func lazyVsEager(t *testing.T, body []byte) {
	t.Helper()
	var lazy request
	perr := parseRequest(&lazy, epChat, body)
	if lazy.kind != promptChat {
		return // no messages array: the messages code never ran
	}
	lerr := lazy.checkMessages()
	if perr == nil && lerr != nil {
		t.Fatalf("body %q: parseRequest passed but checkMessages says %v", body, lerr)
	}
	eager := request{messages: lazy.messages}
	eerr := eagerParseMessages(&eager)
	if (lerr == nil) != (eerr == nil) {
		t.Fatalf("body %q: lazy err %v, eager err %v", body, lerr, eerr)
	}
	if lerr != nil {
		var la, ea *apiError
		if lerr.Error() != eerr.Error() || !errors.As(lerr, &la) || !errors.As(eerr, &ea) ||
			la.status != ea.status || la.typ != ea.typ || la.code != ea.code || la.param != ea.param || la.msg != ea.msg {
			t.Fatalf("body %q: lazy err %q %+v, eager err %q %+v", body, lerr, la, eerr, ea)
		}
		return
	}
	got := lazy.chatMessages()
	if !reflect.DeepEqual(got, eager.chat) {
		t.Fatalf("body %q: lazy messages %+v, eager %+v", body, got, eager.chat)
	}
	if again := lazy.chatMessages(); len(again) != len(got) || &again[0] != &got[0] {
		t.Fatalf("body %q: a second chatMessages call rebuilt the messages", body)
	}
}

var lazyChatBodies = []string{
	// string content, with escapes
	`{"model":"m","messages":[{"role":"system","content":"be \"brief\"\n\u00e9"},{"role":"user","content":"hi"}]}`,
	// content parts: text, image, text; a part with text but no type; a part with a non-string text
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}},{"text":"no type"},{"type":"text","text":3},{"type":"text","text":"b\tc"}]}]}`,
	// null and missing content
	`{"model":"m","messages":[{"role":"user","content":null},{"role":"assistant"}]}`,
	// tool calls and a tool answer
	`{"model":"m","messages":[{"role":"user","content":"weather?"},{"role":"assistant","content":null,"tool_calls":[{"id":"c1","type":"function","function":{"name":"w","arguments":"{\"city\":\"Oslo\"}"}}]},{"role":"tool","tool_call_id":"c1","content":"sunny"}]}`,
	// duplicate members: the last wins
	`{"model":"m","messages":[{"role":"","role":"user","content":"a","content":"b"}]}`,
	// an escaped role; an escaped key (ignored as the eager code ignored it)
	`{"model":"m","messages":[{"role":"\u0075ser","content":"x"},{"r\u006fle":"user","role":"tool","content":[]}]}`,
	// empty content parts, whitespace everywhere
	`{"model":"m","messages": [ { "role" : "user" , "content" : [ ] } ] }`,
	// errors
	`{"model":"m","messages":[]}`,
	`{"model":"m","messages":[1]}`,
	`{"model":"m","messages":[{"role":"user"},"x"]}`,
	`{"model":"m","messages":[{"content":"x"}]}`,
	`{"model":"m","messages":[{"role":"","content":"x"}]}`,
	`{"model":"m","messages":[{"role":"user","role":""}]}`,
	`{"model":"m","messages":[{"role":3,"content":"x"}]}`,
	`{"model":"m","messages":[{"role":"user","content":3}]}`,
	`{"model":"m","messages":[{"role":"user","content":{"text":"x"}}]}`,
	`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"a"},"b"]}]}`,
	`{"model":"m","messages":[{"content":5,"role":4}]}`,
	`{"model":"m","messages":[{"role":"user","content":"ok"},{"role":"user","content":[{},[]]}]}`,
	`{"model":"m","messages":[{"role":"user","content":"a","content":true}]}`,
	`{"model":"m","messages":[{"role":"user","content":false}]}`,
}

func TestChatMessagesLazyEqualsEager(t *testing.T) {
	for _, b := range lazyChatBodies {
		lazyVsEager(t, []byte(b))
	}
	// The benchmark's body too.
	lazyVsEager(t, benchChatBody())
}

// TestChatMessagesAfterReset: a pooled request flattens its own messages,
// not the previous request's.
func TestChatMessagesAfterReset(t *testing.T) {
	var r request
	if err := parseRequest(&r, epChat, []byte(`{"model":"m","messages":[{"role":"user","content":"one"}]}`)); err != nil {
		t.Fatal(err)
	}
	if m := r.chatMessages(); len(m) != 1 || m[0].Content != "one" {
		t.Fatalf("got %+v", m)
	}
	r.reset()
	if err := parseRequest(&r, epChat, []byte(`{"model":"m","messages":[{"role":"user","content":"two"},{"role":"assistant","content":[{"type":"text","text":"three"}]}]}`)); err != nil {
		t.Fatal(err)
	}
	if m := r.chatMessages(); len(m) != 2 || m[0].Content != "two" || m[1] != (Message{Role: "assistant", Content: "three"}) {
		t.Fatalf("got %+v", m)
	}
}

func FuzzChatMessagesLazyEqualsEager(f *testing.F) {
	for _, b := range lazyChatBodies {
		f.Add([]byte(b))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		lazyVsEager(t, body)
	})
}
