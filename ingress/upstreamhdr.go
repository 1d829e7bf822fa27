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
// request context is not to be read from a P/D leg's goroutine). A client
// request id that is not valid (validRequestID) is replaced by one the
// ingress makes.
func (c *call) keepForwardHeaders(h *fasthttp.RequestHeader) {
	for i, name := range forwardHeaders {
		c.fwd[i] = append(c.fwd[i][:0], h.Peek(name)...)
	}
	if id := c.fwd[fwdRequestID]; len(id) > 0 && !validRequestID(id) {
		c.fwd[fwdRequestID] = appendRequestID(id[:0])
	}
}

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

// putUpstreamHeaders puts the engine API key on h and forwardHeaders[i]
// with value fwd(i) when it is not empty.
func (s *Server) putUpstreamHeaders(h *fasthttp.RequestHeader, fwd func(i int) []byte) {
	if len(s.engineAuth) > 0 {
		h.SetBytesV("Authorization", s.engineAuth)
	}
	for i, name := range forwardHeaders {
		if v := fwd(i); len(v) > 0 {
			h.SetBytesV(name, v)
		}
	}
}

// passHeaders are the engine's response headers the client gets with its
// answer (streamed or not): vLLM run with --enable-request-id-headers
// answers with X-Request-Id (the client's, or the id it made), so a caller
// finds its request in the engine's logs and traces. The engine's other
// headers stay at the ingress (the answer's framing is the ingress's own).
var passHeaders = [...]string{"X-Request-Id"}

// passUpstreamHeaders copies passHeaders from an engine's answer to the
// client's response, when the engine sent them.
func passUpstreamHeaders(dst *fasthttp.ResponseHeader, src *fasthttp.ResponseHeader) {
	for _, name := range passHeaders {
		if v := src.Peek(name); len(v) > 0 {
			dst.SetBytesV(name, v)
		}
	}
}
