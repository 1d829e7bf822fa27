package ingress

import (
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"

	"github.com/valyala/fasthttp"
)

// forwardHeaders are the client's request headers every upstream request
// carries: vLLM takes its request id from X-Request-Id (its logs and answer
// ids then match the caller's), and its OpenTelemetry tracing continues the
// caller's trace from the W3C trace context. Other client headers stay at
// the ingress (the client's credentials above all).
var forwardHeaders = [...]string{"X-Request-Id", "Traceparent", "Tracestate", "Baggage"}

// fwdRequestID is X-Request-Id's index in forwardHeaders.
const fwdRequestID = 0

// maxRequestID bounds a client's X-Request-Id: an engine echoes it in its
// answer's head (vLLM with --enable-request-id-headers, the simulator
// always), so a long one would make that head long, and a request id has
// no use for more.
const maxRequestID = 128

// validRequestID reports whether a client's request id is forwarded as it
// is: 1 to maxRequestID bytes of visible ASCII (no space, no control byte).
func validRequestID(id []byte) bool {
	if len(id) == 0 || len(id) > maxRequestID {
		return false
	}
	for _, b := range id {
		if b < 0x21 || b > 0x7e {
			return false
		}
	}
	return true
}

// appendRequestID appends a request id of the ingress's own: 32 hex digits
// (128 random bits), made without allocating.
func appendRequestID(dst []byte) []byte {
	var b [16]byte
	binary.LittleEndian.PutUint64(b[:8], rand.Uint64())
	binary.LittleEndian.PutUint64(b[8:], rand.Uint64())
	return hex.AppendEncode(dst, b[:])
}

// keepForwardHeaders copies the client's forwarded headers into c (the
// request context is not to be read from a P/D leg's goroutine). The
// request id is the client's X-Request-Id when it is valid
// (validRequestID), else one the ingress makes: every request has one, sent
// upstream (vLLM names the request by it), returned to the client and
// written in the access log.
func (c *call) keepForwardHeaders(h *fasthttp.RequestHeader) {
	for i, name := range forwardHeaders {
		c.fwd[i] = append(c.fwd[i][:0], h.Peek(name)...)
	}
	if id := c.fwd[fwdRequestID]; !validRequestID(id) {
		c.fwd[fwdRequestID] = appendRequestID(id[:0])
	}
}

// requestID is the request's id (keepForwardHeaders).
func (c *call) requestID() []byte { return c.fwd[fwdRequestID] }

// forwardCopy is a copy of the client's forwarded headers, for a leg that
// may outlive the call's buffers (the SGLang prefill leg's goroutine).
func (c *call) forwardCopy() (out [len(forwardHeaders)][]byte) {
	for i := range c.fwd {
		out[i] = bytes.Clone(c.fwd[i])
	}
	return out
}

// setUpstreamHeaders puts the engine API key and the client's forwarded
// headers on an upstream request.
func (c *call) setUpstreamHeaders(h *fasthttp.RequestHeader) {
	c.s.putUpstreamHeaders(h, func(i int) []byte { return c.fwd[i] })
}

// putUpstreamHeaders puts the engine API key on h, the hop header with
// the ingress's id (an ingress refuses a request that carries it: loop.go)
// and forwardHeaders[i] with value fwd(i) when it is not empty.
func (s *Server) putUpstreamHeaders(h *fasthttp.RequestHeader, fwd func(i int) []byte) {
	if len(s.engineAuth) > 0 {
		h.SetBytesV("Authorization", s.engineAuth)
	}
	h.Set(hopHeader, s.cfg.ID)
	for i, name := range forwardHeaders {
		if v := fwd(i); len(v) > 0 {
			h.SetBytesV(name, v)
		}
	}
}

// passUpstreamHeaders puts the request id on the client's response
// (streamed or not) and notes the engine's X-Request-Id when it differs:
// vLLM run with --enable-request-id-headers echoes the id it was sent, so
// the client, the access log and the engine's logs name the request alike.
// An engine that answers another id (one that makes its own) does not
// change what the client gets, the id the ingress logged and sent; the
// access log has the engine's as engine_request_id. The engine's other
// headers stay at the ingress (the answer's framing is the ingress's own).
func (c *call) passUpstreamHeaders(ctx *fasthttp.RequestCtx, resp *fasthttp.Response) {
	c.setRequestIDHeader(ctx)
	if v := resp.Header.Peek("X-Request-Id"); len(v) > 0 && !bytes.Equal(v, c.requestID()) {
		c.engineReqID = append(c.engineReqID[:0], v[:min(len(v), maxRequestID)]...)
	}
}

// setRequestIDHeader puts the request id on the client's response (its
// answer, or its error: writeError resets the response, so after it).
func (c *call) setRequestIDHeader(ctx *fasthttp.RequestCtx) {
	if id := c.requestID(); len(id) > 0 {
		ctx.Response.Header.SetBytesV("X-Request-Id", id)
	}
}
