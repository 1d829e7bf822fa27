package ingress

import (
	"bytes"

	"github.com/valyala/fasthttp"
)

// CORS lets browser applications call the client port, as vLLM's server
// allows (its --allowed-origins, default every origin): a preflight (OPTIONS
// with Access-Control-Request-Method) is answered here with 204, and answers
// to an allowed Origin carry Access-Control-Allow-Origin. Credentials
// (cookies) are never allowed: clients authenticate with bearer tokens,
// which a browser sends only when the page adds them. Off unless
// Config.CORSOrigins is set.

// corsAllowed returns the Access-Control-Allow-Origin value for origin, or
// nil when it is not allowed.
func (s *Server) corsAllowed(origin []byte) []byte {
	for _, o := range s.cfg.CORSOrigins {
		if o == "*" {
			return []byte("*")
		}
		if o == string(origin) {
			return origin
		}
	}
	return nil
}

// cors applies the CORS headers to ctx's answer; true means ctx was a
// preflight and is answered.
func (s *Server) cors(ctx *fasthttp.RequestCtx) bool {
	if len(s.cfg.CORSOrigins) == 0 {
		return false
	}
	origin := ctx.Request.Header.Peek("Origin")
	if len(origin) == 0 {
		return false
	}
	allow := s.corsAllowed(origin)
	if allow == nil {
		return false // no CORS headers: the browser refuses the answer
	}
	h := &ctx.Response.Header
	h.SetBytesV("Access-Control-Allow-Origin", allow)
	if !bytes.Equal(allow, []byte("*")) {
		h.Add("Vary", "Origin")
	}
	h.Set("Access-Control-Expose-Headers", "X-Kvmesh-Engine, X-Request-Id, Retry-After")
	if !ctx.IsOptions() || len(ctx.Request.Header.Peek("Access-Control-Request-Method")) == 0 {
		return false
	}
	h.Set("Access-Control-Allow-Methods", "GET, POST, OPTIONS")
	if rh := ctx.Request.Header.Peek("Access-Control-Request-Headers"); len(rh) > 0 {
		h.SetBytesV("Access-Control-Allow-Headers", rh)
	}
	h.Set("Access-Control-Max-Age", "600")
	ctx.SetStatusCode(fasthttp.StatusNoContent)
	return true
}
