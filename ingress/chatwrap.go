package ingress

import (
	"bytes"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// Chat re-wrapping (Config.ChatModeCompletions): the ingress renders the chat
// template, sends the token ids to the engine's /v1/completions, and turns
// the completions answer back into chat.completion / chat.completion.chunk
// objects. Field values (ids, text, finish reasons, usage) are copied as raw
// JSON, so nothing is decoded or re-escaped.

// rewrap appends the chat form of the whole SSE events in events to dst.
func (p *proxyStream) rewrap(dst, events []byte) []byte {
	for {
		i := bytes.Index(events, eventSep)
		if i < 0 {
			return dst
		}
		dst = p.convertEvent(dst, events[:i])
		events = events[i+len(eventSep):]
	}
}

func (p *proxyStream) convertEvent(dst, ev []byte) []byte {
	ev = bytes.TrimSpace(ev)
	if !bytes.HasPrefix(ev, dataPrefix) {
		if len(ev) == 0 {
			return dst
		}
		return append(append(dst, ev...), eventSep...) // comments, other fields
	}
	payload := bytes.TrimSpace(ev[len(dataPrefix):])
	if !p.sentRole && len(payload) > 0 && payload[0] == '{' && !bytes.Equal(payload, doneMarker) {
		// vLLM's chat stream opens with a role chunk per choice before any
		// content: the first completions chunk becomes those and its text.
		var ok bool
		if dst, ok = appendRoleChunks(dst, payload, max(p.c.req.n, 1)); ok {
			p.sentRole = true
		}
	}
	dst = append(dst, dataPrefix...)
	if bytes.Equal(payload, doneMarker) || len(payload) == 0 || payload[0] != '{' {
		return append(append(dst, payload...), eventSep...)
	}
	if n := usageCompletionTokens(payload); n > 0 && requestUsage(p.c, payload) {
		p.c.outTokens = n
		if p.c.dropUsage && hasUsageOnly(payload) {
			return dst[:len(dst)-len(dataPrefix)]
		}
	} else {
		p.c.outTokens++
	}
	return append(appendChatObject(dst, payload, true), eventSep...)
}

// appendRoleChunks appends the events vLLM's chat stream opens with, one per
// choice: {"delta":{"role":"assistant","content":""}}, with the usage so far
// (the prompt's tokens, none generated) when the engine's chunk carries
// usage (continuous_usage_stats). ok is false, nothing appended, when obj
// is not a completions chunk with choices (an error event).
func appendRoleChunks(dst, obj []byte, n int) (_ []byte, ok bool) {
	h, err := scanCompletions(obj)
	if err != nil || len(h.choices) == 0 || h.choices[0] != '[' {
		return dst, false
	}
	var prompt []byte
	if len(h.usage) > 0 && h.usage[0] == '{' {
		_ = jsonscan.ForEachMember(h.usage, func(k, v []byte, _, _ int) error {
			if string(k) == "prompt_tokens" {
				prompt = v
			}
			return nil
		})
	}
	id, created, model := h.id, h.created, h.model
	for i := range n {
		dst = append(dst, dataPrefix...)
		dst = appendChatHead(dst, id, created, model, true)
		dst = append(dst, `,"choices":[{"index":`...)
		dst = strconv.AppendInt(dst, int64(i), 10)
		dst = append(dst, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
		if len(prompt) > 0 {
			dst = append(dst, `,"usage":{"prompt_tokens":`...)
			dst = append(dst, prompt...)
			dst = append(dst, `,"total_tokens":`...)
			dst = append(dst, prompt...)
			dst = append(dst, `,"completion_tokens":0}`...)
		}
		dst = append(append(dst, '}'), eventSep...)
	}
	return dst, true
}

// completionsHead is what a completions object's chat form is made of: its
// members' raw JSON, nil where absent.
type completionsHead struct{ id, created, model, choices, usage []byte }

// scanCompletions reads a completions object's members (completionsHead).
func scanCompletions(obj []byte) (h completionsHead, err error) {
	err = jsonscan.ForEachMember(obj, func(k, v []byte, _, _ int) error {
		switch string(k) {
		case "id":
			h.id = v
		case "created":
			h.created = v
		case "model":
			h.model = v
		case "choices":
			h.choices = v
		case "usage":
			h.usage = v
		}
		return nil
	})
	return h, err
}

// appendChatHead appends a chat object's opening members: its id (the
// completions id, prefixed "chat"), object, created and model.
func appendChatHead(dst, id, created, model []byte, chunk bool) []byte {
	dst = append(dst, `{"id":`...)
	if len(id) > 1 && id[0] == '"' {
		dst = append(dst, `"chat`...)
		dst = append(dst, id[1:]...)
	} else {
		dst = append(dst, `""`...)
	}
	if chunk {
		dst = append(dst, `,"object":"chat.completion.chunk","created":`...)
	} else {
		dst = append(dst, `,"object":"chat.completion","created":`...)
	}
	dst = appendRawOr(dst, created, "0")
	dst = append(dst, `,"model":`...)
	return appendRawOr(dst, model, `""`)
}

// completionToChat converts a whole completions answer into a chat.completion.
func completionToChat(dst, body []byte) []byte {
	return appendChatObject(dst, body, false)
}

// appendChatObject converts one completions object. chunk selects the
// streaming shape (delta) over the whole one (message). On malformed input it
// passes the object through unchanged rather than inventing content.
func appendChatObject(dst, obj []byte, chunk bool) []byte {
	h, err := scanCompletions(obj)
	id, created, model, choices, usage := h.id, h.created, h.model, h.choices, h.usage
	if err != nil || len(choices) == 0 || choices[0] != '[' {
		return append(dst, obj...)
	}
	start := len(dst)
	dst = appendChatHead(dst, id, created, model, chunk)
	dst = append(dst, `,"choices":[`...)
	n := 0
	err = jsonscan.ForEachElem(choices, func(ch []byte) error {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		var err error
		dst, err = appendChatChoice(dst, ch, chunk)
		return err
	})
	if err != nil {
		return append(dst[:start], obj...)
	}
	dst = append(dst, ']')
	if len(usage) > 0 {
		dst = append(dst, `,"usage":`...)
		dst = append(dst, usage...)
	}
	return append(dst, '}')
}

// appendChatChoice converts one completions choice into a chat choice. vLLM's
// stop_reason (the stop string or token id that ended the choice) is kept as
// its chat answer has it: in every whole choice, and in a chunk only where
// it is set (vLLM's completions stream writes it, null too, in every chunk;
// its chat stream in the last one).
func appendChatChoice(dst, ch []byte, chunk bool) ([]byte, error) {
	var index, text, finish, logprobs, stop []byte
	if err := jsonscan.ForEachMember(ch, func(k, v []byte, _, _ int) error {
		switch string(k) {
		case "index":
			index = v
		case "text":
			text = v
		case "finish_reason":
			finish = v
		case "logprobs":
			logprobs = v
		case "stop_reason":
			stop = v
		}
		return nil
	}); err != nil {
		return dst, err
	}
	dst = append(dst, `{"index":`...)
	dst = appendRawOr(dst, index, "0")
	if chunk {
		dst = append(dst, `,"delta":{`...) // the role came in its own chunks (appendRoleChunks)
	} else {
		dst = append(dst, `,"message":{"role":"assistant",`...)
	}
	dst = append(dst, `"content":`...)
	dst = appendRawOr(dst, text, `""`)
	dst = append(dst, `},"logprobs":`...)
	dst = appendRawOr(dst, logprobs, "null")
	dst = append(dst, `,"finish_reason":`...)
	dst = appendRawOr(dst, finish, "null")
	if len(stop) > 0 && !(chunk && string(stop) == "null") {
		dst = append(dst, `,"stop_reason":`...)
		dst = append(dst, stop...)
	}
	return append(dst, '}'), nil
}

func appendRawOr(dst, raw []byte, def string) []byte {
	if len(raw) == 0 {
		return append(dst, def...)
	}
	return append(dst, raw...)
}
