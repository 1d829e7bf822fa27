package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/scheduler"
)

// maxUpstreamBody bounds a buffered (non-streamed) upstream answer.
const maxUpstreamBody = 64 << 20

var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// limitPool holds readAll's limit readers: one made per answer escaped
// into bytes.Buffer.ReadFrom, an allocation on every non-streamed answer.
var limitPool = sync.Pool{New: func() any { return new(io.LimitedReader) }}

// proxy sends the request down the scheduler's ranking until an engine
// answers. Before the first byte reaches the client, connect errors, 5xx,
// 429, a 404 saying the engine does not serve the model (wrongmodel.go)
// and a dead engine's timeouts move on to the next engine
// (Config.MaxAttempts at most). A live engine's first-byte timeout is not
// retried (ErrFirstByteTimeout), nor is the ingress running out of its own
// resources (ErrLocalResources: every engine would fail the same way); when
// every engine tried shed load (429) the client gets 429 with the engines'
// Retry-After.
//
// The ranking is the one made when the request was scheduled, and engines
// that share a prefix rank next to each other and die together (their
// sidecars' pods, a host): the walk skips an engine ejected since then
// while a later one is not (nextRoutable), and a refused connection
// (nothing listens: nothing was sent) does not count against MaxAttempts.
// The walk is bounded all the same: it dials each ranked engine at most
// once.
func (c *call) proxy(ctx *fasthttp.RequestCtx) {
	ureq := c.upstreamRequest(ctx)
	defer fasthttp.ReleaseRequest(ureq)
	var lastErr error
	var shed shedding
	budget := c.s.cfg.MaxAttempts
	for i := 0; i < len(c.dec.Ranked) && budget > 0; i++ {
		if c.watch.isCanceled() {
			c.clientGone(ctx)
			return
		}
		i = c.nextRoutable(i)
		done, err := c.attempt(ctx, ureq, &c.dec.Ranked[i])
		if done {
			return
		}
		lastErr = err
		shed.add(err)
		if errors.Is(err, ErrFirstByteTimeout) || errors.Is(err, ErrLocalResources) {
			break
		}
		if !refusedConnection(err) {
			budget--
		}
	}
	if c.watch.isCanceled() {
		c.clientGone(ctx)
		return
	}
	if lastErr == nil {
		lastErr = fmt.Errorf("%w: no candidate engine", ErrNoEngine)
	}
	sent, _ := c.sentModel()
	lastErr = shed.verdict(lastErr, len(c.dec.Ranked), sent)
	if !errors.Is(lastErr, ErrFirstByteTimeout) && !errors.Is(lastErr, ErrLocalResources) && c.routeFallback(ctx, lastErr) { // route.go: the next fallback pool
		return
	}
	c.fail(ctx, lastErr)
	c.finish()
}

// nextRoutable is the position in the ranking of the engine to try next
// from position i: i, unless this replica has ejected its engine since the
// request was ranked (a connect error of this or another request) and a
// later engine is still in routing, then the first such. When none is, the
// walk goes on down the ranking as it was: those are engines routed to in a
// panic (every engine of the model ejected for its answers: health.go's
// panicRoute), or the last chances before the request fails.
func (c *call) nextRoutable(i int) int {
	h := c.s.health
	if h.allowed(c.dec.Ranked[i].Engine) {
		return i
	}
	for j := i + 1; j < len(c.dec.Ranked); j++ {
		if h.allowed(c.dec.Ranked[j].Engine) {
			return j
		}
	}
	return i
}

