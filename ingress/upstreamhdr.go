package ingress

import "github.com/valyala/fasthttp"

// forwardHeaders are the client's request headers every upstream request
// carries: vLLM takes its request id from X-Request-Id (its logs and answer
// ids then match the caller's), and its OpenTelemetry tracing continues the
// caller's trace from the W3C trace context. Other client headers stay at
// the ingress (the client's credentials above all).
var forwardHeaders = [...]string{"X-Request-Id", "Traceparent", "Tracestate", "Baggage"}

// keepForwardHeaders copies the client's forwarded headers into c (the
// request context is not to be read from a P/D leg's goroutine).
func (c *call) keepForwardHeaders(h *fasthttp.RequestHeader) {
	for i, name := range forwardHeaders {
		c.fwd[i] = append(c.fwd[i][:0], h.Peek(name)...)
	}
}

// upstreamHeaderList is what setUpstreamHeaders sets, copied for a leg that
// outlives the handler's buffers (the SGLang prefill leg's goroutine).
func (c *call) upstreamHeaderList() [][2]string {
	var out [][2]string
	if len(c.s.engineAuth) > 0 {
		out = append(out, [2]string{"Authorization", string(c.s.engineAuth)})
	}
	for i, name := range forwardHeaders {
		if len(c.fwd[i]) > 0 {
			out = append(out, [2]string{name, string(c.fwd[i])})
		}
	}
	return out
}

// setUpstreamHeaders puts the engine API key and the client's forwarded
// headers on an upstream request.
func (c *call) setUpstreamHeaders(h *fasthttp.RequestHeader) {
	if len(c.s.engineAuth) > 0 {
		h.SetBytesV("Authorization", c.s.engineAuth)
	}
	for i, name := range forwardHeaders {
		if len(c.fwd[i]) > 0 {
			h.SetBytesV(name, c.fwd[i])
		}
	}
}
