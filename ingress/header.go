package ingress

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/ingress/auth"
	"github.com/valyala/fasthttp"
)

// runner is the optional capability of a dependency that has background
// work (Deps.Auth: auth.Keys re-reading its file, auth.JWTVerifier its key
// set, alone or in an auth.Chain; Deps.Routes: a routes.Watcher polling its
// file): Start runs it and Close stops it and waits for it.
type runner interface {
	Run(stop <-chan struct{})
}

// authenticate checks h's credential when authentication is on: the
// caller's identity, or the error to answer with (400 for a repeated
// credential header, else 401).
func (s *Server) authenticate(h *fasthttp.RequestHeader) (string, error) {
	if s.deps.Auth == nil {
		return "", nil
	}
	if err := repeatedCredential(h); err != nil {
		return "", err
	}
	return s.identify(h)
}

// identify is the request path's authentication, the one every API
// request takes (inference, passthrough, and GET and cancel of a stored
// response): the caller's identity from credential(h), or 401. It does not
// check for a repeated credential header: route refused those already.
func (s *Server) identify(h *fasthttp.RequestHeader) (string, error) {
	if s.deps.Auth == nil {
		return "", nil
	}
	id, err := s.deps.Auth.Check(credential(h))
	if err != nil {
		return "", unauthorized(err)
	}
	return id, nil
}

// repeatedCredential refuses a request with more than one Authorization
// (or X-Api-Key) header: which one counts would depend on the reader (the
// ingress read the first, a proxy in front may read the last), so neither
// does.
func repeatedCredential(h *fasthttp.RequestHeader) error {
	for _, name := range [...]string{"Authorization", "X-Api-Key"} {
		if len(h.PeekAll(name)) > 1 {
			return badRequest("", fmt.Errorf("%w: more than one %s header", ErrBadRequest, name))
		}
	}
	return nil
}

// maxHeaderBytes bounds a request's head (request line and headers): 16
// KiB, what vLLM's own server (uvicorn's h11) accepts, so a client with a
// long token or cookies is served by the ingress as by the engine.
const maxHeaderBytes = 16 << 10

// unauthBodyLimit is the most an unauthenticated request may send when
// authentication is on: its body is refused with 401 before it is buffered
// (a 32 MiB limit times thousands of connections is gigabytes).
const unauthBodyLimit = 64 << 10

// headerReceived (fasthttp.Server.HeaderReceived) checks the credential of
// a request that announces a body over unauthBodyLimit (or a chunked one)
// before the body is read, when authentication is on: a failing one may
// send at most unauthBodyLimit bytes, and handleTransportError answers
// 401. Smaller requests are checked once, by the request path, as before.
// The Origin, path and request id of a request with a body (a chunked one's
// verdict too) are kept in s.heads: if its body fails to read (too large,
// malformed, or not all sent within readTimeout), fasthttp wipes its head
// before handleTransportError sees it.
func (s *Server) headerReceived(h *fasthttp.RequestHeader) fasthttp.RequestConfig {
	if !h.IsHTTP11() {
		minorVersion(h)
	}
	n := h.ContentLength()
	if n == -1 || n > 0 {
		path := uriPath(h.RequestURI())
		note := headNote{cors: s.corsIndex(h.Peek("Origin")), messages: messagesPath(path), endpoint: transportEndpoint(path),
			method: headMethod(h), path: headPath(path)}
		if id := h.Peek("X-Request-Id"); validRequestID(id) {
			note.reqID = string(id)
		}
		if n == -1 && s.deps.Auth != nil {
			_, note.authErr = s.authenticate(h)
		}
		s.heads.put(h, note)
		if note.authErr != nil {
			return fasthttp.RequestConfig{MaxRequestBodySize: unauthBodyLimit}
		}
		if n == -1 {
			return fasthttp.RequestConfig{}
		}
	}
	if s.deps.Auth == nil || n >= 0 && n <= unauthBodyLimit {
		return fasthttp.RequestConfig{}
	}
	if _, err := s.authenticate(h); err != nil {
		return fasthttp.RequestConfig{MaxRequestBodySize: unauthBodyLimit}
	}
	return fasthttp.RequestConfig{}
}

