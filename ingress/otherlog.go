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
	status := ctx.Response.StatusCode()
	s.m.requests.WithLabelValues(endpoint, s.m.status(status)).Inc()
	if s.alog == nil {
		return
	}
	ok, dropped := s.otherLog.allow(start, otherLogPerSecond)
	if !ok {
		return
	}
	id := ctx.Request.Header.Peek("X-Request-Id")
	if !validRequestID(id) {
		id = nil // made only for a request that goes upstream
	}
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
