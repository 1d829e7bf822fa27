package ingress

import (
	"bytes"
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

	// ErrBodyBudget: the request bodies this ingress holds would pass
	// Config.MaxBodyBytesInFlight, its own memory bound (bodybudget.go).
	ErrBodyBudget = errors.New("request bodies in flight at this ingress's memory bound")

	// ErrFirstByteTimeout: an engine that answers its health probes sent
	// no answer within Config.FirstByteTimeout (not retried elsewhere).
	ErrFirstByteTimeout = errors.New("upstream first-byte timeout")
	// ErrEnginesShedding: every engine tried answered 429.
	ErrEnginesShedding = errors.New("engines shedding load")
	// ErrLocalResources: the ingress could not open a connection for want
	// of its own resources (file descriptors, ephemeral ports, buffers),
	// not the engine's fault: not retried elsewhere, no ejection.
	ErrLocalResources = errors.New("the ingress is out of resources (its own limit, not the engine's)")
	// ErrClientCertRefused: an engine refused the ingress's own TLS
	// client certificate (expired, from a CA the engine does not trust,
	// missing): the ingress's configuration, not the engine's failure.
	ErrClientCertRefused = errors.New("an engine refused this ingress's TLS client certificate (its upstream certificate: the ingress's configuration, not the engine's failure)")
	// ErrEngineCredential: an engine answered 401 to the ingress. The
	// client's own credential never goes upstream, so it is the ingress's
	// engine key (engineAPIKey) the engine refused: its configuration,
	// not the client's key, and never relayed as the client's 401.
	ErrEngineCredential = errors.New("an engine refused this ingress's engine credential (engineAPIKey or $KVMESH_ENGINE_API_KEY: the ingress's configuration, not the client's key)")
)

// apiError is an error with everything the OpenAI error body needs.
type apiError struct {
	status     int
	typ        string
	code       string
	param      string
	msg        string
	retryAfter time.Duration // 429/503: Retry-After header when > 0
	allow      string        // 405: the Allow header (RFC 9110 §15.5.6)
	err        error
}

func (e *apiError) Error() string { return e.msg }
func (e *apiError) Unwrap() error { return e.err }

func newAPIError(status int, typ, code, param string, err error) *apiError {
	return &apiError{status: status, typ: typ, code: code, param: param, msg: err.Error(), err: err}
}

// retrySoon is an API error the client may retry after a second
// (Retry-After: 1): shedding or an outage expected to be short.
func retrySoon(status int, typ, code, param string, err error) *apiError {
	e := newAPIError(status, typ, code, param, err)
	e.retryAfter = time.Second
	return e
}

// methodNotAllowed is a 405 naming the methods path takes.
func methodNotAllowed(allow string, method, path []byte) *apiError {
	ae := newAPIError(fasthttp.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "",
		fmt.Errorf("%w: %s %s: use %s", ErrBadRequest, clipBytes(method), clipBytes(path), allow))
	ae.allow = allow
	return ae
}

// unauthorized keeps the authenticator's message and wraps ErrUnauthorized.
func unauthorized(err error) *apiError {
	return &apiError{status: 401, typ: "invalid_request_error", code: "invalid_api_key", msg: err.Error(),
		err: fmt.Errorf("%w: %w", ErrUnauthorized, err)}
}

// promptTooLong is ErrPromptTooLong's 400 on ep, its param the member that
// holds the prompt there. Its message says "maximum context length", as
// vLLM's and OpenAI's do: clients recognise an overflow by that text, not
// by the code (LangChain's ContextOverflowError).
func promptTooLong(ep endpoint, format string, args ...any) *apiError {
	return newAPIError(fasthttp.StatusBadRequest, "invalid_request_error", "context_length_exceeded", ep.promptParam(),
		fmt.Errorf("%w: "+format, append([]any{ErrPromptTooLong}, args...)...))
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
	case errors.Is(err, ErrPrefillFull):
		return retrySoon(429, "rate_limit_error", "prefill_queue_full", "", err)
	case errors.Is(err, ErrOverloaded):
		return retrySoon(429, "rate_limit_error", "too_many_requests", "", err)
	case errors.Is(err, ErrUpstreamTimout), errors.Is(err, ErrQueueTimeout), errors.Is(err, ErrFirstByteTimeout):
		return newAPIError(504, "server_error", "timeout", "", err)
	case errors.Is(err, ErrBodyBudget):
		return retrySoon(503, "server_error", "ingress_body_budget_exhausted", "", err)
	case errors.Is(err, ErrLocalResources):
		return retrySoon(503, "server_error", "ingress_resource_exhausted", "", err)
	case errors.Is(err, ErrClientCertRefused):
		return retrySoon(503, "server_error", "ingress_client_certificate_refused", "", err)
	case errors.Is(err, ErrEngineCredential):
		return retrySoon(503, "server_error", "ingress_engine_credential_refused", "", err)
	case errors.Is(err, ErrNoEngine), errors.Is(err, ErrUpstream), errors.Is(err, ErrDraining):
		return retrySoon(503, "server_error", "service_unavailable", "", err)
	case errors.Is(err, ErrAnswerTooLarge):
		return newAPIError(502, "server_error", "upstream_response_too_large", "", err)
	case errors.Is(err, ErrNotFound):
		return newAPIError(404, "invalid_request_error", "not_found", "", err)
	case errors.Is(err, ErrBadRequest), errors.Is(err, jsonscan.ErrMalformed):
		return newAPIError(400, "invalid_request_error", "", "", err)
	}
	return newAPIError(500, "server_error", "internal_error", "", err)
}

