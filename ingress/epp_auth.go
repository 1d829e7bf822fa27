package ingress

import (
	"fmt"

	"github.com/valyala/fasthttp"
)

// Authenticate is the request path's authentication (header.go: identify)
// for a request a calling proxy routes without Pick: a stored response's
// GET or cancel, a model list, a request without a body. It reads in's
// Authorization, APIKey and Path (X-Api-Key counts on Anthropic's paths
// only). repeated names a credential header the request carried more than
// once ("": none), which the ingress refuses with 400 when authentication
// is on. The error is a *PickError (nil: authenticated, or authentication
// is off).
func (s *Server) Authenticate(in PickInput, repeated string) error {
	if s.deps.Auth == nil {
		return nil
	}
	var err error
	if repeated != "" {
		err = badRequest("", fmt.Errorf("%w: more than one %s header", ErrBadRequest, repeated))
	} else {
		r := fasthttp.AcquireRequest()
		defer fasthttp.ReleaseRequest(r)
		h := &r.Header
		h.SetRequestURIBytes(in.Path)
		if len(in.Authorization) > 0 {
			h.SetBytesV("Authorization", in.Authorization)
		}
		if len(in.APIKey) > 0 {
			h.SetBytesV("X-Api-Key", in.APIKey)
		}
		_, err = s.identify(h)
	}
	if err == nil {
		return nil
	}
	ae := toAPIError(err)
	s.m.requests.WithLabelValues("unknown", s.m.status(ae.status)).Inc()
	return &PickError{Status: ae.status, Body: appendErrorBody(nil, ae), Err: err}
}
