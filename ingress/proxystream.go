package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/valyala/fasthttp"
)

// proxyStream is the response body of a streamed answer. fasthttp reads it
// and writes (and flushes) each read as one chunk, so SSE events pass
// through as they arrive. Only whole events are handed out, so a stream that
// breaks leaves no half event before the error event; an event is never
// split or cut, whatever its size. Line endings are LF on the way out:
// CRLF and CR (legal SSE, sent by some servers and proxies) become LF as
// they are read, so event boundaries, [DONE], error events and usage are
// found alike. fasthttp closes it when the response ends or the client
// goes away; CloseWithError then cancels the upstream request.
type proxyStream struct {
	c    *call
	up   *upstream
	resp *fasthttp.Response
	body io.Reader

	buf      []byte // upstream bytes: buf[:cut] whole events, buf[cut:fill] a partial one
	small    []byte // the pooled buffer; buf is a larger one while an event needs it
	fill     int
	cut      int
	scan     int    // buf[:scan] was searched for event ends
	cr       bool   // the last byte read was a CR (an LF next is its CRLF's)
	pending  []byte // what Read hands out next: buf[pos:cut] or converted events
	upErr    error  // upstream error seen, acted on once pending drains
	tail     []byte // error event + [DONE] after a broken stream
	done     bool
	wrap     bool         // chat re-wrap mode
	named    *namedStream // a named-event stream (namedstream.go), nil for completions and chat
	out      []byte       // re-wrap: converted events
	sawDone  bool         // the engine's [DONE] went through
	sawError bool         // named: the engine's own error event went through
	nextSeq  int          // named: the sequence_number after the last one relayed
	sentRole bool
	closed   bool
	broke    bool // counted as a stream_error attempt (endWith); else ok when it closes
	errCode  int  // the first error event's code (errorEvent), 0 for none
}

// maxPooledOut bounds the converted-events buffer a pooled stream keeps
// (one huge event's conversion is not kept for every later stream).
const maxPooledOut = 4 * streamBufSize

func (p *proxyStream) reset() {
	out := p.out[:0]
	if cap(out) > maxPooledOut {
		out = nil
	}
	buf := p.small
	if buf == nil {
		buf = p.buf
	}
	*p = proxyStream{buf: buf, small: p.small, out: out, tail: p.tail[:0]}
}

// fillOnce reads once from upstream and, when whole events arrived, makes
// them pending. A buffer that one partial event fills grows first.
func (p *proxyStream) fillOnce() {
	if p.fill == len(p.buf) && !p.grow() {
		p.upErr = fmt.Errorf("%w: an event over %d bytes", ErrAnswerTooLarge, maxStreamEvent)
		return
	}
	n, err := p.body.Read(p.buf[p.fill:])
	if err != nil {
		p.upErr = err
	}
	if n == 0 {
		return
	}
	p.fill += p.toLF(p.buf[p.fill : p.fill+n])
	// Only the new bytes (and the LF before them, which may end an event
	// with a new one) can hold a new event end: a large event arriving in
	// many reads is searched once.
	from := max(p.cut, p.scan-1, 0)
	p.scan = p.fill
	i := bytes.LastIndex(p.buf[from:p.fill], eventSep)
	if i < 0 {
		return
	}
	p.cut = from + i + len(eventSep)
	events := p.buf[:p.cut]
	if hasDoneEvent(events) || p.named != nil && p.named.ended(events) {
		p.sawDone = true
	}
	if p.named != nil {
		p.trackNamed(events)
	}
	if p.c.usage != nil {
		p.probeUsage(events, p.sawDone) // forcedusage.go
	}
	switch {
	case p.wrap:
		p.out = p.rewrap(p.out[:0], events)
		p.pending = p.out
	case p.c.dropUsage:
		p.observeLearn(events)
		p.out = dropUsageEvents(p.out[:0], events)
		p.pending = p.out
	default:
		p.observeLearn(events)
		p.pending = events
	}
}

// grow doubles the buffer for an event that fills it (up to
// maxStreamEvent); false when it is that large already.
func (p *proxyStream) grow() bool {
	if len(p.buf) >= maxStreamEvent {
		return false
	}
	nb := make([]byte, min(2*len(p.buf), maxStreamEvent))
	copy(nb, p.buf[:p.fill])
	p.buf = nb
	return true
}

