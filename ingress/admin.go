package ingress

import (
	"crypto/subtle"
	"errors"
	"fmt"
	"net/http/pprof"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// The admin listener (Config.AdminListen) serves what operators need and
// clients must not see: /debug/pprof/*, /debug/engines, /debug/index,
// /debug/config, /debug/health and /metrics. With Config.AdminToken set every
// admin request needs "Authorization: Bearer <token>".

// adminSendTimeout bounds the admin listener's send timeout: its answers
// are small and bounded, so a client that takes nothing for this long is
// gone or hostile, whatever the client port's --send-timeout (or with it
// off).
const adminSendTimeout = 60 * time.Second

// adminSendTimeoutOf is the admin listener's send timeout: the client
// port's, at most adminSendTimeout.
func adminSendTimeoutOf(client time.Duration) time.Duration {
	if client <= 0 || client > adminSendTimeout {
		return adminSendTimeout
	}
	return client
}

// startAdmin listens on Config.AdminListen and serves until Close.
func (s *Server) startAdmin() error {
	aln, err := s.listen(s.cfg.AdminListen, "admin")
	if err != nil {
		return fmt.Errorf("ingress admin listen: %w", err)
	}
	s.adminLn = aln
	// A client that sends requests and never reads the answers would
	// otherwise keep its connection, its fd and megabytes of kernel send
	// buffer for good: a blocked write is bound by neither ReadTimeout nor
	// IdleTimeout, and enough of them starve the client port of fds.
	sln := sendTimeoutListener{Listener: aln, d: adminSendTimeoutOf(s.cfg.SendTimeout)} // sendtimeout.go
	prof := map[string]fasthttp.RequestHandler{
		"/debug/pprof/cmdline": serveCmdline,
		"/debug/pprof/profile": maxSeconds(fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Profile)),
		"/debug/pprof/symbol":  fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Symbol),
		"/debug/pprof/trace":   maxSeconds(fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Trace)),
	}
	// The named profiles (heap, allocs, goroutine, block, mutex, ...) take a
	// seconds parameter too (a delta over that long): the same bound.
	index := maxSeconds(fasthttpadaptor.NewFastHTTPHandlerFunc(pprof.Index))
	s.admin = &fasthttp.Server{
		Name:        "kvmesh-ingress-admin",
		Logger:      fasthttpLogger{s.log},
		ReadTimeout: 10 * time.Second,
		// The whole answer's write (a profile is computed first, then
		// written); the send timeout bounds each write within it.
		WriteTimeout:       2 * adminSendTimeout,
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
		s.serve(s.admin, sln, "admin")
	}()
	return nil
}

// maxPprofSeconds bounds /debug/pprof/profile's and /trace's seconds:
// behind fasthttpadaptor no http.Server WriteTimeout caps them, and the
// adaptor buffers the whole answer (a trace of an hour under load is GBs).
const maxPprofSeconds = 60

// maxSeconds refuses a profile or trace request whose seconds is not a
// whole number in 1..maxPprofSeconds (400); absent, pprof's default holds.
func maxSeconds(h fasthttp.RequestHandler) fasthttp.RequestHandler {
	return func(ctx *fasthttp.RequestCtx) {
		if v := ctx.QueryArgs().Peek("seconds"); len(v) > 0 {
			n, err := strconv.Atoi(string(v))
			if err != nil || n < 1 || n > maxPprofSeconds {
				writeError(ctx, badRequest("seconds", fmt.Errorf("%w: seconds must be a whole number from 1 to %d", ErrBadRequest, maxPprofSeconds)))
				return
			}
		}
		h(ctx)
	}
}

// serveCmdline is /debug/pprof/cmdline with the values of secret flags
// (passwords, tokens, keys, secrets) and URL passwords redacted, as
// /debug/config redacts them.
func serveCmdline(ctx *fasthttp.RequestCtx) {
	ctx.SetContentType("text/plain; charset=utf-8")
	ctx.SetBodyString(strings.Join(redactArgs(os.Args), "\x00"))
}

// redactArgs returns args with every secret flag's value ("--admin-token
// x", "--nats-password=x") and every URL's password replaced.
func redactArgs(args []string) []string {
	out := make([]string, len(args))
	secretNext := false
	for i, a := range args {
		if secretNext {
			out[i], secretNext = natsutil.Redacted, false
			continue
		}
		name, _, hasVal := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && secretFlag(name) {
			if hasVal {
				out[i] = a[:strings.IndexByte(a, '=')+1] + natsutil.Redacted
			} else {
				out[i], secretNext = a, true
			}
			continue
		}
		out[i] = a
		if strings.Contains(a, "://") && strings.Contains(a, "@") {
			out[i] = strings.Join(natsutil.RedactURLs(strings.Split(a, ",")), ",")
		}
	}
	return out
}

// secretFlag reports whether a flag's name says its value is a secret: a
// word of it is password, token, secret or key (--nats-password,
// --admin-token, --gossip-key), and it does not name a file or a variable.
func secretFlag(name string) bool {
	words := strings.Split(strings.ToLower(name), "-")
	switch words[len(words)-1] {
	case "file", "env", "dir", "path":
		return false
	}
	for _, w := range words {
		switch w {
		case "password", "passwd", "token", "secret", "key", "keys":
			return true
		}
	}
	return false
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