// shedError is an attempt an engine refused with 429 (it sheds load), with
// the wait its Retry-After asked for.
type shedError struct {
	err   error
	after time.Duration
}

func (e *shedError) Error() string { return e.err.Error() }
func (e *shedError) Unwrap() error { return e.err }

// shedding follows a request's attempts: when every one was refused with
// 429 the client gets 429 too, with the soonest Retry-After the engines
// gave, and not the 503 of a failed upstream; when every engine ranked
// answered that it does not serve the adapter, 404 (verdict).
type shedding struct {
	shed, other int
	denied      int // attempts an engine answered that it does not serve the adapter (errAdapterDenied)
	after       time.Duration
}

func (s *shedding) add(err error) {
	var se *shedError
	switch {
	case err == nil:
	case errors.As(err, &se):
		if s.shed == 0 || se.after < s.after {
			s.after = se.after
		}
		s.shed++
	case errors.Is(err, errAdapterDenied):
		s.denied++
	default:
		s.other++
	}
}

// verdict returns the error to answer with: last, a 429 when every
// attempt shed load, or a 404 when each of the ranked engines answered
// that it does not serve the adapter sent as model.
func (s *shedding) verdict(last error, ranked int, model string) error {
	if s.denied > 0 && s.denied == ranked && s.shed+s.other == 0 {
		return adapterNotFound(model, s.denied)
	}
	if s.shed == 0 || s.other > 0 {
		return last
	}
	return &apiError{status: fasthttp.StatusTooManyRequests, typ: "rate_limit_error", code: "engine_overloaded",
		msg:        fmt.Sprintf("every engine tried is shedding load (%d answered 429); retry later: %v", s.shed, last),
		retryAfter: s.after, err: fmt.Errorf("%w: %w", ErrEnginesShedding, last)}
}

// maxRetryAfter bounds an engine's Retry-After passed on to clients.
const maxRetryAfter = time.Hour

// retryAfter reads a Retry-After header (seconds or an HTTP date) as a wait
// from now: at least 1s (also when absent or unreadable), at most
// maxRetryAfter.
func retryAfter(v []byte, now time.Time) time.Duration {
	d := time.Second
	if n, err := strconv.ParseUint(string(v), 10, 32); err == nil {
		d = time.Duration(n) * time.Second
	} else if t, err := fasthttp.ParseHTTPDate(v); err == nil {
		d = t.Sub(now)
	}
	return min(max(d, time.Second), maxRetryAfter)
}

// writeError writes err as an OpenAI error response, or in Anthropic's
// shape on the Messages API's paths (messagesPath). It replaces whatever
// answer ctx held; the server adds the CORS headers after (cors.go).
func writeError(ctx *fasthttp.RequestCtx, err error) *apiError {
	return writeErrorShape(ctx, err, messagesPath(ctx.Path()))
}

// writeErrorShape is writeError in Anthropic's shape when messages is set.
func writeErrorShape(ctx *fasthttp.RequestCtx, err error, messages bool) *apiError {
	ae := toAPIError(err)
	ctx.Response.Reset()
	ctx.SetStatusCode(ae.status)
	if ae.status == StatusClientClosed {
		ctx.Response.Header.SetStatusMessage(clientClosedStatus) // proxy.go
	}
	ctx.SetContentType("application/json")
	if ae.retryAfter > 0 {
		secs := int64((ae.retryAfter + time.Second - 1) / time.Second)
		ctx.Response.Header.Set("Retry-After", strconv.FormatInt(secs, 10))
	}
	if ae.allow != "" {
		ctx.Response.Header.Set("Allow", ae.allow)
	}
	if messages {
		ctx.Response.SetBodyRaw(appendMessagesError(nil, ae))
	} else {
		ctx.Response.SetBodyRaw(appendErrorBody(nil, ae))
	}
	return ae
}

// messagesPath reports whether path is the Messages API's (/v1/messages and
// below it, e.g. count_tokens), whose clients read Anthropic's error shape.
func messagesPath(path []byte) bool {
	const p = "/v1/messages"
	return bytes.HasPrefix(path, []byte(p)) && (len(path) == len(p) || path[len(p)] == '/')
}

// appendErrorBody appends {"error":{"message","type","param","code"}}.
func appendErrorBody(dst []byte, ae *apiError) []byte {
	return openai.AppendError(dst, ae.msg, ae.typ, ae.param, ae.code)
}
