package ingress

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/scheduler"
)

// maxUpstreamBody bounds a buffered (non-streamed) upstream answer.
const maxUpstreamBody = 64 << 20

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// proxy sends the request down the scheduler's ranking until an engine
// answers. Before the first byte reaches the client, connect errors, 5xx,
// 429 and a dead engine's timeouts move on to the next engine
// (Config.MaxAttempts at most). A live engine's first-byte timeout is not
// retried (ErrFirstByteTimeout); when every engine tried shed load (429) the
// client gets 429 with the engines' Retry-After.
func (c *call) proxy(ctx *fasthttp.RequestCtx) {
	ureq := c.upstreamRequest(ctx)
	defer fasthttp.ReleaseRequest(ureq)
	var lastErr error
	var shed shedding
	limit := min(c.s.cfg.MaxAttempts, len(c.dec.Ranked))
	for i := 0; i < limit; i++ {
		if c.watch.isCanceled() {
			c.clientGone(ctx)
			return
		}
		done, err := c.attempt(ctx, ureq, &c.dec.Ranked[i])
		if done {
			return
		}
		lastErr = err
		shed.add(err)
		if errors.Is(err, ErrFirstByteTimeout) {
			break
		}
	}
	if c.watch.isCanceled() {
		c.clientGone(ctx)
		return
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("%w: no candidate engine", ErrNoEngine)
	}
	lastErr = shed.verdict(lastErr)
	if !errors.Is(lastErr, ErrFirstByteTimeout) && c.routeFallback(ctx, lastErr) { // route.go: the next fallback pool
		return
	}
	c.fail(ctx, lastErr)
	c.finish()
}

// upstreamRequest builds the request every attempt sends (the body and,
// for a buffered answer, the client watcher's header); the caller releases it.
func (c *call) upstreamRequest(ctx *fasthttp.RequestCtx) *fasthttp.Request {
	body := c.upstreamBody() // route.go: "model" names the routed pool
	ureq := fasthttp.AcquireRequest()
	ureq.Header.SetMethod(fasthttp.MethodPost)
	ureq.Header.SetContentType("application/json")
	c.setUpstreamHeaders(&ureq.Header)
	ureq.SetBodyRaw(body)
	// The watcher (clientwatch.go) cancels the engine's work for a client
	// that goes away: for a buffered answer until it is relayed, for a
	// stream until its first event commits it (from then on the stream
	// learns of a gone client when its body is closed).
	if c.watch == nil { // a P/D prefill leg may have started it (pd.go)
		c.watch = c.s.ups.startWatch(ctx)
	}
	if c.watch != nil {
		ureq.Header.SetBytesV(watchHeader, c.watch.idText)
	}
	return ureq
}

// attempt sends ureq to one ranked engine. done means the client has its
// answer (relayed or streaming); otherwise err says why the next engine
// should be tried.
func (c *call) attempt(ctx *fasthttp.RequestCtx, ureq *fasthttp.Request, rk *scheduler.EngineScore) (done bool, err error) {
	s := c.s
	url := c.urlOf(rk.Engine)
	up, err := s.ups.get(rk.Engine, url)
	if err != nil {
		return false, err
	}
	c.attempts++
	c.engine, c.match = rk.Engine, rk.Match
	if s.deps.Index != nil && len(c.keys) > 0 {
		s.deps.Index.AddSpeculative(rk.Engine, c.keys, time.Now())
	}
	ureq.SetRequestURI(url + c.path)
	ureq.SetHost(up.hc.Addr)
	c.stampEngine(ureq, rk.Engine) // responses.go
	resp := fasthttp.AcquireResponse()
	c.startAttempt(up, rk.Match.Spec)
	c.watch.attempt()
	up.total.Add(1)
	err = up.hc.Do(ureq, resp)
	c.upConn = connOf(resp)
	if err != nil {
		return false, c.attemptFailed(up, resp, classifyErr(err), err)
	}
	st := resp.StatusCode()
	switch {
	case st == fasthttp.StatusTooManyRequests:
		after := retryAfter(resp.Header.Peek(fasthttp.HeaderRetryAfter), time.Now())
		err := c.attemptFailed(up, resp, statusResult(st), fmt.Errorf("engine %s answered 429 (shedding load)", rk.Engine))
		return false, &shedError{err: err, after: after}
	case st >= 500:
		return false, c.attemptFailed(up, resp, statusResult(st), fmt.Errorf("engine %s answered %d", rk.Engine, st))
	case st != fasthttp.StatusOK:
		// The engine judged the request itself (4xx): relay its answer.
		s.m.attempts.WithLabelValues("status_4xx").Inc()
		c.relayBuffered(ctx, up, resp, st)
		return true, nil
	case c.req.stream:
		c.upConn.hold() // until its first event commits it (firstByte)
		ok, err := c.startStream(ctx, up, resp)
		return ok, err
	}
	c.upConn.hold() // until the whole answer is read
	ok, err := c.relayBufferedOK(ctx, up, resp)
	return ok, err
}