// minorVersion serves a request of a later HTTP/1 minor version (HTTP/1.2)
// as HTTP/1.1, the highest the ingress implements (RFC 9110 §6.2), kept
// alive unless it asked for close; fasthttp's parser takes any version
// other than HTTP/1.1 as HTTP/1.0. Another major version (HTTP/2.0 in an
// HTTP/1 request line) is answered 505 by handle.
func minorVersion(h *fasthttp.RequestHeader) {
	p := h.Protocol()
	if len(p) != len("HTTP/1.1") || p[5] != '1' || p[7] <= '1' {
		return
	}
	h.SetProtocol("HTTP/1.1")
	if !askedClose(h.RawHeaders()) {
		h.ResetConnectionClose() // set by the parser for a version other than 1.1
	}
}

// askedClose reports whether raw (a request's header lines as received)
// holds a Connection header with the close option: fasthttp's Peek says
// close for any HTTP/1.0 request.
func askedClose(raw []byte) bool {
	for len(raw) > 0 {
		line := raw
		if i := bytes.IndexByte(raw, '\n'); i >= 0 {
			line, raw = raw[:i], raw[i+1:]
		} else {
			raw = nil
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if ok && bytes.EqualFold(bytes.TrimSpace(name), []byte("Connection")) &&
			bytes.Contains(bytes.ToLower(value), []byte("close")) {
			return true
		}
	}
	return false
}

// headMethod is h's method for a head's note, without allocating for
// POST (every request with a body the ingress serves).
func headMethod(h *fasthttp.RequestHeader) string {
	if h.IsPost() {
		return fasthttp.MethodPost
	}
	return clipBytes(h.Method())
}

// headPath is path for a head's note, without allocating for the
// inference endpoints' paths (the requests with a body on the hot path).
func headPath(path []byte) string {
	switch string(path) {
	case "/v1/completions":
		return "/v1/completions"
	case "/v1/chat/completions":
		return "/v1/chat/completions"
	case "/v1/responses":
		return "/v1/responses"
	case "/v1/messages":
		return "/v1/messages"
	case "/v1/embeddings":
		return "/v1/embeddings"
	}
	return clipBytes(path)
}

// expect (fasthttp.Server.ExpectHandler) answers a request that sent
// "Expect: 100-continue" before its body: one the ingress will refuse
// anyway gets that answer now, without "100 Continue" (RFC 9110 §10.1.1),
// so the client does not start a body that will be cut off (and may lose
// the answer to a reset). They are the refusals handleTransportError
// makes once the body is read: a failing credential with a body over
// unauthBodyLimit or chunked (401, or 400 for a repeated one), then a Content-Length
// over MaxBodyBytes (413). fasthttp closes the connection after. A chunked
// body's size is not known yet: it is refused here only for a failing
// credential (headerReceived would cut it at unauthBodyLimit). Anything
// else gets 100.
func (s *Server) expect(ctx *fasthttp.RequestCtx) int {
	h := &ctx.Request.Header
	n := h.ContentLength()
	var err error
	if s.deps.Auth != nil && (n > unauthBodyLimit || n == -1) { // a chunked body may be any size
		_, err = s.authenticate(h)
	}
	if err == nil && n > s.cfg.MaxBodyBytes {
		err = fmt.Errorf("%w: limit is %d bytes", ErrTooLarge, s.cfg.MaxBodyBytes)
	}
	if err == nil {
		return fasthttp.StatusContinue
	}
	// fasthttp writes this response as it is (the handler does not run).
	s.heads.forget(h)
	ae := writeErrorShape(ctx, err, messagesPath(ctx.Path()))
	s.refusedUnread(ctx, ae, s.m.status(ae.status), transportEndpoint(ctx.Path()), h.Peek("X-Request-Id"),
		s.corsIndex(h.Peek("Origin")), time.Now())
	return ae.status
}

// refusedUnread finishes an answer made before any handler ran (expect,
// handleTransportError) as the handlers' refusals are finished: counted
// under its endpoint, with the client's X-Request-Id (one made when it
// sent none), CORS headers, and an access line (bounded as finishOther's).
func (s *Server) refusedUnread(ctx *fasthttp.RequestCtx, ae *apiError, status, endpoint string, id []byte, cors int, start time.Time) {
	s.m.requests.WithLabelValues(endpoint, status).Inc()
	if !validRequestID(id) {
		id = appendRequestID(nil)
	}
	ctx.Response.Header.SetBytesV("X-Request-Id", id)
	s.corsHeaders(ctx, cors)
	if s.alog != nil {
		if ok, dropped := s.otherLog.allow(start, otherLogPerSecond); ok {
			s.otherLine(ctx, endpoint, start, ae, id, dropped)
		}
	}
}

// headMemo remembers, for requests with a body, what headerReceived read
// from a request's head, keyed by the head's address: fasthttp resets the
// request, head included, when reading a body fails (a chunked one too
// large or malformed, any one cut by readTimeout), and then
// handleTransportError would see neither the credential, the Origin, the
// path nor the request id.
//
// fasthttp serves each connection with one RequestCtx (and so one head) at
// a time, so no two requests being read share a key: a note is replaced
// only by the next request on its own connection. Notes go when taken, when
// their request reaches the handler (forget), or, left by a request that
// did neither (an empty chunked body, a body refused before it was read),
// once older than ttl: by then the read of their request has ended
// (ReadTimeout bounds it), so live notes are never dropped and the map
// holds only the requests being read and a few recent ones.
type headMemo struct {
	n     atomic.Int32 // len(m), read without the lock by forget
	mu    sync.Mutex
	m     map[uintptr]headNote // by the *fasthttp.RequestHeader's address (not a pointer: nothing is kept alive)
	ttl   time.Duration
	now   func() time.Duration // monotonic (Server.mono)
	sweep int                  // sweep notes older than ttl when m grows to this
}

// headNote is what a request's head said.
type headNote struct {
	at       time.Duration // when put (headMemo.now)
	authErr  error         // the credential's verdict (nil: accepted, or authentication off)
	cors     int           // corsIndex of its Origin
	messages bool          // on the Messages API (its error shape)
	// endpoint, method, path and reqID (its valid X-Request-Id, "" for
	// none) are what the refusal's answer and access line name.
	endpoint, method, path, reqID string
}

// minHeadSweep is the size below which headMemo does not sweep.
const minHeadSweep = 256

func (m *headMemo) init(ttl time.Duration, now func() time.Duration) {
	m.m, m.ttl, m.now, m.sweep = make(map[uintptr]headNote), ttl, now, minHeadSweep
}

func (m *headMemo) put(h *fasthttp.RequestHeader, n headNote) {
	n.at = m.now()
	m.mu.Lock()
	m.m[uintptr(unsafe.Pointer(h))] = n
	if len(m.m) >= m.sweep {
		for k, v := range m.m {
			if n.at-v.at > m.ttl {
				delete(m.m, k)
			}
		}
		m.sweep = max(minHeadSweep, 2*len(m.m)) // amortized: O(1) a put
	}
	m.n.Store(int32(len(m.m)))
	m.mu.Unlock()
}

// take returns and forgets h's note; not found: an unauthenticated request.
func (m *headMemo) take(h *fasthttp.RequestHeader) headNote {
	p := uintptr(unsafe.Pointer(h))
	m.mu.Lock()
	defer m.mu.Unlock()
	n, ok := m.m[p]
	if !ok {
		return headNote{cors: -1, authErr: unauthorized(auth.ErrMissingKey)}
	}
	delete(m.m, p)
	m.n.Store(int32(len(m.m)))
	return n
}

// forget drops h's note, if any: its request was read whole. No lock while
// the memo is empty.
func (m *headMemo) forget(h *fasthttp.RequestHeader) {
	if m.n.Load() == 0 {
		return
	}
	p := uintptr(unsafe.Pointer(h))
	m.mu.Lock()
	if _, ok := m.m[p]; ok {
		delete(m.m, p)
		m.n.Store(int32(len(m.m)))
	}
	m.mu.Unlock()
}

// credential is the request's Authorization header, or its X-Api-Key as a
// bearer token on the paths of Anthropic's API (apiKeyPath), whose clients
// send the key so.
func credential(h *fasthttp.RequestHeader) []byte {
	cred := h.Peek("Authorization")
	if k := h.Peek("X-Api-Key"); len(cred) == 0 && len(k) > 0 && apiKeyPath(uriPath(h.RequestURI())) {
		cred = append([]byte("Bearer "), k...)
	}
	return cred
}

// apiKeyPath reports whether X-Api-Key is read as the credential on path:
// Anthropic's API's paths, /v1/messages (count_tokens too) and /v1/models
// (a model's card too), which its SDKs call with that header. Not elsewhere: the OpenAI API's
// clients send Authorization, and a second place for a credential on paths
// that never need one is only one more thing for a gateway in front to miss.
func apiKeyPath(path []byte) bool {
	return messagesPath(path) || string(path) == "/v1/models" || bytes.HasPrefix(path, []byte("/v1/models/"))
}

// uriPath is a request URI's path (without its query).
func uriPath(uri []byte) []byte {
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		return uri[:i]
	}
	return uri
}
