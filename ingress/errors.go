package ingress

import (
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// Sentinel errors. Stages wrap them with %w; the edge maps them to a status
// and an OpenAI error body with errors.As / errors.Is (toAPIError).
var (
	ErrBadRequest     = errors.New("invalid request")
	ErrUnauthorized   = errors.New("unauthorized")
	ErrModelNotFound  = errors.New("model not found")
	ErrTooLarge       = errors.New("request body too large")
	ErrPromptTooLong  = errors.New("prompt too long")
	ErrRateLimited    = errors.New("rate limit exceeded")
	ErrOverloaded     = errors.New("too many concurrent requests")
	ErrNoEngine       = errors.New("no engine available")
	ErrUpstream       = errors.New("upstream failed")
	ErrUpstreamTimout = errors.New("upstream timed out")
	ErrQueueTimeout   = errors.New("admission queue wait expired")
	ErrDraining       = errors.New("ingress is draining")
	ErrNotFound       = errors.New("not found")
	ErrAnswerTooLarge = errors.New("upstream answer too large")

	// ErrFirstByteTimeout: an engine that answers its health probes sent
	// no answer within Config.FirstByteTimeout (not retried elsewhere).
	ErrFirstByteTimeout = errors.New("upstream first-byte timeout")
)

// apiError is an error with everything the OpenAI error body needs.
type apiError struct {
	status     int
	typ        string
	code       string
	param      string
	msg        string
	retryAfter time.Duration // 429/503: Retry-After header when > 0
	err        error
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.err }

func newAPIError(status int, typ, code, param string, err error) *apiError {
	return &apiError{status: status, typ: typ, code: code, param: param, msg: err.Error(), err: err}
}

// unauthorized keeps the authenticator's message and wraps ErrUnauthorized.
func unauthorized(err error) *apiError {
	return &apiError{status: 401, typ: "invalid_request_error", code: "invalid_api_key", msg: err.Error(),
		err: fmt.Errorf("%w: %w", ErrUnauthorized, err)}
}

func badRequest(param string, err error) *apiError {
	return newAPIError(fasthttp.StatusBadRequest, "invalid_request_error", "", param, err)
}

// toAPIError maps any error from the request path to its edge form.
func toAPIError(err error) *apiError {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae
	}
	switch {
	case errors.Is(err, ErrUnauthorized):
		return newAPIError(401, "invalid_request_error", "invalid_api_key", "", err)
	case errors.Is(err, ErrModelNotFound):
		return newAPIError(404, "invalid_request_error", "model_not_found", "model", err)
	case errors.Is(err, ErrTooLarge):
		return newAPIError(413, "invalid_request_error", "request_too_large", "", err)
	case errors.Is(err, ErrPromptTooLong):
		return newAPIError(400, "invalid_request_error", "context_length_exceeded", "prompt", err)
	case errors.Is(err, ErrRateLimited):
		return newAPIError(429, "rate_limit_error", "rate_limit_exceeded", "", err)
	case errors.Is(err, ErrOverloaded):
		e := newAPIError(429, "rate_limit_error", "too_many_requests", "", err)
		e.retryAfter = time.Second
		return e
	case errors.Is(err, ErrUpstreamTimout), errors.Is(err, ErrQueueTimeout), errors.Is(err, ErrFirstByteTimeout):
		return newAPIError(504, "server_error", "timeout", "", err)
	case errors.Is(err, ErrNoEngine), errors.Is(err, ErrUpstream), errors.Is(err, ErrDraining):
		e := newAPIError(503, "server_error", "service_unavailable", "", err)
		e.retryAfter = time.Second
		return e
	case errors.Is(err, ErrAnswerTooLarge):
		return newAPIError(502, "server_error", "upstream_response_too_large", "", err)
	case errors.Is(err, ErrNotFound):
		return newAPIError(404, "invalid_request_error", "not_found", "", err)
	case errors.Is(err, ErrBadRequest), errors.Is(err, jsonscan.ErrMalformed):
		return newAPIError(400, "invalid_request_error", "", "", err)
	}
	return newAPIError(500, "server_error", "internal_error", "", err)
}

// writeError writes err as an OpenAI error response.
func writeError(ctx *fasthttp.RequestCtx, err error) *apiError {
	ae := toAPIError(err)
	ctx.Response.Reset()
	ctx.SetStatusCode(ae.status)
	ctx.SetContentType("application/json")
	if ae.retryAfter > 0 {
		secs := int64((ae.retryAfter + time.Second - 1) / time.Second)
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	ctx.Response.SetBodyRaw(appendErrorBody(nil, ae))
	return ae
}

// appendErrorBody appends {"error":{"message","type","param","code"}}.
func appendErrorBody(dst []byte, ae *apiError) []byte {
	return openai.AppendError(dst, ae.msg, ae.typ, ae.param, ae.code)
}