// toLF rewrites b's line endings to LF in place (CRLF to LF, a lone CR to
// LF, an LF after a CR that ended the previous read dropped) and returns
// b's new length. A stream with no CR costs one scan.
func (p *proxyStream) toLF(b []byte) int {
	if bytes.IndexByte(b, '\r') < 0 && !(p.cr && b[0] == '\n') {
		p.cr = false
		return len(b)
	}
	w := 0
	for _, ch := range b { // w never passes the byte being read
		switch {
		case ch == '\r':
			b[w] = '\n'
			w++
			p.cr = true
		case ch == '\n' && p.cr:
			p.cr = false
		default:
			b[w] = ch
			w++
			p.cr = false
		}
	}
	return w
}

// usageOnly marks the usage-only chunk (no choices), as compact JSON and
// Python's json.dumps write it.
var usageOnly, usageOnlySpaced = []byte(`"choices":[]`), []byte(`"choices": []`)

// hasUsageOnly reports whether b holds a usage-only chunk's empty choices.
func hasUsageOnly(b []byte) bool {
	return bytes.Contains(b, usageOnly) || bytes.Contains(b, usageOnlySpaced)
}

// hasDoneEvent reports whether events hold a [DONE] event: a whole
// "data: [DONE]" line that starts an event (a second data line of another
// event joins that event's data, and is no [DONE] to a client).
func hasDoneEvent(events []byte) bool {
	for i := 0; ; {
		j := bytes.Index(events[i:], doneEvent)
		if j < 0 {
			return false
		}
		at := i + j
		end := at + len(doneEvent)
		if (at == 0 || events[at-1] == '\n' && (at == 1 || events[at-2] == '\n')) && (end == len(events) || events[end] == '\n') {
			return true
		}
		i = at + 1
	}
}

// dropUsageEvents appends the events except the usage-only chunk (empty
// choices, a usage object), which the ingress requested for itself (and
// the model's engines do not send unasked: forcedusage.go).
func dropUsageEvents(dst, events []byte) []byte {
	for len(events) > 0 {
		i := bytes.Index(events, eventSep)
		if i < 0 {
			return append(dst, events...)
		}
		ev := events[:i+len(eventSep)]
		events = events[i+len(eventSep):]
		if hasUsageOnly(ev) && bytes.Contains(ev, usageMarker) {
			continue
		}
		dst = append(dst, ev...)
	}
	return dst
}

func (p *proxyStream) Read(b []byte) (int, error) {
	for {
		if len(p.pending) > 0 {
			n := copy(b, p.pending)
			p.pending = p.pending[n:]
			return n, nil
		}
		if p.cut > 0 { // pending drained: keep only the partial event
			dst := p.buf
			if p.small != nil && len(p.buf) > len(p.small) && p.fill-p.cut <= len(p.small) {
				dst = p.small // a large event has gone: back to the pooled buffer
			}
			p.fill = copy(dst, p.buf[p.cut:p.fill])
			p.buf, p.cut, p.scan = dst, 0, p.fill
		}
		if len(p.tail) > 0 {
			n := copy(b, p.tail)
			p.tail = p.tail[n:]
			return n, nil
		}
		if p.done {
			return 0, io.EOF
		}
		if p.upErr != nil {
			p.endWith(p.upErr)
			continue
		}
		p.fillOnce()
	}
}