// refusedConnection reports whether a failed attempt's connection was
// refused: nothing listens at the engine's address, so the engine has seen
// nothing of the request.
func refusedConnection(err error) bool {
	return errors.Is(err, syscall.ECONNREFUSED)
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
	if keys := c.keysOf(rk.Engine); s.deps.Index != nil && len(keys) > 0 {
		s.deps.Index.AddSpeculative(rk.Engine, keys, time.Now()) // at the engine's block size
	}
	c.uri = append(append(c.uri[:0], url...), c.path...)
	ureq.SetRequestURIBytes(c.uri)
	ureq.SetHost(up.hc.Addr)
	c.stampEngine(ureq, rk.Engine) // responses.go
	resp := fasthttp.AcquireResponse()
	c.startAttempt(up, rk.Match.Spec)
	c.watch.attempt()
	up.total.Add(1)
	err = tlsCauseOf(resp, up.hc.Do(ureq, resp)) // upstreamtls.go: an alert refusing our certificate
	c.upConn = connOf(resp)
	if err != nil {
		return false, c.attemptFailed(up, resp, classifyErr(err), err)
	}
	st := resp.StatusCode()
	switch {
	case st == fasthttp.StatusTooManyRequests:
		after := retryAfter(resp.Header.Peek(fasthttp.HeaderRetryAfter), time.Now())
		err := c.attemptFailed(up, resp, statusResult(st), errors.New("answered 429 (shedding load)"))
		return false, &shedError{err: err, after: after}
	case loopAnswer(resp) != "": // loop.go: a 508 from a kvmesh ingress, not an engine
		return false, c.routingLoop(up, resp)
	case st >= 500:
		return false, c.attemptFailed(up, resp, statusResult(st), fmt.Errorf("answered %d%s", st, engineSays(resp)))
	case st == fasthttp.StatusUnauthorized:
		return false, c.credentialRefused(up, resp) // upstreamauth.go
	case st != fasthttp.StatusOK:
		buf, rerr := readAll(resp)
		if st == fasthttp.StatusNotFound && rerr == nil && c.noSuchModel(buf.Bytes()) {
			// Not the request's fault: the engine is not the one gossip
			// says it is, or lost an adapter (wrongmodel.go).
			bufPool.Put(buf)
			return false, c.wrongModel(up, resp)
		}
		// The engine judged the request itself (4xx): relay its answer.
		s.m.attempts.WithLabelValues("status_4xx").Inc()
		c.relayRead(ctx, up, resp, st, buf, rerr)
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
// expected output until the end, and as the engine's KV the prompt blocks
// no other request in flight there holds (upstream.kvAdd) plus its prompt
// tail and expected output. Blocks are the engine's own size (keysOf,
// blockOf), as is its match, matchedBlocks: a model's engines may differ.
func (c *call) startAttempt(up *upstream, matchedBlocks int) {
	out := c.req.maxTokens
	if out <= 0 {
		out = defaultOutputTokens
	}
	out *= max(1, c.seqs)
	c.prefillCharge = int64(max(0, c.promptTokens-matchedBlocks*c.blockOf(c.engine)))
	c.activeCharge = int64(c.promptTokens + out)
	c.kvKeys, c.kvBlock = c.keysOf(c.engine), c.blockOf(c.engine)
	c.kvCharge = int64(max(0, c.promptTokens-len(c.kvKeys)*c.kvBlock) + out)
	up.kv.Add(int64(up.kvAdd(c.kvKeys)*c.kvBlock) + c.kvCharge)
	c.attemptAt = monoNow()
	if up.inflight.Add(1) == 1 {
		up.progress.Store(c.attemptAt) // the stall watch counts from the first request in flight
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
	up.kv.Add(-int64(up.kvDrop(c.kvKeys)*c.kvBlock) - c.kvCharge)
	c.prefillCharge, c.streamCharge, c.activeCharge, c.kvCharge, c.kvKeys = 0, 0, 0, 0, nil
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
	stallCut := c.upConn.wasStallCut()
	switch {
	case c.watch.isCanceled():
		result = "client_gone" // we cut it: not the engine's failure
	case slow:
		// The stall watch would have ejected a hung engine and cut this
		// request long before (Validate): the engine is alive and slow.
		result = "first_byte_timeout"
	case result == "local_error":
		// The ingress's own limit: nothing about the engine. A refused
		// client certificate ejects the engine like a connect error (one
		// engine with a wrong trust bundle would be picked forever); its
		// probe readmits it once a handshake succeeds (upstreamtls.go).
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
		c.s.log.Debug("upstream attempt failed", "request_id", string(c.requestID()), "engine", up.id, "result", result, "err", err)
	}
	if result == "protocol_error" {
		err = errUnreadableAnswer
	}
	if stallCut {
		err = &stallCutError{after: c.s.cfg.Health.StallAfter, cause: err}
	}
	switch result {
	case "local_error":
		return fmt.Errorf("%w: no connection to engine %s: %w", ErrLocalResources, up.id, localErrno(err))
	case "client_cert_refused":
		err = fmt.Errorf("%w: engine %s refused it: %w", ErrClientCertRefused, up.id, err)
	case "credential_refused":
		err = fmt.Errorf("%w: engine %s %w", ErrEngineCredential, up.id, err)
	case "first_byte_timeout":
		err = fmt.Errorf("%w: engine %s answers its health probes but committed no answer within %v (not retried: another engine would start over): %w",
			ErrFirstByteTimeout, up.id, c.s.cfg.firstByteWait(), err)
	case "timeout", "connect_timeout":
		err = fmt.Errorf("%w: engine %s: %w", ErrUpstreamTimout, up.id, err)
	default:
		err = fmt.Errorf("%w: engine %s: %w", ErrUpstream, up.id, err)
	}
	return &upstreamError{msg: clientText(err), err: err}
}

// upstreamError is a failed attempt as its client reads it (Error: the
// engine's id and the cause) and as the log keeps it (Unwrap: the whole
// error, with the addresses docs/SECURITY.md keeps from clients).
type upstreamError struct {
	msg string
	err error
}

func (e *upstreamError) Error() string { return e.msg }
func (e *upstreamError) Unwrap() error { return e.err }

// logText is err's text for the log: an upstreamError's client text
// replaced by its whole error.
func logText(msg string, err error) string {
	if ue, ok := errors.AsType[*upstreamError](err); ok {
		return strings.Replace(msg, ue.msg, ue.err.Error(), 1)
	}
	return msg
}

// clientText is err's text without the addresses a net.OpError names
// ("dial tcp 10.0.0.7:8000: connect: connection refused" reads "dial:
// connect: connection refused") or a failed lookup's host and server.
func clientText(err error) string {
	text := netClientText(err)
	if errors.Is(err, fasthttp.ErrConnectionClosed) { // its text advises the engine's author ("make sure the server returns 'Connection: close'...")
		text = strings.Replace(text, fasthttp.ErrConnectionClosed.Error(), errClosedEarly, 1)
	}
	if te, ok := errors.AsType[*engineTLSError](err); ok { // x509's text may name the engine's address
		text = strings.Replace(text, te.Error(), te.clientText(), 1)
	}
	return text
}

// stallCutError is an attempt the stall watch cut on a hung engine: the
// ingress closed the connection, not the engine (health.go).
type stallCutError struct {
	after time.Duration
	cause error
}

func (e *stallCutError) Error() string {
	return fmt.Sprintf("the engine stalled (no byte for %v, its health probes unanswered): the ingress cut the request", e.after)
}
func (e *stallCutError) Unwrap() error { return e.cause }

// errClosedEarly is what a client reads for fasthttp.ErrConnectionClosed.
const errClosedEarly = "the engine closed the connection before answering"

// netClientText is clientText for a net.OpError.
func netClientText(err error) string {
	text := err.Error()
	oe, ok := errors.AsType[*net.OpError](err)
	if !ok || oe.Op == "remote error" { // a TLS alert names no address
		return text
	}
	cause := "failed"
	if dns, ok := errors.AsType[*net.DNSError](oe.Err); ok {
		cause = "lookup: " + dns.Err
	} else if oe.Err != nil {
		cause = oe.Err.Error()
	}
	if full := oe.Error(); strings.Contains(text, full) {
		return strings.Replace(text, full, oe.Op+": "+cause, 1)
	}
	return oe.Op + ": " + cause // the address is somewhere in text: keep none of it
}

// classifyErr names an attempt's transport error: "local_error" (the
// ingress is out of its own resources: localErrno), "client_cert_refused"
// (the engine refused this ingress's TLS certificate), "connect_timeout" (the
// dial did not complete in time), "timeout",
// "protocol_error" (the engine answered, with something the ingress
// cannot read as HTTP: isProtocolErr) or "connect_error" (no connection,
// or it dropped).
func classifyErr(err error) string {
	if localErrno(err) != 0 {
		return "local_error"
	}
	if refusedOurCert(err) {
		return "client_cert_refused" // upstreamtls.go: the ingress's certificate, not the engine
	}
	if oe, ok := errors.AsType[*net.OpError](err); ok && oe.Op == "dial" && oe.Timeout() {
		return "connect_timeout"
	}
	var ne net.Error
	if errors.Is(err, fasthttp.ErrTimeout) || (errors.As(err, &ne) && ne.Timeout()) {
		return "timeout"
	}
	if isProtocolErr(err) {
		return "protocol_error"
	}
	return "connect_error"
}

// localErrno is err's errno when it says the ingress itself ran out of a
// resource opening a connection: file descriptors (EMFILE, the process's;
// ENFILE, the host's), kernel buffers or memory (ENOBUFS, ENOMEM), or
// ephemeral ports (EADDRNOTAVAIL). 0 otherwise. The errno alone is what a
// client is told: it names no address.
func localErrno(err error) syscall.Errno {
	var errno syscall.Errno
	if errors.As(err, &errno) {
		switch errno {
		case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.EADDRNOTAVAIL:
			return errno
		}
	}
	return 0
}

// errUnreadableAnswer is what a client learns of a protocol error: not
// fasthttp's text, which may quote the engine's answer.
var errUnreadableAnswer = fmt.Errorf("the engine's answer is not readable HTTP (malformed, or a head over %d bytes)", maxUpstreamHead)

// isProtocolErr reports whether err is fasthttp's verdict on an answer it
// read and could not parse (a head over the read buffer, a malformed
// status line or header, a broken chunk), as opposed to a connection that
// failed or closed (io.EOF, a net.Error, a reset), which wraps its cause.
func isProtocolErr(err error) bool {
	var small *fasthttp.ErrSmallBuffer
	var chunk fasthttp.ErrBrokenChunk
	switch {
	case errors.As(err, &small), errors.As(err, &chunk):
		return true
	case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, fasthttp.ErrConnectionClosed):
		return false
	}
	var ne net.Error
	var se syscall.Errno
	if errors.As(err, &ne) || errors.As(err, &se) {
		return false
	}
	for _, pe := range responseParseErrs {
		if errors.Is(err, pe) {
			return true
		}
	}
	// Other head parse errors are fasthttp's unwrapped texts under this prefix.
	return strings.HasPrefix(err.Error(), "error when reading response headers")
}

var responseParseErrs = [...]error{fasthttp.ErrResponseFirstLineMissingSpace, fasthttp.ErrUnexpectedStatusCodeChar,
	fasthttp.ErrNonNumericChars, fasthttp.ErrDuplicateContentLength, fasthttp.ErrUnsupportedTransferEncoding,
	fasthttp.ErrSmallReadBuffer, fasthttp.ErrReadingResponseHeaders}

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
	if n := resp.Header.ContentLength(); n > 0 && n <= maxUpstreamBody {
		// Room for the whole answer at once (and ReadFrom's last probe for
		// more): not a doubling copy per step up to it.
		buf.Grow(n + bytes.MinRead)
	}
	lr := limitPool.Get().(*io.LimitedReader)
	lr.R, lr.N = r, maxUpstreamBody+1
	_, err := buf.ReadFrom(lr)
	lr.R = nil
	limitPool.Put(lr)
	if err == nil && buf.Len() > maxUpstreamBody {
		err = fmt.Errorf("%w: the engine's answer is over %d bytes", ErrAnswerTooLarge, maxUpstreamBody)
	}
	return buf, err
}

// relayRead relays an engine's non-200 answer whose body readAll read
// (buf, err).
func (c *call) relayRead(ctx *fasthttp.RequestCtx, up *upstream, resp *fasthttp.Response, st int, buf *bytes.Buffer, err error) {
	c.watch.release()
	c.releaseConn()
	_ = resp.CloseBodyStream()
	ctx.SetStatusCode(st)
	ctx.SetContentTypeBytes(resp.Header.ContentType())
	c.s.setEngineHeader(ctx, up.id)
	c.passUpstreamHeaders(ctx, resp) // upstreamhdr.go
	var out []byte
	if err == nil {
		var rewritten bool
		if out, rewritten = engineErrorBody(st, buf.Bytes(), messagesPath(ctx.Path())); rewritten {
			ctx.SetContentType("application/json")
		}
	}
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	c.status = st
	c.errMsg = fmt.Sprintf("engine answered %d", st)
	c.sendAnswer(ctx, buf, out) // answerbody.go: finished once written
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
		c.fail(ctx, fmt.Errorf("engine %s: %w", up.id, err))
		c.finish()
		return true, nil
	}
	if err != nil {
		bufPool.Put(buf)
		return false, c.attemptFailed(up, resp, classifyErr(err), err)
	}
	c.watch.release()
	out := buf.Bytes()
	if !closedObject(out) {
		// An engine that dies mid-request may close with an empty 200 (or
		// one cut short: its Content-Length counted what it meant to send).
		bufPool.Put(buf)
		return false, c.attemptFailed(up, resp, "empty_response", errors.New("empty, non-JSON or cut-short answer"))
	}
	// The object alone: what reads it (usage, the chat form) starts at its '{'.
	out = bytes.TrimSpace(out)
	c.passUpstreamHeaders(ctx, resp) // upstreamhdr.go
	c.releaseConn()
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	c.s.m.attemptOK.Inc()
	c.s.health.ok(up, c.attemptAt)
	c.took = true
	c.outTokens = usageCompletionTokens(out)
	c.readUsage(out) // tokencheck.go
	if c.ep == epOther && hasUsage(out) {
		// An embeddings-family answer's usage: its prompt tokens as the
		// engine counted them (promptCount), the only count there is.
		c.engPrompt = usagePromptTokens(c.ep, out)
	}
	if c.ep == epResponses || c.ep == epMessages {
		if i := bytes.LastIndex(out, outTokensKey); i >= 0 {
			c.outTokens = uintAt(out, i+len(outTokensKey))
		}
	}
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("application/json")
	c.s.setEngineHeader(ctx, up.id)
	if c.wrap {
		out = completionToChat(nil, out)
	}
	c.status = fasthttp.StatusOK
	c.observeMatch()
	c.sendAnswer(ctx, buf, out) // answerbody.go: finished once written
	return true, nil
}

