package ingress

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http/pprof"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// The admin listener (Config.AdminListen) serves what operators need and
// clients must not see: /debug/pprof/*, /debug/engines, /debug/index,
// /debug/config, /debug/health and /metrics. With Config.AdminToken set every
// admin request needs "Authorization: Bearer <token>".

// startAdmin listens on Config.AdminListen and serves until Close.
func (s *Server) startAdmin() error {
	aln, err := net.Listen("tcp", s.cfg.AdminListen)
	if err != nil {
		return fmt.Errorf("ingress admin listen: %w", err)
	}
	s.adminLn = aln
	prof := map[string]fasthttp.RequestHandler{
		"/debug/pprof/cmdline": fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Cmdline),
		"/debug/pprof/profile": fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Profile),
		"/debug/pprof/symbol":  fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Trace),
	}
	index := fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Index)
	s.admin = &fasthttp.Server{
		Name:               "kvmesh-ingress-admin",
		Logger:             fasthttpLogger{s.log},
		ReadTimeout:        10 * time.Second,
		IdleTimeout:        60 * time.Second,
		NoDefaultDate:      true,
		CloseOnShutdown:    true,
		MaxRequestBodySize: 1 << 20,
		Handler: func(ctx *fasthttp.RequestCtx) {
			if !s.adminAuthorized(ctx) {
				ctx.Response.Header.Set("WWW-Authenticate", `Bearer realm="kvmesh-admin"`)
				writeError(ctx, unauthorized(errors.New("admin token required")))
				return
			}
			path := string(ctx.Path())
			if h, ok := prof[path]; ok {
				h(ctx)
				return
			}
			if strings.HasPrefix(path, "/debug/pprof/") {
				index(ctx)
				return
			}
			if !s.handleAdminPath(ctx, path) {
				writeError(ctx, fmt.Errorf("%w: %s %s", ErrNotFound, clipBytes(ctx.Method()), clip(path)))
			}
		},
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.admin.Serve(aln); err != nil {
			s.log.Error("admin server", "err", err)
		}
	}()
	return nil
}

// handleAdminPath serves the non-pprof admin endpoints; false when path is
// none of them.
func (s *Server) handleAdminPath(ctx *fasthttp.RequestCtx, path string) bool {
	switch path {
	case "/metrics":
		s.metricsHandler(ctx)
	case "/debug/engines":
		s.handleDebugEngines(ctx)
	case "/debug/index":
		s.handleDebugIndex(ctx)
	case "/debug/config":
		s.handleDebugConfig(ctx)
	case "/debug/health":
		s.handleDebugHealth(ctx)
	case "/debug/tokenizers":
		s.handleDebugTokenizers(ctx) // tokencheck.go
	case "/health":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	default:
		return false
	}
	return true
}

// adminAuthorized checks the bearer token in constant time. The scheme is
// case-insensitive (RFC 9110 §11.1), as on the client port.
func (s *Server) adminAuthorized(ctx *fasthttp.RequestCtx) bool {
	if s.cfg.AdminToken == "" {
		return true
	}
	const scheme = "bearer "
	h := strings.TrimSpace(string(ctx.Request.Header.Peek("Authorization")))
	if len(h) < len(scheme) || !strings.EqualFold(h[:len(scheme)], scheme) {
		return false
	}
	tok := strings.TrimSpace(h[len(scheme):])
	return subtle.ConstantTimeCompare([]byte(tok), []byte(s.cfg.AdminToken)) == 1
}