// endWith finishes the stream after the upstream ended: cleanly on EOF with
// no partial event left, with an OpenAI error event and [DONE] otherwise
// (bytes already reached the client, so it cannot be retried).
func (p *proxyStream) endWith(err error) {
	p.done = true
	if err == io.EOF && p.named != nil && p.sawError && len(bytes.TrimLeft(p.buf[:p.fill], "\n")) == 0 {
		// The engine's own error event ended a Messages or Responses
		// stream (nothing follows it there). A request's own error (4xx)
		// leaves the engine in good standing; any other counts against it,
		// and nothing is added after its event.
		if p.errCode >= 400 && p.errCode < 500 {
			p.c.s.health.ok(p.up, p.c.attemptAt)
			return
		}
		err = fmt.Errorf("the engine ended the stream with an error event (code %d)", p.errCode)
	}
	if err == io.EOF && (len(bytes.TrimLeft(p.buf[:p.fill], "\n")) > 0 || !p.sawDone) {
		// A half event or no [DONE]: the engine stopped short.
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		p.c.s.health.ok(p.up, p.c.attemptAt) // the attempt succeeded (proxy.go, startStream)
		return
	}
	c := p.c
	var msg, code string
	// The request's status in the access log and requests_total: the one
	// its error event gives it, as an engine's own error event's code does
	// (failedInStream), unless the engine's event came first.
	status := fasthttp.StatusBadGateway
	from := " from engine " + p.up.id // an engine's id may be its address: only with Config.EngineHeader
	if !c.s.cfg.EngineHeader {
		from = ""
	}
	if c.s.draining.Load() && errors.Is(err, net.ErrClosed) {
		// The ingress closed the connection itself: its drain timeout cut
		// what was still streaming (Server.Close). Not the engine's failure:
		// said so, with the code a draining ingress answers new requests
		// with, and not counted against the engine (ejection, stream errors).
		msg, code = "the ingress is shutting down: its drain timeout ended this stream"+from, "service_unavailable"
		c.errMsg = "stream cut at the drain timeout"
		status = fasthttp.StatusServiceUnavailable
	} else {
		c.s.m.streamErrors.Inc()
		c.s.m.attempts.WithLabelValues("stream_error").Inc()
		p.broke = true      // its one result (CloseWithError counts the others ok)
		c.streamBroke(p.up) // counts toward the engine's ejection (health.go)
		c.errMsg = "upstream stream broke: " + err.Error()
		// The client's event names the engine by id, not by address
		// (clientText, proxy.go), and not at all with Config.EngineHeader
		// off; c.errMsg keeps the address for the log, beside the access
		// log's engine.
		msg, code = "the engine failed mid-stream: "+clientText(err), "upstream_error"
		if c.s.cfg.EngineHeader {
			msg = fmt.Sprintf("engine %s failed mid-stream: %s", p.up.id, clientText(err))
		}
	}
	if p.errCode == 0 {
		p.errCode = status
	}
	if p.named != nil {
		if !p.sawError { // else the engine's own error event ended it
			p.tail = p.named.appendError(p.tail, msg, p.nextSeq)
		}
		return
	}
	p.tail = append(p.tail, "data: "...)
	p.tail = appendErrorBody(p.tail, &apiError{msg: msg, typ: "server_error", code: code})
	p.tail = append(p.tail, "\n\ndata: [DONE]\n\n"...)
}

// observe counts output from the passing SSE bytes: the usage chunk when the
// engine sends one, else one token per data event; an error event (vLLM and
// SGLang send `data: {"error": ...}` inside a 200 stream) is no token, and
// sets the request's status and error for the access log and metrics
// (errorEvent).
func (p *proxyStream) observe(b []byte) {
	p.c.readUsage(b) // tokencheck.go
	if p.named != nil {
		p.named.outTokens(p.c, b)
		return
	}
	p.c.countEvents(b, p.errorEvent)
}

// countEvents counts output from the SSE bytes b of an OpenAI stream: the
// usage chunk when the engine sends one (the request's own usage), else
// one token per data event; an error event is no token, and goes to
// onError (nil: none).
func (c *call) countEvents(b []byte, onError func(ev []byte)) {
	if n := usageCompletionTokens(b); n > 0 && requestUsage(c, b) {
		c.outTokens = n
		return
	}
	for i := 0; ; {
		j := bytes.Index(b[i:], dataPrefix)
		if j < 0 {
			return
		}
		ev := b[i+j:]
		i += j + len(dataPrefix)
		switch {
		case bytes.HasPrefix(b[i:], doneMarker):
		case bytes.HasPrefix(ev, errorEventPrefix):
			if onError != nil {
				onError(ev)
			}
		default:
			c.outTokens++
		}
	}
}

// errorEvent notes the stream's first error event (ev starts with it): its
// code (500 when it has none in 4xx–5xx) becomes the request's status when
// the stream ends (Close), for the access log and metrics. The event's
// message is not copied: a validation error may quote the request's input.
func (p *proxyStream) errorEvent(ev []byte) {
	if p.errCode == 0 {
		p.errCode = errorEventStatus(ev)
	}
}

// failedInStream gives a 200 stream's request the status of the engine's
// error event inside it (code), and says so unless its error is told.
func (c *call) failedInStream(code int) {
	c.status = code
	if c.errMsg == "" {
		c.errMsg = "the engine sent an error event in the stream (code " + strconv.Itoa(code) + ")"
	}
}

// errorEventStatus is the status an engine's error event (ev: from its
// "data: " on) gives its request: its code, 500 when it carries none in
// 400-599.
func errorEventStatus(ev []byte) int {
	if k := bytes.Index(ev, eventSep); k >= 0 {
		ev = ev[:k]
	}
	code := errorEventCode(ev)
	if code < 400 || code > 599 {
		code = fasthttp.StatusInternalServerError
	}
	return code
}

