package ingress

import (
	"bytes"

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
	first := !p.sentRole
	p.sentRole = true
	return append(appendChatObject(dst, payload, true, first), eventSep...)
}

// completionToChat converts a whole completions answer into a chat.completion.
func completionToChat(dst, body []byte) []byte {
	return appendChatObject(dst, body, false, true)
}

// appendChatObject converts one completions object. chunk selects the
// streaming shape (delta) over the whole one (message). On malformed input it
// passes the object through unchanged rather than inventing content.
func appendChatObject(dst, obj []byte, chunk, withRole bool) []byte {
	var id, created, model, choices, usage []byte
	err := jsonscan.ForEachMember(obj, func(k, v []byte, _, _ int) error {
		switch string(k) {
		case "id":
			id = v
		case "created":
			created = v
		case "model":
			model = v
		case "choices":
			choices = v
		case "usage":
			usage = v
		}
		return nil
	})
	if err != nil || len(choices) == 0 || choices[0] != '[' {
		return append(dst, obj...)
	}
	start := len(dst)
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
	dst = appendRawOr(dst, model, `""`)
	dst = append(dst, `,"choices":[`...)
	n := 0
	err = jsonscan.ForEachElem(choices, func(ch []byte) error {
		if n > 0 {
			dst = append(dst, ',')
		}
		n++
		var err error
		dst, err = appendChatChoice(dst, ch, chunk, withRole)
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
func appendChatChoice(dst, ch []byte, chunk, withRole bool) ([]byte, error) {
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
		dst = append(dst, `,"delta":{`...)
		if withRole {
			dst = append(dst, `"role":"assistant",`...)
		}
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
