package ingress

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/valyala/fasthttp"
)

// The requests outside the inference handlers that a client (or a scanner)
// can make over and over are counted and access-logged like inference
// requests, so guessing API keys on /v1/models or the client port's
// /metrics leaves a trace: kvmesh_ingress_requests_total{endpoint} with a
// fixed endpoint ("models", "metrics", "unknown" for a path the ingress
// does not serve) and a line with the status and error. Those lines are
// bounded (otherLogPerSecond): a scan at line rate would flood the log, so
// past the bound a second's lines are dropped and the next line says how
// many were.

// otherLogPerSecond bounds the access lines of those requests per replica.
const otherLogPerSecond = 50

// lineLimiter allows n lines per wall-clock second and counts the dropped.
type lineLimiter struct {
	mu      sync.Mutex
	sec     int64
	n       int
	dropped int
}

// allow reports whether a line may be written at now, and how many were
// dropped since the last one written (then reset).
func (l *lineLimiter) allow(now time.Time, perSecond int) (bool, int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if s := now.Unix(); s != l.sec {
		l.sec, l.n = s, 0
	}
	if l.n >= perSecond {
		l.dropped++
		return false, 0
	}
	l.n++
	d := l.dropped
	l.dropped = 0
	return true, d
}

// finishOther counts a request outside the inference handlers under
// endpoint (a fixed name) and writes its access line: ae is the error it
// was answered with, nil for a success.
func (s *Server) finishOther(ctx *fasthttp.RequestCtx, endpoint string, start time.Time, ae *apiError) {
	s.m.requests.WithLabelValues(endpoint, s.m.status(ctx.Response.StatusCode())).Inc()
	id := ctx.Request.Header.Peek("X-Request-Id")
	if !validRequestID(id) {
		id = nil // made only for a request that goes upstream
	} else {
		ctx.Response.Header.SetBytesV("X-Request-Id", id) // echoed, as an inference request's answer
	}
	if s.alog == nil {
		return
	}
	if ok, dropped := s.otherLog.allow(start, otherLogPerSecond); ok {
		s.otherLine(ctx, endpoint, start, ae, id, dropped)
	}
}

// otherLine writes the access line of a request outside the inference
// handlers (finishOther, handleTransportError).
func (s *Server) otherLine(ctx *fasthttp.RequestCtx, endpoint string, start time.Time, ae *apiError, id []byte, dropped int) {
	status := ctx.Response.StatusCode()
	msg := ""
	if ae != nil {
		msg = ae.msg
	}
	attrs := [...]slog.Attr{
		slog.String("ingress", s.cfg.ID),
		slog.String("request_id", string(id)),
		slog.String("endpoint", endpoint),
		slog.String("method", clipBytes(ctx.Method())),
		slog.String("path", clipBytes(ctx.Path())),
		slog.Int("status", status),
		slog.Float64("total_ms", ms(time.Since(start))),
		slog.String("error", msg),
		slog.Int("lines_dropped", dropped),
	}
	n := len(attrs)
	if dropped == 0 {
		n--
	}
	s.alog.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs[:n]...)
}

// byIDLine is what the access line of a request for a stored response
// (GET /v1/responses/{id}, POST .../cancel; responses.go) says beyond the
// answer's status: the request id sent upstream, the API key's name, the
// engine that answered ("" when none did) and the error answered (ae, as
// the client read it; err, whole, for the line: logText).
type byIDLine struct {
	start  time.Time
	reqID  []byte
	key    string
	engine string
	ae     *apiError
	err    error
}

// finishByID counts a request for a stored response under the endpoint
// "responses" and writes its access line. Unlike finishOther's, these
// lines are not bounded: like an inference request's, each names an
// engine's work (or a refusal of a client's request), one line per
// request.
func (s *Server) finishByID(ctx *fasthttp.RequestCtx, l *byIDLine) {
	status := ctx.Response.StatusCode()
	ctx.Response.Header.SetBytesV("X-Request-Id", l.reqID) // as an inference request's answer (upstreamhdr.go)
	s.m.requests.WithLabelValues("responses", s.m.status(status)).Inc()
	if s.alog == nil {
		return
	}
	msg := ""
	if l.ae != nil {
		msg = logText(l.ae.msg, l.err) // proxy.go: the line keeps the engine's address
	}
	s.alog.LogAttrs(context.Background(), slog.LevelInfo, "request",
		slog.String("ingress", s.cfg.ID),
		slog.String("request_id", string(l.reqID)),
		slog.String("endpoint", "responses"),
		slog.String("method", clipBytes(ctx.Method())),
		slog.String("path", clipBytes(ctx.Path())),
		slog.Int("status", status),
		slog.String("engine", l.engine),
		slog.String("key", l.key),
		slog.Float64("total_ms", ms(time.Since(l.start))),
		slog.String("error", msg))
}