var (
	eventSep         = []byte("\n\n")
	dataPrefix       = []byte("data: ")
	doneEvent        = []byte("data: [DONE]")
	errorEventPrefix = []byte(`data: {"error"`)
	doneMarker       = []byte("[DONE]")
	usageMarker      = []byte(`"completion_tokens":`)
	codeMarker       = []byte(`"code":`)
)

// errorEventCode is the status code an engine's error event carries:
// "code": N inside it, as vLLM's and SGLang's ErrorResponse write it, else
// 400 for an error whose type or code names the request's own fault (the
// Messages API's Anthropic errors and the Responses API's error events
// carry a type or a string code, no status); 0 when it says neither.
func errorEventCode(ev []byte) int {
	if i := bytes.Index(ev, codeMarker); i >= 0 {
		if code := uintAt(ev, i+len(codeMarker)); code != 0 {
			return code
		}
	}
	for _, t := range requestErrorTypes {
		if bytes.Contains(ev, t) {
			return fasthttp.StatusBadRequest
		}
	}
	for _, t := range unavailableTypes {
		if bytes.Contains(ev, t) {
			return fasthttp.StatusServiceUnavailable
		}
	}
	return 0
}

// unavailableTypes are the string codes and types of an engine that cannot
// serve now (shutting down, overloaded): a Responses stream's error event
// carries "code": "service_unavailable" with no status, and was counted
// 500 where the same outage on chat is 502/503.
var unavailableTypes = [][]byte{[]byte(`"service_unavailable"`), []byte(`"overloaded_error"`)}

// requestErrorTypes are the error types and string codes (quoted, as JSON
// strings) that say the request itself was refused: OpenAI's and
// Anthropic's 4xx types, vLLM's exception names, the Responses API's
// invalid_prompt.
var requestErrorTypes = [][]byte{[]byte(`"invalid_request_error"`), []byte(`"BadRequestError"`), []byte(`"not_found_error"`),
	[]byte(`"NotFoundError"`), []byte(`"authentication_error"`), []byte(`"permission_error"`), []byte(`"request_too_large"`),
	[]byte(`"invalid_prompt"`), []byte(`"context_length_exceeded"`)}

// requestUsage reports whether the last usage in b counts the whole
// request: the usage-only chunk, or any chunk's usage when the engine
// decodes one sequence. With continuous_usage_stats (vLLM) every chunk
// carries the usage of its own choice, so with several sequences a chunk's
// count is one choice's; the events are counted until the final chunk.
func requestUsage(c *call, b []byte) bool {
	return c.seqs <= 1 || hasUsageOnly(b)
}

// usageCompletionTokens finds "completion_tokens":N in b (0 when absent).
func usageCompletionTokens(b []byte) int {
	i := bytes.LastIndex(b, usageMarker)
	if i < 0 {
		return 0
	}
	return uintAt(b, i+len(usageMarker))
}

// uintAt reads the non-negative integer at b[i:] after whitespace (0 when
// there is none or it is absurdly large).
func uintAt(b []byte, i int) int {
	i = jsonscan.SkipWS(b, i)
	n := 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int(b[i]-'0')
		if n > 1<<30 {
			return 0
		}
	}
	return n
}

// CloseWithError ends the upstream request (cancelling it if still
// running, e.g. when the client went away) and records the request.
// fasthttp calls it when the response ends, with the error that ended
// writing it (nil when it was written): errSendTimeout when the client
// stopped reading (sendtimeout.go). It is the stream's only close: as an
// io.Closer as well, fasthttp would call Close first, before the error is
// known.
func (p *proxyStream) CloseWithError(werr error) error {
	if p.closed {
		return nil
	}
	p.closed = true
	c := p.c
	if errors.Is(werr, errSendTimeout) {
		c.errMsg = werr.Error()
		c.status = 499
	} else if !p.done {
		c.errMsg = "client closed the stream"
		c.status = 499
	} else if p.errCode != 0 && c.status == fasthttp.StatusOK {
		c.failedInStream(p.errCode)
	}
	if !p.broke {
		// The attempt's one result (startStream counts none at the
		// commit): the engine served it, to its end or until the client
		// or the drain cut it.
		c.s.m.attemptOK.Inc()
	}
	_ = p.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(p.resp)
	c.endAttempt(p.up)
	c.finish()
	putStream(p)
	return nil
}

var _ fasthttp.ReadCloserWithError = (*proxyStream)(nil)

// putStream returns p to the pool, without a buffer one large event grew.
func putStream(p *proxyStream) {
	p.reset()
	streamPool.Put(p)
}