// maxErrorBody bounds what is read of an engine's 5xx answer for its message.
const maxErrorBody = 4 << 10

// engineSays is ": " and the message of an engine's 5xx answer when it is an
// error in one of the JSON shapes engines use (errorMessage), clipped; ""
// otherwise (an HTML page, a text, nothing): the client's 503 then says
// what the engine said ("CUDA out of memory"), not only its status, and no
// page of a proxy in front of it.
func engineSays(resp *fasthttp.Response) string {
	body := resp.Body()
	if r := resp.BodyStream(); r != nil {
		b := make([]byte, maxErrorBody) // an error path: the engine failed
		n, _ := io.ReadFull(r, b)
		body = b[:n]
	}
	if len(body) == 0 || len(body) >= maxErrorBody || body[0] != '{' || !json.Valid(body) {
		return ""
	}
	msg := strings.TrimSpace(errorMessage(body))
	if msg == "" || msg == string(body) {
		return ""
	}
	return ": " + clip(msg)
}

// closedObject reports whether a non-streamed answer is one whole JSON
// object (white space around it allowed): one cut short is not relayed as a
// success, at an object's end too (`{"choices":[{"text":"a"}` ends in '}').
// jsonscan's skip checks the structure without building anything.
func closedObject(out []byte) bool {
	i := jsonscan.SkipWS(out, 0) // white space before it is JSON's too
	if i >= len(out) || out[i] != '{' {
		return false
	}
	end, err := jsonscan.SkipValue(out, i)
	return err == nil && jsonscan.Trailing(out, end) == nil
}

