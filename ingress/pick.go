package ingress

import (
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/scheduler"
)

// This file lets a proxy that is not this server use the ingress's routing
// decision: the gateway's endpoint picker (epp/) hands over a request's
// headers and body, gets the same ranking the ingress would proxy down, and
// reports back what the data plane did. The decision runs through the very
// code the ingress runs (call.prepare: parse, candidates, tokenize, limits,
// admission, keys, schedule, session affinity), so both make the same choice
// for the same request and index; only the proxying is the caller's.

// PickInput is one request as the calling proxy saw it.
type PickInput struct {
	Chat bool // POST /v1/chat/completions; false: /v1/completions
	// Responses: POST /v1/responses (the Responses API; Chat is ignored).
	Responses bool
	// Messages: POST /v1/messages (Anthropic's Messages API; Chat is
	// ignored).
	Messages bool
	// Other: one of the engine's other JSON endpoints (embeddings, rerank,
	// score, tokenize…: passthrough.go), routed by load among the engines
	// of its model, with Path naming it.
	Other bool
	// Path is the endpoint's path as the ingress serves it (X-Api-Key
	// counts on Anthropic's paths only; a model route reads an Other
	// request's); nil: the endpoint's own.
	Path []byte
	// Body is the client's JSON body. It must stay unchanged until the
	// Picked is done (the decision keeps slices into it).
	Body          []byte
	Authorization []byte // the Authorization header, nil when absent
	SessionID     []byte // the X-Session-ID header, nil when absent
	APIKey        []byte // the X-Api-Key header, nil when absent
	RequestID     []byte // the X-Request-Id header, nil when absent (epp_requestid.go)
}

// Picked is one routing decision in flight. Charge it to the engine the data
// plane uses (Start), move the charge if the data plane served another one
// (Start again), end its prefill charge at the first response byte
// (FirstByte) and release it exactly once (Done). A Picked is owned by one
// goroutine; it is pooled, so nothing may touch it after Done. With the
// kvmesh policy's router-side hold (hold.go) Pick may wait, and a request
// it released holds the next one back until Start charges it (or Done):
// call Start as soon as the data plane sends.
type Picked struct {
	c       *call
	rc      fasthttp.RequestCtx
	up      *upstream
	started bool
	first   bool
	errCode int // the first error event's status in the answer (Answer), 0 for none
}

var pickedPool = sync.Pool{New: func() any {
	p := new(Picked)
	p.rc.Init2(nil, fasthttpLogger{slog.Default()}, false)
	return p
}}

// PickError is a refusal in its edge form: the HTTP status, the OpenAI error
// body and the Retry-After seconds (0: none) for the calling proxy to send.
type PickError struct {
	Status     int
	Body       []byte
	RetryAfter int
	Err        error
}

func (e *PickError) Error() string { return e.Err.Error() }
func (e *PickError) Unwrap() error { return e.Err }

// Pick decides where in runs. On error it returns a *PickError and no Picked
// (the request is already recorded: metrics, access log). The ranking covers
// every engine that passed the scheduler's filters, best first.
func (s *Server) Pick(in PickInput) (*Picked, error) {
	p := pickedPool.Get().(*Picked)
	c := s.reqPool.Get().(*call)
	c.reset()
	ep := epCompletions
	switch {
	case in.Responses:
		ep = epResponses
	case in.Messages:
		ep = epMessages
	case in.Other:
		ep = epOther
	case in.Chat:
		ep = epChat
	}
	c.s, c.ep, c.start = s, ep, time.Now()
	c.setRequestID(in.RequestID)
	p.c, p.up, p.started, p.first = c, nil, false, false
	s.m.inflight.Inc()
	n := s.inflight.Add(1)

	var err error
	switch {
	case s.draining.Load():
		err = ErrDraining
	case n > int64(s.cfg.MaxConcurrent):
		err = fmt.Errorf("%w: limit is %d", ErrOverloaded, s.cfg.MaxConcurrent)
	default:
		r := &p.rc.Request
		r.Reset()
		r.Header.SetMethod(fasthttp.MethodPost)
		if len(in.Authorization) > 0 {
			r.Header.SetBytesV("Authorization", in.Authorization)
		}
		if len(in.SessionID) > 0 {
			r.Header.SetBytesV("X-Session-ID", in.SessionID)
		}
		if len(in.APIKey) > 0 {
			r.Header.SetBytesV("X-Api-Key", in.APIKey)
		}
		if len(in.Path) > 0 {
			r.SetRequestURIBytes(in.Path)
		} else if len(in.APIKey) > 0 {
			r.SetRequestURI(epPath(ep)) // X-Api-Key counts by path (header.go: credential)
		}
		r.SetBodyRaw(in.Body)
		err = c.prepare(&p.rc)
		// A picker runs no legs: a P/D plan's reservation (pd.go), made
		// when the embedding server has P/D on, would never be released.
		if c.pd.res.prefill != "" || c.pd.res.decode != "" {
			c.unreserve(c.s.pdInit(), true)
		}
	}
	if err != nil {
		ae := toAPIError(err)
		c.status, c.errMsg = ae.status, ae.msg
		pe := &PickError{Status: ae.status, Body: appendErrorBody(nil, ae), Err: err}
		if ae.retryAfter > 0 {
			pe.RetryAfter = int((ae.retryAfter + time.Second - 1) / time.Second)
		}
		p.release()
		return nil, pe
	}
	return p, nil
}

