package ingress

import (
	"bytes"
	"fmt"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// Anthropic's Messages API (POST /v1/messages), as vLLM serves it
// (vllm/entrypoints/anthropic): Anthropic clients (the Anthropic SDKs,
// Claude Code) point at a vLLM server with it. vLLM converts the request to
// a chat request and renders that with the model's template, so the ingress
// builds the same chat messages to key the prompt's blocks, and forwards the
// request as it came. A stream is named events (message_start after the
// prefill, content_block_*, message_delta with the usage, message_stop), no
// [DONE].

// messagesMember reads a Messages API member.
func (r *request) messagesMember(key, val []byte) error {
	switch string(key) {
	case "messages":
		if val[0] != '[' {
			return badRequest("messages", fmt.Errorf("%w: messages must be an array", ErrBadRequest))
		}
		r.input = val
	case "system":
		if val[0] != '"' && val[0] != '[' && val[0] != 'n' {
			return badRequest("system", fmt.Errorf("%w: system must be a string or an array of text blocks", ErrBadRequest))
		}
		r.instructions = val
	case "tools", "tool_choice":
		return r.responsesMember(key, val, 0, 0) // kept as the Responses API's, converted by finishMessages
	case "chat_template_kwargs":
		return r.chatMember(key, val, 0, 0)
	}
	return nil
}

// billingHeader starts the per-request attribution text Claude Code puts
// in the system prompt; vLLM drops it, as it would defeat prefix caching.
var billingHeader = []byte("x-anthropic-billing-header")

// finishMessages checks a Messages request and builds the chat messages
// (and tools) vLLM renders for it into r.synth, which r.messages and r.tools
// then point into (vLLM's _convert_anthropic_to_openai_request):
//   - the system prompt (a string, or text blocks joined with "") and the
//     messages with role system, joined, become one leading system message;
//   - string content stays a string; blocks become chat parts: text, image
//     (source url, or base64 as a data URL) as image_url, thinking as the
//     message's reasoning, tool_use as a tool call, tool_result (in a user
//     message) as a tool message before the rest of the message, with its
//     images in a user message after it; a single text part becomes the
//     content string; a user message left with nothing is dropped;
//   - tools ({name, description, input_schema, defer_loading}) become
//     function tools.
func (r *request) finishMessages() error {
	if len(r.input) == 0 {
		return badRequest("messages", fmt.Errorf("%w: messages is required", ErrBadRequest))
	}
	if r.maxTokens < 0 {
		return badRequest("max_tokens", fmt.Errorf("%w: max_tokens is required", ErrBadRequest))
	}
	m := msgBuilder{b: append(r.synth[:0], '[')}
	sys, err := m.system(r.instructions, r.input)
	if err != nil {
		return err
	}
	if len(sys) > 0 {
		m.open()
		m.b = append(m.b, `{"role":"system","content":`...)
		m.b = openai.AppendString(m.b, string(sys))
		m.b = append(m.b, '}')
	}
	i := 0
	err = jsonscan.ForEachElem(r.input, func(msg []byte) error {
		err := m.message(msg, i)
		i++
		return err
	})
	if err != nil {
		return messagesError(err)
	}
	if m.n == 0 {
		return badRequest("messages", fmt.Errorf("%w: messages has no message to render", ErrBadRequest))
	}
	m.b = append(m.b, ']')
	msgEnd := len(m.b)
	if len(r.respTools) > 0 && r.respTools[0] == '[' {
		if m.b, err = appendAnthropicTools(m.b, r.respTools); err != nil {
			return badRequest("tools", fmt.Errorf("%w: tools: %w", ErrBadRequest, err))
		}
		r.tools = m.b[msgEnd:]
	}
	r.synth = m.b
	r.messages = m.b[:msgEnd]
	r.kind = promptChat
	return r.checkMessages()
}

// msgBuilder appends chat messages to b, n of them so far.
type msgBuilder struct {
	b       []byte
	n       int
	scratch []byte
}

// open starts the next message (a comma after the first).
func (m *msgBuilder) open() {
	if m.n > 0 {
		m.b = append(m.b, ',')
	}
	m.n++
}

// system returns the joined system text: the system member's, then each
// system message's (text blocks joined with "", billing headers dropped).
func (m *msgBuilder) system(system, msgs []byte) ([]byte, error) {
	var out []byte
	add := func(v []byte, where string) error {
		switch {
		case len(v) == 0 || v[0] == 'n':
		case v[0] == '"':
			out = jsonscan.AppendUnquote(out, v)
		case v[0] == '[':
			return jsonscan.ForEachElem(v, func(blk []byte) error {
				if blk[0] != '{' {
					return badRequest(where, fmt.Errorf("%w: %s holds a non-object block", ErrBadRequest, where))
				}
				typ, text := blockMember(blk, "type"), blockMember(blk, "text")
				if string(typ) == `"text"` && isString(text) && len(text) > 2 {
					m.scratch = jsonscan.AppendUnquote(m.scratch[:0], text)
					if !bytes.HasPrefix(m.scratch, billingHeader) {
						out = append(out, m.scratch...)
					}
				}
				return nil
			})
		default:
			return badRequest(where, fmt.Errorf("%w: %s must be a string or an array of blocks", ErrBadRequest, where))
		}
		return nil
	}
	if err := add(system, "system"); err != nil {
		return nil, err
	}
	i := 0
	err := jsonscan.ForEachElem(msgs, func(msg []byte) error {
		if msg[0] == '{' && string(blockMember(msg, "role")) == `"system"` {
			if err := add(blockMember(msg, "content"), fmt.Sprintf("messages[%d].content", i)); err != nil {
				return err
			}
		}
		i++
		return nil
	})
	return out, err
}

// blockMember returns member key of object obj (nil when absent).
func blockMember(obj []byte, key string) []byte {
	var out []byte
	_ = jsonscan.ForEachMember(obj, func(k, v []byte, _, _ int) error {
		if string(k) == key {
			out = v
		}
		return nil
	})
	return out
}

// message appends the chat messages Anthropic message i becomes.
func (m *msgBuilder) message(msg []byte, i int) error {
	param := func(f string) string { return fmt.Sprintf("messages[%d]%s", i, f) }
	if msg[0] != '{' {
		return badRequest(param(""), fmt.Errorf("%w: %s must be an object", ErrBadRequest, param("")))
	}
	role, content := blockMember(msg, "role"), blockMember(msg, "content")
	if !isString(role) {
		return badRequest(param(".role"), fmt.Errorf("%w: %s is required (a string)", ErrBadRequest, param(".role")))
	}
	if string(role) == `"system"` {
		return nil // joined into the leading system message
	}
	switch {
	case isString(content):
		m.open()
		m.b = append(m.b, `{"role":`...)
		m.b = append(m.b, role...)
		m.b = append(m.b, `,"content":`...)
		m.b = append(m.b, content...)
		m.b = append(m.b, '}')
		return nil
	case len(content) == 0 || content[0] != '[':
		return badRequest(param(".content"), fmt.Errorf("%w: %s must be a string or an array of content blocks", ErrBadRequest, param(".content")))
	}
	// Blocks: parts, tool calls and reasoning of this message; tool results
	// become messages of their own, written before it (vLLM appends them
	// while it walks the blocks, and the message itself after).
	var parts, calls, reasoning []byte
	nParts, nCalls, lastText := 0, 0, []byte(nil)
	hasReasoning := false
	user := string(role) == `"user"`
	j := 0
	err := jsonscan.ForEachElem(content, func(blk []byte) error {
		at := param(fmt.Sprintf(".content[%d]", j))
		j++
		if blk[0] != '{' {
			return badRequest(at, fmt.Errorf("%w: %s must be an object", ErrBadRequest, at))
		}
		switch string(blockMember(blk, "type")) {
		case `"text"`:
			text := blockMember(blk, "text")
			if !isString(text) || len(text) <= 2 {
				return nil
			}
			parts = m.appendPart(parts, &nParts, `{"type":"text","text":`, text, `}`)
			lastText = text
		case `"image"`:
			src := blockMember(blk, "source")
			if len(src) == 0 || src[0] != '{' {
				return nil
			}
			parts = m.appendPart(parts, &nParts, `{"type":"image_url","image_url":{"url":`, imageSourceURL(m.scratch[:0], src), `}}`)
		case `"thinking"`:
			if t := blockMember(blk, "thinking"); isString(t) {
				reasoning = jsonscan.AppendUnquote(reasoning, t)
				hasReasoning = true
			}
		case `"tool_use"`:
			if nCalls > 0 {
				calls = append(calls, ',')
			}
			nCalls++
			calls = append(calls, `{"id":`...)
			calls = appendOr(calls, blockMember(blk, "id"), `""`)
			calls = append(calls, `,"type":"function","function":{"name":`...)
			calls = appendOr(calls, blockMember(blk, "name"), `""`)
			calls = append(calls, `,"arguments":`...)
			in := blockMember(blk, "input")
			if len(in) == 0 || in[0] != '{' {
				in = []byte("{}")
			}
			calls = append(calls, in...) // an object: the renderer takes it as vLLM's json.loads does
			calls = append(calls, `}}`...)
		case `"tool_result"`:
			if user {
				m.toolResult(blk)
				return nil
			}
			if c := blockMember(blk, "content"); isString(c) {
				m.scratch = append(m.scratch[:0], "Tool result: "...)
				m.scratch = jsonscan.AppendUnquote(m.scratch, c)
				lastText = openai.AppendString(nil, string(m.scratch))
				parts = m.appendPart(parts, &nParts, `{"type":"text","text":`, lastText, `}`)
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if nParts == 0 && nCalls == 0 && !hasReasoning && user {
		return nil // vLLM drops a user message left without content
	}
	m.open()
	m.b = append(m.b, `{"role":`...)
	m.b = append(m.b, role...)
	switch {
	case nParts == 1 && lastText != nil:
		m.b = append(m.b, `,"content":`...)
		m.b = append(m.b, lastText...)
	case nParts > 0:
		m.b = append(m.b, `,"content":[`...)
		m.b = append(m.b, parts...)
		m.b = append(m.b, ']')
	}
	if hasReasoning {
		m.b = append(m.b, `,"reasoning":`...)
		m.b = openai.AppendString(m.b, string(reasoning))
	}
	if nCalls > 0 {
		m.b = append(m.b, `,"tool_calls":[`...)
		m.b = append(m.b, calls...)
		m.b = append(m.b, ']')
	}
	m.b = append(m.b, '}')
	return nil
}

// appendPart appends one content part: head, val, tail.
func (m *msgBuilder) appendPart(parts []byte, n *int, head string, val []byte, tail string) []byte {
	if *n > 0 {
		parts = append(parts, ',')
	}
	*n++
	parts = append(parts, head...)
	parts = append(parts, val...)
	return append(parts, tail...)
}

// toolResult appends the tool message of a user message's tool_result
// block, then a user message with its images, then a tool message with its
// tool references.
func (m *msgBuilder) toolResult(blk []byte) {
	id, content := blockMember(blk, "tool_use_id"), blockMember(blk, "content")
	var text, images, refs []byte
	nImages, nRefs := 0, 0
	switch {
	case isString(content):
		text = jsonscan.AppendUnquote(text, content)
	case len(content) > 0 && content[0] == '[':
		nText := 0
		_ = jsonscan.ForEachElem(content, func(it []byte) error {
			if it[0] != '{' {
				return nil
			}
			switch string(blockMember(it, "type")) {
			case `"text"`:
				if nText > 0 {
					text = append(text, '\n')
				}
				nText++
				if t := blockMember(it, "text"); isString(t) {
					text = jsonscan.AppendUnquote(text, t)
				}
			case `"image"`:
				src := blockMember(it, "source")
				if len(src) == 0 || src[0] != '{' {
					src = []byte("{}")
				}
				images = m.appendPart(images, &nImages, `{"type":"image_url","image_url":{"url":`, imageSourceURL(nil, src), `}}`)
			case `"tool_reference"`:
				name := blockMember(it, "tool_name")
				if !isString(name) || len(name) <= 2 {
					name = blockMember(it, "name")
				}
				if isString(name) && len(name) > 2 {
					refs = m.appendPart(refs, &nRefs, `{"type":"tool_reference","name":`, name, `}`)
				}
			}
			return nil
		})
	}
	tool := func(content []byte, raw bool) {
		m.open()
		m.b = append(m.b, `{"role":"tool","tool_call_id":`...)
		m.b = appendOr(m.b, id, `""`)
		m.b = append(m.b, `,"content":`...)
		if raw {
			m.b = append(m.b, content...)
		} else {
			m.b = openai.AppendString(m.b, string(content))
		}
		m.b = append(m.b, '}')
	}
	tool(text, false)
	if nImages > 0 {
		m.open()
		m.b = append(m.b, `{"role":"user","content":[`...)
		m.b = append(m.b, images...)
		m.b = append(m.b, `]}`...)
	}
	if nRefs > 0 {
		tool(append(append([]byte{'['}, refs...), ']'), true)
	}
}

// imageSourceURL appends the quoted URL vLLM makes of an image source: its
// url when type is "url", else a base64 data URL (media_type default
// image/jpeg).
func imageSourceURL(dst, src []byte) []byte {
	if string(blockMember(src, "type")) == `"url"` {
		return appendOr(dst, blockMember(src, "url"), `""`)
	}
	mt, data := blockMember(src, "media_type"), blockMember(src, "data")
	var s []byte
	s = append(s, "data:"...)
	if isString(mt) {
		s = jsonscan.AppendUnquote(s, mt)
	} else {
		s = append(s, "image/jpeg"...)
	}
	s = append(s, ";base64,"...)
	if isString(data) {
		s = jsonscan.AppendUnquote(s, data)
	}
	return openai.AppendString(dst, string(s))
}

// appendOr appends v when it is a JSON string, else def.
func appendOr(dst, v []byte, def string) []byte {
	if isString(v) {
		return append(dst, v...)
	}
	return append(dst, def...)
}

// appendAnthropicTools appends Anthropic's tools ({name, description,
// input_schema}) as the chat tools the template sees ({type: function,
// function: {name, description, parameters}}).
func appendAnthropicTools(b, tools []byte) ([]byte, error) {
	b = append(b, '[')
	n := 0
	err := jsonscan.ForEachElem(tools, func(t []byte) error {
		if t[0] != '{' {
			return fmt.Errorf("tools[%d] must be an object", n)
		}
		name := blockMember(t, "name")
		if !isString(name) {
			return fmt.Errorf("tools[%d].name must be a string", n)
		}
		if n > 0 {
			b = append(b, ',')
		}
		n++
		b = append(b, `{"type":"function","function":{"name":`...)
		b = append(b, name...)
		b = append(b, `,"description":`...)
		b = appendOrNull(b, blockMember(t, "description"))
		b = append(b, `,"parameters":`...)
		b = appendOrNull(b, blockMember(t, "input_schema"))
		b = append(b, `,"defer_loading":`...) // vLLM passes it on (null when absent); templates that print tools show it
		b = appendOrNull(b, blockMember(t, "defer_loading"))
		b = append(b, `}}`...)
		return nil
	})
	return append(b, ']'), err
}

// appendOrNull appends v, or null when absent.
func appendOrNull(dst, v []byte) []byte {
	if len(v) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, v...)
}

// appendMessagesError appends ae in Anthropic's error shape
// ({"type":"error","error":{"type","message"}}), the type from the status
// as Anthropic names them.
func appendMessagesError(dst []byte, ae *apiError) []byte {
	typ := "api_error"
	if ae.status >= 400 && ae.status < 500 {
		typ = "invalid_request_error" // the other client errors (405, 431, ...)
	}
	switch ae.status {
	case 400, 422:
		typ = "invalid_request_error"
	case 401:
		typ = "authentication_error"
	case 403:
		typ = "permission_error"
	case 404:
		typ = "not_found_error"
	case 413:
		typ = "request_too_large"
	case 429:
		typ = "rate_limit_error"
	case 503, 529:
		typ = "overloaded_error"
	}
	dst = append(dst, `{"type":"error","error":{"type":"`...)
	dst = append(dst, typ...)
	dst = append(dst, `","message":`...)
	dst = openai.AppendString(dst, ae.msg)
	return append(dst, "}}"...)
}