// defaultOutputTokens is the output estimate for the cost model when a
// request sets no max_tokens (the scheduler's own default).
const defaultOutputTokens = 128

// startAttempt charges an attempt to its engine's local load: one request,
// its uncached prompt tokens until the first byte, and its prompt plus
// expected output until the end.
func (c *call) startAttempt(up *upstream, matchedBlocks int) {
	out := c.req.maxTokens
	if out <= 0 {
		out = defaultOutputTokens
	}
	out *= max(1, c.seqs)
	c.prefillCharge = int64(max(0, c.promptTokens-matchedBlocks*c.block))
	c.activeCharge = int64(c.promptTokens + out)
	if up.inflight.Add(1) == 1 {
		up.progress.Store(monoNow()) // the stall watch counts from the first request in flight
	}
	pre := up.prefill.Add(c.prefillCharge)
	if c.req.stream {
		c.streamCharge = c.prefillCharge
		up.streamPrefill.Add(c.streamCharge)
	} else {
		c.queueBuffered(up) // hold.go
	}
	up.active.Add(c.activeCharge)
	if c.s.outs != nil || c.s.learn != nil {
		c.sentAt = time.Now()
	}
	c.learnStart(up, pre) // learn.go
	c.passBaton()         // hold.go: charged, the next held request may go
}

// firstByte ends the attempt's prefill charge; the answer has committed to
// the client, so the stall watch leaves its connection alone from now on and
// the idle timeout bounds its reads.
func (c *call) firstByte(up *upstream) {
	c.releaseConn()
	up.progress.Store(monoNow())
	up.prefill.Add(-c.prefillCharge)
	up.streamPrefill.Add(-c.streamCharge)
	c.prefillCharge, c.streamCharge = 0, 0
	c.unqueueBuffered(up) // a whole answer: its prefill is done
	c.s.holdWake()        // hold.go: room may have freed
}

// endAttempt removes what startAttempt charged and is still charged.
func (c *call) endAttempt(up *upstream) {
	up.inflight.Add(-1)
	up.prefill.Add(-c.prefillCharge)
	up.streamPrefill.Add(-c.streamCharge)
	up.active.Add(-c.activeCharge)
	c.prefillCharge, c.streamCharge, c.activeCharge = 0, 0, 0
	c.unqueueBuffered(up)
	c.learnEnd(up)
	c.s.holdWake() // hold.go: room may have freed
}

// releaseConn ends the hold on the attempt's connection (idleConn.hold):
// the answer committed, or the attempt is over. It runs before the
// connection can go back to the pool.
func (c *call) releaseConn() {
	c.upConn.release()
	c.upConn = nil
}

func (c *call) urlOf(engine string) string {
	for i := range c.cands {
		if c.cands[i].ID == engine {
			return c.urls[i]
		}
	}
	return ""
}

// attemptFailed releases a failed attempt and returns the error to report if
// it was the last.
func (c *call) attemptFailed(up *upstream, resp *fasthttp.Response, result string, err error) error {
	slow := result == "timeout" && c.upConn.firstByteExpired() && c.s.cfg.stallWatch() && c.s.health.allowed(up.id)
	switch {
	case c.watch.isCanceled():
		result = "client_gone" // we cut it: not the engine's failure
	case slow:
		// The stall watch would have ejected a hung engine and cut this
		// request long before (Validate): the engine is alive and slow.
		result = "first_byte_timeout"
	default:
		up.failures.Add(1)
		c.s.health.observe(up, result)
	}
	c.s.m.attempts.WithLabelValues(result).Inc()
	c.watch.release()
	c.releaseConn()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	if c.s.debugEnabled() {
		c.s.log.Debug("upstream attempt failed", "engine", up.id, "result", result, "err", err)
	}
	switch result {
	case "first_byte_timeout":
		return fmt.Errorf("%w: engine %s answers its health probes but committed no answer within %v (not retried: another engine would start over): %w",
			ErrFirstByteTimeout, up.id, c.s.cfg.firstByteWait(), err)
	case "timeout":
		return fmt.Errorf("%w: engine %s: %w", ErrUpstreamTimout, up.id, err)
	}
	return fmt.Errorf("%w: engine %s: %w", ErrUpstream, up.id, err)
}