// firstEventJSON reports whether a chat or completions stream's first event
// (without its blank line; LF line ends) carries JSON or [DONE] in its one
// data line; an event with no data line (a comment) or several passes.
func firstEventJSON(ev []byte) bool {
	var data []byte
	n := 0
	for line := range bytes.Lines(ev) {
		if rest, ok := bytes.CutPrefix(line, []byte("data:")); ok {
			data, n = bytes.TrimSpace(rest), n+1
		}
	}
	return n != 1 || bytes.Equal(data, doneMarker) || json.Valid(data)
}

// streamBroke counts a stream that broke after it committed (the engine's
// connection died, or went silent for the idle timeout) against the engine
// for passive ejection; the request itself is not retried, bytes went out.
func (c *call) streamBroke(up *upstream) {
	up.failures.Add(1)
	c.s.health.observe(up, "stream_error")
}

// clientClosedStatus is the 499's reason phrase.
var clientClosedStatus = []byte("Client Closed Request")

// clientGone ends a request whose client went away before its answer; the
// status is recorded, nothing can be written.
func (c *call) clientGone(ctx *fasthttp.RequestCtx) {
	c.status = 499
	c.errMsg = "client closed the connection"
	ctx.SetStatusCode(499)
	// nginx's name for it: a client that only shut its sending side may
	// still read this line (fasthttp would say "Unknown Status Code").
	ctx.Response.Header.SetStatusMessage(clientClosedStatus)
	// A client that can still read the line can match it to the access
	// log, as every other answer (h-reg7 F4).
	c.setRequestIDHeader(ctx)
	if c.engine != "" {
		c.s.setEngineHeader(ctx, c.engine)
	}
	ctx.SetConnectionClose()
	c.finish()
}

