package ingress

import (
	"bytes"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// namedStream describes a stream of named server-sent events ("event:
// <type>\ndata: <json>") that ends with a last event instead of data:
// [DONE]: the Responses API's (responses.go) and the Messages API's
// (messages.go), as vLLM writes them.
type namedStream struct {
	// preamble marks the events an engine sends before the prefill: a
	// stream has not started (for TTFT and retries) until another comes.
	preamble [][]byte
	// ends marks the stream's last events; failed those of them (and
	// errorEvent) that mean the request failed.
	ends, failed [][]byte
	errorEvent   []byte
	// delta marks an output event, counted when no usage says how many
	// tokens came.
	delta [][]byte
	// appendError appends the event ending a stream the engine broke; seq
	// is the sequence number after the last event relayed (the Responses
	// API numbers its events).
	appendError func(dst []byte, msg string, seq int) []byte
}

// outTokensKey is the usage member both APIs count output tokens with.
var outTokensKey = []byte(`"output_tokens":`)

var (
	responsesStream = &namedStream{
		preamble:    typeMarks("response.created", "response.in_progress"),
		ends:        typeMarks("response.completed", "response.incomplete", "response.failed"),
		failed:      typeMarks("response.failed"),
		errorEvent:  []byte("event: error"),
		delta:       [][]byte{[]byte(`.delta"`)}, // the data's "type" (the event line has no quote)
		appendError: appendRespErrorEvent,
	}
	messagesStream = &namedStream{
		ends:        typeMarks("message_stop"),
		errorEvent:  []byte("event: error"),
		delta:       typeMarks("content_block_delta"),
		appendError: appendMessagesErrorEvent,
	}
)

// typeMarks are the bytes of a "type" member naming each of types, as
// compact JSON writes it ("type":"x": Go, pydantic) and as Python's
// json.dumps does by default ("type": "x").
func typeMarks(types ...string) [][]byte {
	var out [][]byte
	for _, t := range types {
		out = append(out, []byte(`"type":"`+t+`"`), []byte(`"type": "`+t+`"`))
	}
	return out
}

// namedStreamOf is the named-event stream of endpoint ep, nil for the
// data-only streams of completions and chat.
func namedStreamOf(ep endpoint) *namedStream {
	switch ep {
	case epResponses:
		return responsesStream
	case epMessages:
		return messagesStream
	}
	return nil
}

// firstEvent returns the first of events (whole SSE events) past the
// preamble; ok is false while there is none (the stream has not really
// started).
func (n *namedStream) firstEvent(events []byte) (ev []byte, ok bool) {
	for len(events) > 0 {
		i := bytes.Index(events, eventSep)
		if i < 0 {
			return nil, false
		}
		ev, events = events[:i], events[i+len(eventSep):]
		if !containsAny(ev, n.preamble) {
			return ev, true
		}
	}
	return nil, false
}

// preambleOnly reports whether events hold no event past the preamble.
func (n *namedStream) preambleOnly(events []byte) bool {
	_, ok := n.firstEvent(events)
	return !ok
}

// firstEventFailed reports whether the first real event is an error.
func (n *namedStream) firstEventFailed(events []byte) bool {
	ev, ok := n.firstEvent(events)
	return ok && (bytes.HasPrefix(ev, n.errorEvent) || bytes.HasPrefix(ev, errorEventPrefix) || containsAny(ev, n.failed))
}

// ended reports whether events hold the stream's last event.
func (n *namedStream) ended(events []byte) bool { return containsAny(events, n.ends) }

// outTokens counts output tokens in b for c: the usage's output_tokens
// when an event has a nonzero one, else one per output event.
func (n *namedStream) outTokens(c *call, b []byte) {
	if i := bytes.LastIndex(b, outTokensKey); i >= 0 {
		if v := uintAt(b, i+len(outTokensKey)); v > 0 {
			c.outTokens = v
			return
		}
	}
	for _, d := range n.delta {
		c.outTokens += bytes.Count(b, d)
	}
}

var (
	seqKey          = []byte(`"sequence_number":`)
	errorEventStart = []byte("\n\nevent: error\n")
)

// trackNamed notes, in whole events of a named stream about to be
// relayed, the last sequence number and the engine's own first error event
// (event: error, or vLLM's data: {"error": ...}) and its code (errCode).
// events starts at an event's start; a key inside a JSON string has its
// quotes escaped, so it does not match.
func (p *proxyStream) trackNamed(events []byte) {
	if i := bytes.LastIndex(events, seqKey); i >= 0 {
		p.nextSeq = uintAt(events, i+len(seqKey)) + 1
	}
	for rest := events; !p.sawError && len(rest) > 0; {
		ev := rest
		if i := bytes.Index(rest, eventSep); i >= 0 {
			ev, rest = rest[:i], rest[i+len(eventSep):]
		} else {
			rest = nil
		}
		if bytes.HasPrefix(ev, errorEventStart[2:]) || bytes.HasPrefix(ev, errorEventPrefix) {
			p.sawError = true
			p.errorEvent(ev)
		}
	}
}

func containsAny(b []byte, marks [][]byte) bool {
	for _, m := range marks {
		if bytes.Contains(b, m) {
			return true
		}
	}
	return false
}

// appendMessagesErrorEvent appends the error event ending a broken
// Messages stream (Anthropic's error shape).
func appendMessagesErrorEvent(dst []byte, msg string, _ int) []byte {
	dst = append(dst, "event: error\ndata: "...)
	dst = append(dst, `{"type":"error","error":{"type":"api_error","message":`...)
	dst = openai.AppendString(dst, msg)
	return append(dst, "}}\n\n"...)
}