func classifyErr(err error) string {
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	return "connect_error"
}

func statusResult(st int) string {
	if st == fasthttp.StatusTooManyRequests {
		return "status_429"
	}
	return "status_5xx"
}

// readAll reads a streamed upstream body into a pooled buffer.
func readAll(resp *fasthttp.Response) (*bytes.Buffer, error) {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	r := resp.BodyStream()
	if r == nil {
		buf.Write(resp.Body())
		return buf, nil
	}
	_, err := buf.ReadFrom(io.LimitReader(r, maxUpstreamBody+1))
	if err == nil && buf.Len() > maxUpstreamBody {
		err = fmt.Errorf("%w: the engine's answer is over %d bytes", ErrAnswerTooLarge, maxUpstreamBody)
	}
	return buf, err
}

// relayBuffered relays an engine's non-200 answer as it is.
func (c *call) relayBuffered(ctx *fasthttp.RequestCtx, up *upstream, resp *fasthttp.Response, st int) {
	buf, err := readAll(resp)
	c.watch.release()
	c.releaseConn()
	_ = resp.CloseBodyStream()
	ctx.SetStatusCode(st)
	ctx.SetContentTypeBytes(resp.Header.ContentType())
	ctx.Response.Header.Set("X-Kvmesh-Engine", up.id)
	passUpstreamHeaders(&ctx.Response.Header, &resp.Header) // upstreamhdr.go
	if err == nil {
		ctx.SetBody(buf.Bytes())
	}
	bufPool.Put(buf)
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	c.status = st
	c.errMsg = fmt.Sprintf("engine answered %d", st)
	c.finish()
}