func (c *call) matchRatio() float64 {
	keys := c.keysOf(c.engine) // the chain of the engine's block size
	if len(keys) == 0 {
		return 0
	}
	return min(float64(c.match.Spec)/float64(len(keys)), 1)
}

// observeMatch records the answer's prefix match ratio, unless its prompt
// has no full block (or was not keyed): nothing could match, and a 0 would
// read as a miss.
func (c *call) observeMatch() {
	if len(c.keys) > 0 {
		c.s.m.matchRatio.Observe(c.matchRatio())
	}
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
		if ps.named != nil { // the event that failed, past the preamble (response.created)
			first, _ = ps.named.firstEvent(ps.buf[:ps.cut])
		}
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
	if ps.cut > 0 && result == "" && !reqErr && ps.named == nil && !firstEventJSON(ps.buf[:bytes.Index(ps.buf, eventSep)]) {
		// Not an answer (a broken or foreign server): nothing useful can
		// reach the client, and the next engine may serve it. Before, it
		// was committed and the client got the garbage with a 200.
		ps.cut, ps.upErr, result = 0, fmt.Errorf("engine %s sent a first event that is not JSON: %.200q", up.id, ps.buf[:bytes.Index(ps.buf, eventSep)]), "empty_response"
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
		c.took = true         // a request refused in its first event was not taken
	}
	// The engine's health, and the attempts metric, hear of the attempt
	// when the stream ends (proxyStream.endWith, CloseWithError): one that
	// breaks mid-way is no success (one result per attempt), and a success
	// here reset the ejection backoff of an engine that breaks every
	// stream, readmitting it at the shortest ejection time each time.
	c.observeMatch()
	c.status = fasthttp.StatusOK
	ctx.SetStatusCode(fasthttp.StatusOK)
	ctx.SetContentType("text/event-stream")
	ctx.Response.Header.Set("Cache-Control", "no-cache")
	c.s.setEngineHeader(ctx, up.id)
	c.passUpstreamHeaders(ctx, resp) // upstreamhdr.go
	setStreamBody(ctx, ps)
	return true, nil
}