// Ranked is the decision's ranking, best first. The slice belongs to p.
func (p *Picked) Ranked() []scheduler.EngineScore { return p.c.dec.Ranked }

// Decision is the scheduler's decision (policy, reason, ranking).
func (p *Picked) Decision() *scheduler.Decision { return &p.c.dec }

// Model is the request's model; Stream whether it asked for a stream.
func (p *Picked) Model() string { return p.c.model }
func (p *Picked) Stream() bool  { return p.c.req.stream }

// PromptTokens is the prompt length (exact with a tokenizer, else estimated).
func (p *Picked) PromptTokens() int { return p.c.promptTokens }

// Request is the scheduler's view of the request (keys, prompt and output
// tokens, session) and Engines the candidates it ranked (with this
// replica's local load): what a further scheduler step, such as the P/D
// router, needs. Both belong to p.
func (p *Picked) Request() *scheduler.Request { return &p.c.sreq }
func (p *Picked) Engines() []scheduler.Engine { return p.c.cands }

// Candidate returns the candidate engine id with its base URL and role.
func (p *Picked) Candidate(id string) (url string, role scheduler.Role, ok bool) {
	for i := range p.c.cands {
		if p.c.cands[i].ID == id {
			return p.c.urls[i], p.c.cands[i].Role, true
		}
	}
	return "", 0, false
}

// Start charges the request to engine id (this replica's in-flight, prefill
// and active tokens, shared through gossip) and records the speculative
// index entry, as the ingress's proxy does per attempt. Calling it again
// moves the charge (the data plane fell back to another endpoint).
func (p *Picked) Start(id string) error {
	c := p.c
	var rk *scheduler.EngineScore
	for i := range c.dec.Ranked {
		if c.dec.Ranked[i].Engine == id {
			rk = &c.dec.Ranked[i]
			break
		}
	}
	if rk == nil {
		return fmt.Errorf("%w: engine %q is not in the ranking", ErrNoEngine, id)
	}
	if p.up != nil && p.up.id == id {
		return nil
	}
	up, err := c.s.ups.get(id, c.urlOf(id))
	if err != nil {
		return err
	}
	if p.up != nil {
		c.endAttempt(p.up)
	}
	p.up, p.started = up, true
	c.attempts++
	c.engine, c.match = id, rk.Match
	if keys := c.keysOf(id); c.s.deps.Index != nil && len(keys) > 0 {
		c.s.deps.Index.AddSpeculative(id, keys, time.Now()) // at the engine's block size
	}
	c.startAttempt(up, rk.Match.Spec)
	up.total.Add(1)
	return nil
}

// Body returns the body to send to engine id in place of the client's, or
// nil when the client's goes as it came. A Responses request without a
// request_id gets one naming the engine (responses.go), so any replica or
// picker routes its follow-ups and GETs back there; call Body again if the
// data plane is sent elsewhere. The slice is the Picked's: copy it before
// Done.
func (p *Picked) Body(id string) []byte {
	c := p.c
	if c.ep != epResponses || c.req.hasRequestID || len(c.body) == 0 {
		return nil
	}
	stampBody(c.body, id)
	return c.body
}

// FirstByte ends the prefill charge (the response headers arrived).
func (p *Picked) FirstByte() {
	if p.up == nil || p.first {
		return
	}
	p.first = true
	p.c.firstByte(p.up)
	p.c.ttft = time.Since(p.c.start)
}

// Done releases the charge and records the request with the data plane's
// status (0: the stream ended before a response). Nothing may use p after.
func (p *Picked) Done(status int) {
	c := p.c
	if p.up != nil {
		c.endAttempt(p.up)
		if status >= 500 {
			p.up.failures.Add(1)
		}
	}
	c.status = status
	switch {
	case status == 0:
		c.status = 499
		c.errMsg = "stream ended before a response"
	case status == StatusClientClosed:
		c.errMsg = "client closed the stream" // as the ingress's proxy says it; nothing is learned from a cut answer
	case status == fasthttp.StatusOK && p.errCode != 0:
		c.failedInStream(p.errCode) // proxystream.go
	}
	p.release()
}

// StatusClientClosed is the status Done takes for an answer whose stream
// ended before the answer did (the client left, or the data plane cut it):
// the access log's 499, as the ingress logs a client gone mid-answer; the
// output read so far settles the budgets, and no answer length or latency
// is learned from it.
const StatusClientClosed = 499

func (p *Picked) release() {
	c := p.c
	p.c, p.up, p.errCode = nil, nil, 0
	p.rc.Request.SetBodyRaw(nil)
	c.finish()
	pickedPool.Put(p)
}

// WrapMembership replaces the server's engine list with wrap(current) (for
// example to narrow it to an InferencePool's ready pods). Call it before
// Start; the wrapper must be safe for concurrent use and must not block.
func (s *Server) WrapMembership(wrap func(Membership) Membership) {
	s.deps.Membership = wrap(s.deps.Membership)
}

// Ready reports what /ready reports: the index has caught up, at least one
// engine is live and the server is not draining.
func (s *Server) Ready() bool {
	if s.draining.Load() || (s.deps.Synced != nil && !s.deps.Synced()) {
		return false
	}
	for _, e := range s.deps.Membership.Engines(nil) {
		if e.Healthy {
			return true
		}
	}
	return false
}

// Registry is the server's metrics registry (served on /metrics), for a
// front end that adds its own series.
func (s *Server) Registry() *prometheus.Registry { return s.deps.Registry }