// relayBufferedOK reads a whole non-streamed answer; a read error is still
// retryable because nothing reached the client.
func (c *call) relayBufferedOK(ctx *fasthttp.RequestCtx, up *upstream, resp *fasthttp.Response) (bool, error) {
	buf, err := readAll(resp)
	c.ttft = time.Since(c.start)
	if errors.Is(err, ErrAnswerTooLarge) {
		// Another engine would answer as much: not retried, and never
		// relayed cut short.
		bufPool.Put(buf)
		c.watch.release()
		c.releaseConn()
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		c.endAttempt(up)
		ae := writeError(ctx, fmt.Errorf("engine %s: %w", up.id, err))
		c.status, c.errMsg = ae.status, ae.msg
		c.finish()
		return true, nil
	}
	if err != nil {
		bufPool.Put(buf)
		return false, c.attemptFailed(up, resp, classifyErr(err), err)
	}
	c.watch.release()
	out := buf.Bytes()
	if len(out) == 0 || out[0] != '{' {
		// An engine that dies mid-request may close with an empty 200.
		bufPool.Put(buf)
		return false, c.attemptFailed(up, resp, "empty_response", fmt.Errorf("engine %s: empty or non-JSON answer", up.id))
	}
	passUpstreamHeaders(&ctx.Response.Header, &resp.Header) // upstreamhdr.go
	c.releaseConn()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	c.s.m.attemptOK.Inc()
	c.s.health.ok(up)
	c.outTokens = usageCompletionTokens(out)
	c.readUsage(out) // tokencheck.go
	if c.ep == epResponses || c.ep == epMessages {
		if i := bytes.LastIndex(out, outTokensKey); i >= 0 {
			c.outTokens = uintAt(out, i+len(outTokensKey))
		}
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	ctx.Response.Header.Set("X-Kvmesh-Engine", up.id)
	if c.wrap {
		ctx.SetBody(completionToChat(nil, out))
	} else {
		ctx.SetBody(out)
	}
	bufPool.Put(buf)
	c.status = fasthttp.StatusOK
	c.s.m.matchRatio.Observe(c.matchRatio())
	c.finish()
	return true, nil
}

// streamBroke counts a stream that broke after it committed (the engine's
// connection died, or went silent for the idle timeout) against the engine
// for passive ejection; the request itself is not retried, bytes went out.
func (c *call) streamBroke(up *upstream) {
	up.failures.Add(1)
	c.s.health.observe(up, "stream_error")
}

// clientGone ends a request whose client went away before its answer; the
// status is recorded, nothing can be written.
func (c *call) clientGone(ctx *fasthttp.RequestCtx) {
	c.status = 499
	c.errMsg = "client closed the connection"
	ctx.SetStatusCode(499)
	ctx.SetConnectionClose()
	c.finish()
}

func (c *call) matchRatio() float64 {
	if len(c.keys) == 0 {
		return 0
	}
	return min(float64(c.match.Spec)/float64(len(c.keys)), 1)
}

// startStream reads up to the first complete SSE event before committing:
// an engine that dies during prefill is still retried. Then the response
// streams through, event by event.
func (c *call) startStream(ctx *fasthttp.RequestCtx, up *upstream, resp *fasthttp.Response) (bool, error) {
	ps := streamPool.Get().(*proxyStream)
	ps.reset()
	r := resp.BodyStream()
	if r == nil {
		r = bytes.NewReader(resp.Body())
	}
	ps.c, ps.up, ps.resp, ps.body, ps.wrap, ps.named = c, up, resp, r, c.wrap, namedStreamOf(c.ep)
	// A Responses stream opens with events vLLM sends before the prefill
	// (responses.go): wait past them, so TTFT and retries mean the same.
	// (A first event larger than the buffer grows it, in fillOnce; a
	// preamble that fills the buffer commits there.)
	for ps.upErr == nil && (ps.cut == 0 || ps.named != nil && ps.fill < len(ps.buf) && ps.named.preambleOnly(ps.buf[:ps.cut])) {
		ps.fillOnce()
	}
	result, reqErr := "", false
	if ps.cut > 0 && (bytes.HasPrefix(ps.buf, errorEventPrefix) || ps.named != nil && ps.named.firstEventFailed(ps.buf[:ps.cut])) {
		first := ps.buf[:bytes.Index(ps.buf, eventSep)]
		if code := errorEventCode(first); code < 400 || code >= 500 {
			// The engine failed before producing anything (e.g. it is
			// restarting): nothing useful reached the client, try the
			// next one, as after a 5xx.
			ps.cut, ps.upErr, result = 0, fmt.Errorf("engine sent an error event first: %.200s", first), "status_5xx"
		} else {
			reqErr = true
		}
		// A 4xx is the request's own error, raised inside the stream
		// (vLLM and SGLang validate some requests there): another engine
		// would say the same, so it reaches the client as the engine sent
		// it, and the engine is not at fault.
	}
	if ps.cut == 0 {
		err := ps.upErr
		putStream(ps)
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		if result == "" {
			result = classifyErr(err)
		}
		return false, c.attemptFailed(up, resp, result, fmt.Errorf("before first byte: %w", err))
	}
	c.ttft = time.Since(c.start)
	if c.watch != nil {
		c.watch.stop() // committed: the body's Close learns of a gone client now
		c.watch = nil
	}
	c.firstByte(up)
	if !reqErr {
		c.learnFirstToken(up) // an error is no first token
	}
	c.s.m.attemptOK.Inc()
	c.s.health.ok(up)
	c.s.m.matchRatio.Observe(c.matchRatio())
	c.status = fasthttp.StatusOK
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	ctx.Response.Header.Set("X-Kvmesh-Engine", up.id)
	passUpstreamHeaders(&ctx.Response.Header, &resp.Header) // upstreamhdr.go
	ctx.Response.SetBodyStream(ps, -1)
	return true, nil
}

// streamBufSize is a stream's buffer; an event larger than it grows it (to
// the event's size, at most maxStreamEvent) until that event has gone.
const streamBufSize = 16 << 10

// maxStreamEvent bounds one SSE event (a chunk carrying a long prompt's
// prompt_token_ids or logprobs can be megabytes); a larger one fails the
// attempt, or ends the stream with an error event once it has committed,
// as a non-streamed answer over maxUpstreamBody is refused.
const maxStreamEvent = maxUpstreamBody

var streamPool = sync.Pool{New: func() any {
	b := make([]byte, streamBufSize)
	return &proxyStream{buf: b, small: b}
}}

// proxyStream is the response body of a streamed answer. fasthttp reads it
// and writes (and flushes) each read as one chunk, so SSE events pass
// through as they arrive. Only whole events are handed out, so a stream that
// breaks leaves no half event before the error event; an event is never
// split or cut, whatever its size. Line endings are LF on the way out:
// CRLF and CR (legal SSE, sent by some servers and proxies) become LF as
// they are read, so event boundaries, [DONE], error events and usage are
// found alike. fasthttp closes it when the response ends or the client
// goes away; Close then cancels the upstream request.
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

var usageOnly = []byte(`"choices":[]`)

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
		if bytes.Contains(ev, usageOnly) && bytes.Contains(ev, usageMarker) {
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
	if err == io.EOF && (len(bytes.TrimLeft(p.buf[:p.fill], "\n")) > 0 || !p.sawDone) {
		// A half event or no [DONE]: the engine stopped short.
		err = io.ErrUnexpectedEOF
	}
	if err == io.EOF {
		return
	}
	c := p.c
	var msg, code string
	if c.s.draining.Load() && errors.Is(err, net.ErrClosed) {
		// The ingress closed the connection itself: its drain timeout cut
		// what was still streaming (Server.Close). Not the engine's failure:
		// said so, with the code a draining ingress answers new requests
		// with, and not counted against the engine (ejection, stream errors).
		msg, code = fmt.Sprintf("the ingress is shutting down: its drain timeout ended this stream from engine %s", p.up.id), "service_unavailable"
		c.errMsg = "stream cut at the drain timeout"
	} else {
		c.s.m.streamErrors.Inc()
		c.s.m.attempts.WithLabelValues("stream_error").Inc()
		c.streamBroke(p.up) // counts toward the engine's ejection (health.go)
		c.errMsg = "upstream stream broke: " + err.Error()
		msg, code = fmt.Sprintf("engine %s failed mid-stream: %v", p.up.id, err), "upstream_error"
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
// engine sends one, else one token per data event.
func (p *proxyStream) observe(b []byte) {
	p.c.readUsage(b) // tokencheck.go
	if p.named != nil {
		p.named.outTokens(p.c, b)
		return
	}
	c := p.c
	if n := usageCompletionTokens(b); n > 0 && requestUsage(c, b) {
		c.outTokens = n
		return
	}
	for i := 0; ; {
		j := bytes.Index(b[i:], dataPrefix)
		if j < 0 {
			return
		}
		i += j + len(dataPrefix)
		if !bytes.HasPrefix(b[i:], doneMarker) {
			c.outTokens++
		}
	}
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

// errorEventCode is the status code an engine's error event carries
// ("code": N inside it, as vLLM's and SGLang's ErrorResponse write it; 0
// when it has none).
func errorEventCode(ev []byte) int {
	i := bytes.Index(ev, codeMarker)
	if i < 0 {
		return 0
	}
	return uintAt(ev, i+len(codeMarker))
}

// requestUsage reports whether the last usage in b counts the whole
// request: the usage-only chunk, or any chunk's usage when the engine
// decodes one sequence. With continuous_usage_stats (vLLM) every chunk
// carries the usage of its own choice, so with several sequences a chunk's
// count is one choice's; the events are counted until the final chunk.
func requestUsage(c *call, b []byte) bool {
	return c.seqs <= 1 || bytes.Contains(b, usageOnly)
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

// Close ends the upstream request (cancelling it if still running, e.g.
// when the client went away) and records the request.
func (p *proxyStream) Close() error {
	if p.closed {
		return nil
	}
	p.closed = true
	c := p.c
	if !p.done {
		c.errMsg = "client closed the stream"
		c.status = 499
	}
	_ = p.resp.CloseBodyStream()
	fasthttp.ReleaseResponse(p.resp)
	c.endAttempt(p.up)
	c.finish()
	putStream(p)
	return nil
}

// putStream returns p to the pool, without a buffer one large event grew.
func putStream(p *proxyStream) {
	p.reset()
	streamPool.Put(p)
}