// setStreamBody makes r the answer's body, of a length not known: chunked
// to an HTTP/1.1 client. An HTTP/1.0 client cannot read chunked framing
// (RFC 9112 §6.1 forbids sending it one), so its answer is delimited by the
// connection's close, as vLLM's uvicorn sends it: fasthttp frames every
// body stream, so the connection is taken over (hijacked) and the head and
// r written on it as they come. fasthttp closes the connection after.
func setStreamBody(ctx *fasthttp.RequestCtx, r io.Reader) {
	if ctx.Request.Header.IsHTTP11() || ctx.IsHead() {
		ctx.Response.SetBodyStream(r, -1)
		return
	}
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(conn net.Conn) { writeCloseDelimited(ctx, conn, r) })
}

// writeCloseDelimited writes ctx's answer head, without a length and with
// Connection: close, then r as it comes, to conn; then closes r as fasthttp
// closes a body stream it wrote (with the write's error, if any).
func writeCloseDelimited(ctx *fasthttp.RequestCtx, conn net.Conn, r io.Reader) {
	h := &ctx.Response.Header
	h.Del(fasthttp.HeaderConnection) // fasthttp's keep-alive for an HTTP/1.0 client that asked for it
	h.SetContentLength(-2)           // no Content-Length nor Transfer-Encoding; Connection: close
	_, err := conn.Write(h.Header())
	if err == nil {
		buf := make([]byte, streamBufSize)
		for {
			n, rerr := r.Read(buf)
			if n > 0 {
				if _, err = conn.Write(buf[:n]); err != nil {
					break
				}
			}
			if rerr != nil {
				if rerr != io.EOF {
					err = rerr
				}
				break
			}
		}
	}
	// One close, as fasthttp's closeBodyStream: a stream's close ends its
	// call, which goes back to its pool.
	if c, ok := r.(fasthttp.ReadCloserWithError); ok {
		_ = c.CloseWithError(err)
	} else if c, ok := r.(io.Closer); ok {
		_ = c.Close()
	}
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
