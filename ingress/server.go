package ingress

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"

	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/pd"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// Server is one ingress replica. New → Start → Close; Close drains.
type Server struct {
	cfg   Config
	deps  Deps
	log   *slog.Logger
	alog  *slog.Logger // access log; nil when off
	m     *metrics
	certs *tlsCerts // TLS credentials in force, re-read on change (tls.go)
	// hsLastLog is when a failed client handshake was last logged at
	// info (a monotime reading, 0: never; tlshandshake.go).
	hsLastLog atomic.Int64
	ups       *upstreams
	cl        *cluster
	health    *ejector // nil when passive ejection is off
	// media is each model's learned tokens per media item (mediatokens.go).
	media mediaTokens
	// check compares the ingress's prompt tokens with the engines' answers (tokencheck.go).
	check *tokenCheck
	// etok asks engines to tokenize what the ingress cannot (enginetok.go).
	etok *engineTok
	// forced is each model's learned forced-usage mode (forcedusage.go).
	forced forcedUsage
	// engineAuth is the Authorization value upstream requests carry
	// ("Bearer " + Config.EngineAPIKey), nil without a key.
	engineAuth []byte

	srv            *fasthttp.Server
	ln             net.Listener
	admin          *fasthttp.Server
	adminLn        net.Listener
	metricsHandler fasthttp.RequestHandler

	created time.Time
	// served: when each model last had a live engine (404 or 503 when
	// none has now, servedmodels.go).
	served servedModels
	// modelNames interns the model names requests were routed with
	// (modelname.go).
	modelNames modelNames
	// heads remembers what the heads of requests with a body said, for
	// handleTransportError.
	heads headMemo
	// admitBase is the admitter's configured limit, restored when the
	// cluster is not saturated (0: the admitter cannot be resized).
	admitBase int
	satBuf    []EngineInfo // followSaturation's scratch (load loop only)
	inflight  atomic.Int64 // requests in service (MaxConcurrent)
	bodyBytes atomic.Int64 // their request bodies' bytes (MaxBodyBytesInFlight, bodybudget.go)
	draining  atomic.Bool
	leaving   atomic.Bool // a front end's drain began (Leaving): /ready says draining, requests still served
	started   atomic.Bool
	reqPool   sync.Pool // *call
	pd        pdState   // P/D admission and metrics (pd.go)
	// life orders Start and Close: Close tears down only what a Start that
	// succeeded set up (running), and waits for a Start in progress.
	life    sync.Mutex
	running bool // guarded by life: Start succeeded
	// ctxDone is closed when Start's context watcher has ended (nil: no
	// watcher); guarded by life. Close waits for it.
	ctxDone chan struct{}
	// slo records per-engine TTFT/TPOT for gossip (slo_gossip.go); set in
	// Start with gossip, before serving; nil without gossip.
	slo *SLORecorder
	// learn is the cost learner the kvmesh and P/D policies price with
	// (learn.go); nil when off.
	learn *learn.Learner
	// learnSh publishes learn's own sums by gossip (learn_gossip.go; the
	// load loop owns it); learnShares counts peers' shares by result. Set
	// in Start with gossip and a learner.
	learnSh     learnSharer
	learnShares *prometheus.CounterVec
	// outs is the output lengths of the streams the engines run, per served
	// model, from this replica's finished answers (finish), for the kvmesh
	// P/D step; nil without it.
	outs *pd.OutputDist
	// outLens predicts output lengths per served model (outlen.go).
	outLens outputLengths
	// hold is the kvmesh policy's router-side hold rule and holdQ its held
	// requests (hold.go); holdQ is nil when the hold is off. roomFn is
	// engineRoom, bound once.
	hold   policies.Hold
	holdQ  *holdQueue
	roomFn func(engine string) bool
	// holdNow is the hold's clock for non-streamed requests' estimated
	// prefill: monotonic ns since created (mono), so a wall-clock step does
	// not move it; tests set it.
	holdNow func() int64
	// otherLog bounds the access lines of requests outside the inference
	// handlers (otherlog.go).
	otherLog lineLimiter
	// loopLastLog is when a routing loop was last warned of (monotime; loop.go).
	loopLastLog atomic.Int64
	// loopSentLog is when an engine found to be an ingress was last warned
	// of with passive ejection off (monotime; loop.go).
	loopSentLog atomic.Int64

	// failed receives the error of a listener that stopped serving while
	// the Server was not closing (Failed); one slot per listener, never
	// blocks.
	failed chan error
	// acceptFault wraps the raw listeners in tests (a fake accept error);
	// nil in production.
	acceptFault func(net.Listener) net.Listener

	closeOnce sync.Once
	closeErr  error
	quit      chan struct{}
	wg        sync.WaitGroup // owned goroutines: serve loops, load publisher
	legTasks  legTasks       // goroutines requests start that outlive them (SGLang prefill legs)
}

// legTasks follows the goroutines the request path starts and that outlive
// their request (an SGLang prefill leg): once stopped it refuses new ones,
// so its Wait never races an Add from a handler that outlived the drain.
type legTasks struct {
	mu      sync.Mutex
	stopped bool
	wg      sync.WaitGroup
}

// add counts one more task unless stopped; the task calls done.
func (t *legTasks) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.stopped {
		return false
	}
	t.wg.Add(1)
	return true
}

func (t *legTasks) done() { t.wg.Done() }

// stopAndWait refuses new tasks and waits for the running ones.
func (t *legTasks) stopAndWait() {
	t.mu.Lock()
	t.stopped = true
	t.mu.Unlock()
	t.wg.Wait()
}

// New builds a Server from a validated config and its collaborators.
func New(cfg Config, deps Deps) (*Server, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := checkCORSOrigins(cfg.CORSOrigins); err != nil { // cors.go
		return nil, err
	}
	if deps.Logger == nil {
		deps.Logger = slog.Default()
	}
	if cfg.ID == "" {
		cfg.ID = fmt.Sprintf("ingress-%08x", rand.Uint32())
	}
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	cl := &cluster{}
	if cfg.Cluster.GossipBind != "" && deps.Membership == nil {
		cl.mem = &gossipMembership{}
		deps.Membership = cl.mem
		if deps.LoadSharer == nil {
			deps.LoadSharer = cl.mem
		}
	}
	if deps.Membership == nil {
		deps.Membership = newStaticMembership(cfg.Engines)
	}
	var ej *ejector
	if !cfg.Health.Disabled {
		ej = newEjector(cfg.Health, deps.Registry, cfg.ID)
		ej.dialsWatched = cfg.watchSeesDials()
		deps.Membership = healthMembership{Membership: deps.Membership, ej: ej}
	}
	lr, err := newLearner(&cfg)
	if err != nil {
		return nil, err
	}
	var hold policies.Hold
	if deps.Scheduler == nil {
		sch, h, err := learningScheduler(&cfg, &deps, lr)
		if err != nil {
			return nil, fmt.Errorf("new ingress: %w", err)
		}
		deps.Scheduler, hold = sch, h
	}
	s := &Server{cfg: cfg, deps: deps, log: deps.Logger.With("component", "ingress", "ingress", cfg.ID), quit: make(chan struct{}), failed: make(chan error, 2), created: time.Now(), cl: cl, health: ej, learn: lr}
	if ej != nil {
		ej.log = s.log // health.go: ejections and restores
	}
	// A head's note outlives its request's read, which ReadTimeout bounds.
	s.heads.init(cfg.ReadTimeout+time.Minute, s.mono)
	if hold.On() && lr != nil && deps.PD == nil && cfg.PD.Policy == "" { // hold.go: not with P/D
		s.hold, s.roomFn, s.holdNow = hold, s.engineRoom, func() int64 { return int64(s.mono()) }
		s.holdQ = newHoldQueue(hold, cfg.Hold, s.roomFn, s.mono)
	}
	if deps.PD == nil && (cfg.PD.Policy == "kvmesh" || cfg.PD.Policy == "kvmesh-always") {
		s.outs = pd.NewOutputDist() // pd.go: the P/D step prices streams' TPOT risk over it
	}
	if cfg.EngineAPIKey != "" {
		s.engineAuth = []byte("Bearer " + cfg.EngineAPIKey)
	}
	if len(cfg.Cluster.NATSURLs) > 0 {
		if s.deps.Synced == nil {
			s.deps.Synced = func() bool { return cl.mat != nil && cl.mat.Synced() }
		}
		if s.deps.PropagationLag == nil {
			s.deps.PropagationLag = cl.propagationLag
		}
		deps = s.deps
	}
	if cfg.AccessLog {
		s.alog = deps.AccessLog
		if s.alog == nil {
			s.alog = slog.New(slog.NewJSONHandler(os.Stderr, nil))
		}
	}
	s.ups = newUpstreams(&s.cfg)
	if s.health != nil {
		s.health.ups = s.ups // the stall watch (health.go)
		// The probe's model check (wrongmodel.go).
		s.health.identity = s.engineIdentity
	}
	var indexKeys func() float64
	if deps.Index != nil {
		idx := deps.Index
		indexKeys = func() float64 {
			var n int
			for _, e := range idx.Engines() {
				for _, k := range e.Keys {
					n += k
				}
			}
			return float64(n)
		}
	}
	s.m = newMetrics(deps.Registry, cfg.ID, indexKeys, deps.PropagationLag, func() float64 {
		return float64(len(s.deps.Membership.Engines(nil)))
	})
	if s.certs, err = newTLSCerts(&s.cfg.TLS, s.log, newTLSMetrics(deps.Registry, prometheus.Labels{"ingress": cfg.ID})); err != nil {
		return nil, fmt.Errorf("new ingress: %w", err)
	}
	s.ups.tlsErrs, s.ups.log = s.m.upstreamTLS, s.log
	if s.ups.tls, err = s.certs.upstreamTLS(); err != nil {
		return nil, fmt.Errorf("new ingress: %w", err)
	}
	s.health.useTLS(s.ups.tls)
	s.check = newTokenCheck(deps.Registry, prometheus.Labels{"ingress": cfg.ID})
	s.etok = newEngineTok(deps.Registry, prometheus.Labels{"ingress": cfg.ID})
	// Index and scheduler series carry no replica label: with a registry
	// shared by several replicas in one process only the first registers.
	if deps.Index != nil {
		if err := deps.Index.RegisterMetrics(deps.Registry); err != nil {
			s.log.Warn("index metrics not registered", "err", err)
		}
	}
	if rm, ok := deps.Scheduler.(interface {
		RegisterMetrics(prometheus.Registerer) error
	}); ok {
		if err := rm.RegisterMetrics(deps.Registry); err != nil {
			s.log.Warn("scheduler metrics not registered", "err", err)
		}
	}
	if s.holdQ != nil {
		s.holdQ.register(deps.Registry, prometheus.Labels{"ingress": cfg.ID})
	}
	if s.learn != nil {
		if err := deps.Registry.Register(newLearnCollector(s)); err != nil {
			s.log.Warn("learned cost metrics not registered", "err", err)
		}
	}
	// A render costs milliseconds of CPU: a scraper gone wrong or a curl
	// loop must not take the routing's cores (MaxRequestsInFlight: a 503
	// beyond it). /health and /ready render nothing and are not limited.
	s.metricsHandler = fasthttpadaptor.NewFastHTTPHandler(promhttp.HandlerFor(deps.Registry,
		promhttp.HandlerOpts{MaxRequestsInFlight: maxMetricsInFlight}))
	s.reqPool.New = func() any { return new(call) }
	if ls, ok := deps.Admitter.(limitSetter); ok {
		_, _, _, s.admitBase = ls.Stats()
	}
	s.srv = &fasthttp.Server{
		Handler:            s.handle,
		HeaderReceived:     s.headerReceived,
		ExpectHandler:      s.expect, // header.go: no "100 Continue" for a body refused anyway
		ErrorHandler:       s.handleTransportError,
		Name:               "kvmesh-ingress",
		Logger:             fasthttpLogger{s.log},
		MaxRequestBodySize: cfg.MaxBodyBytes,
		ReadBufferSize:     maxHeaderBytes,
		// Parse errors must not quote the request head back to the client
		// or into logs: it holds the credential. fasthttp's option leaves
		// some in (a bad header's value); handleTransportError and
		// fasthttpLogger answer and log transportErrText.
		SecureErrorLogMessage: true,
		ReadTimeout:           cfg.ReadTimeout,       // a client must send its request within this
		IdleTimeout:           cfg.ClientIdleTimeout, // a keep-alive connection idle between requests
		CloseOnShutdown:       true,
		// Every answer carries Date (RFC 9110 §6.6.1), from fasthttp's
		// once-a-second cache: no allocation.
		NoDefaultDate:     false,
		ReduceMemoryUsage: false,
		// A multipart/form-data body is not parsed into a form (its large
		// parts written to temporary files, outside maxBodyBytesInFlight):
		// it is buffered as any body, and route refuses it with 415.
		DisablePreParseMultipartForm: true,
	}
	return s, nil
}

// maxMetricsInFlight is how many /metrics renders run at once; Prometheus
// scrapes one at a time per target, so a few replicas' scrapers fit.
const maxMetricsInFlight = 4

// Start listens and serves until Close. It returns once listening. A
// Server starts once: a failed Start leaves nothing running, and Close
// after it only marks the Server closed.
//
// When ctx ends (SIGTERM in the command), the server closes as by Close:
// a goroutine Start owns drains it, logs the outcome, and Close waits for
// that goroutine and returns the same error. A ctx that never ends
// (context.Background) starts no such goroutine; the caller calls Close.
func (s *Server) Start(ctx context.Context) error {
	s.life.Lock()
	defer s.life.Unlock()
	if !s.started.CompareAndSwap(false, true) {
		return errors.New("ingress: already started")
	}
	select {
	case <-s.quit:
		return errors.New("ingress: closed")
	default:
	}
	ln, err := s.listen(s.cfg.Listen, "client")
	if err != nil {
		return fmt.Errorf("ingress listen: %w", err)
	}
	if s.cfg.SendTimeout > 0 {
		ln = sendTimeoutListener{Listener: ln, d: s.cfg.SendTimeout} // sendtimeout.go
	}
	if tc := s.certs.serverTLS(); tc != nil {
		ln = tls.NewListener(ln, tc)
	}
	if err := s.startCluster(); err != nil {
		ln.Close()
		s.cl.close()
		return err
	}
	if s.cfg.AdminListen != "" {
		if err := s.startAdmin(); err != nil {
			ln.Close()
			s.cl.close() // no gossip node, NATS connection or materializer is left behind
			return err
		}
	}
	s.ln = ln
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		s.serve(s.srv, ln, "client")
	}()
	go func() {
		defer s.wg.Done()
		s.shareLoadLoop()
	}()
	if s.health != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.health.probeLoop(s.quit, s.cfg.Health.EjectionTime/4)
		}()
	}
	if s.holdQ != nil {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.holdLoop() // hold.go
		}()
	}
	if s.certs.watching() {
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.certs.Run(s.quit) // tls.go: certificates re-read on change
		}()
	}
	for _, d := range []any{s.deps.Auth, s.deps.Routes} { // header.go: auth files and key sets, the routes file
		if r, ok := d.(runner); ok {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				r.Run(s.quit)
			}()
		}
	}
	if ctx != nil && ctx.Done() != nil {
		// The caller's context ends the server too (SIGTERM in the command).
		// Not on wg, which the drain waits for; Close waits for ctxDone.
		done := make(chan struct{})
		s.ctxDone = done
		go func() {
			defer close(done)
			select {
			case <-ctx.Done():
				if err := s.shutdown(); err != nil {
					s.log.Error("close on context end", "err", err)
				} else {
					s.log.Info("closed on context end")
				}
			case <-s.quit: // Close, which waits for this goroutine
			}
		}()
	}
	s.running = true
	s.log.Info("ingress listening", "addr", s.Addr(), "admin", s.AdminAddr(), "policy", s.deps.Scheduler.Policy(), "pd_policy", s.pdPolicyName())
	return nil
}

// listen listens on addr, its accept errors retried (accept.go).
func (s *Server) listen(addr, name string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	if s.acceptFault != nil {
		ln = s.acceptFault(ln)
	}
	return newAcceptListener(ln, name, s.m.acceptErrors, s.log), nil
}

// serve runs srv on ln until Close. Serve returning before Close is a
// listener that can no longer accept (an accept error that is not retried):
// the Server fails (Failed) rather than live on unable to take a
// connection.
func (s *Server) serve(srv *fasthttp.Server, ln net.Listener, name string) {
	err := srv.Serve(ln)
	select {
	case <-s.quit:
		return // closing: Shutdown ended Serve
	default:
	}
	if err == nil {
		err = errors.New("serve returned")
	}
	err = fmt.Errorf("ingress %s listener stopped: %w", name, err)
	s.log.Error("listener stopped serving; the ingress fails", "listener", name, "err", err)
	s.failed <- err
}

// Failed receives an error when a listener (client or admin) has stopped
// serving while the Server was not closing: it can no longer take
// connections there, and its owner should close it and exit so a
// supervisor restarts it (Run does).
func (s *Server) Failed() <-chan error { return s.failed }

// Addr is the listening address (host:port), "" before Start.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// AdminAddr is the pprof listener's address, "" when off.
func (s *Server) AdminAddr() string {
	if s.adminLn == nil {
		return ""
	}
	return s.adminLn.Addr().String()
}

// Close drains: /ready turns false and new requests get 503 at once, requests
// in service finish (bounded by Config.DrainTimeout), then listeners and
// owned goroutines stop. Safe to call more than once, and after a failed
// Start. Once Start's context has ended, Close waits for the close that
// started and returns its error.
func (s *Server) Close() error {
	err := s.shutdown()
	s.life.Lock()
	done := s.ctxDone
	s.life.Unlock()
	if done != nil {
		<-done
	}
	return err
}

// shutdown is Close without waiting for Start's context watcher (which
// calls it).
func (s *Server) shutdown() error {
	s.closeOnce.Do(func() {
		s.draining.Store(true)
		close(s.quit)
		s.life.Lock() // a Start in progress finishes first
		running := s.running
		s.life.Unlock()
		if !running {
			return // never started, or Start failed and cleaned up after itself
		}
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.DrainTimeout)
		defer cancel()
		// Wait for in-service requests (streams included) before shutting the
		// listener, so clients still mid-stream finish.
		began, inflight := time.Now(), s.inflight.Load()
		s.log.Info("draining", "inflight", inflight, "drain_timeout", s.cfg.DrainTimeout.String())
		t := time.NewTicker(10 * time.Millisecond)
	wait:
		for s.inflight.Load() > 0 {
			select {
			case <-ctx.Done():
				// Cut what is left: upstream reads fail, streams end with an
				// error event, and their connections can close.
				n := s.ups.closeAll()
				s.log.Warn("drain timeout; cutting requests in flight", "inflight", s.inflight.Load(), "upstream_conns", n)
				break wait
			case <-t.C:
			}
		}
		t.Stop()
		if ctx.Err() == nil {
			s.log.Info("drained", "inflight_at_start", inflight, "took", time.Since(began).Round(time.Millisecond).String())
		}
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer scancel()
		if err := s.srv.ShutdownWithContext(sctx); err != nil {
			s.closeErr = fmt.Errorf("ingress shutdown: %w", err)
		}
		if s.admin != nil {
			// Not the Server's error (the client listener's is): admin
			// connections still open when sctx ends are closed below.
			if err := s.admin.ShutdownWithContext(sctx); err != nil {
				s.log.Warn("admin listener shutdown", "err", err)
			}
		}
		// Shutdown closes only the listeners Serve has registered: one whose
		// goroutine had not reached Serve yet would keep accepting and wg
		// would never be done. Closing them here covers that (a second
		// close is harmless).
		_ = s.ln.Close()
		if s.adminLn != nil {
			_ = s.adminLn.Close()
		}
		s.legTasks.stopAndWait()
		s.wg.Wait()
		s.cl.close()
	})
	return s.closeErr
}

// mono is the time since New by the monotonic clock: the clock of the
// hold and of the head memo, which a wall-clock step must not move.
func (s *Server) mono() time.Duration { return time.Since(s.created) }

// shareLoadLoop hands this replica's in-flight counts to gossip.
func (s *Server) shareLoadLoop() {
	t := time.NewTicker(s.cfg.LoadInterval)
	defer t.Stop()
	var buf []EngineLoad
	var blob []byte
	lastExpire := time.Now()
	for {
		select {
		case <-s.quit:
			return
		case now := <-t.C:
			if s.deps.Index != nil && now.Sub(lastExpire) >= time.Second {
				// Writes expire speculative entries lazily; this covers idle spells.
				s.deps.Index.ExpireSpeculative(now)
				lastExpire = now
			}
			if s.deps.LoadSharer != nil {
				buf = s.pdLoads(s.ups.snapshot(buf[:0])) // pd.go: prefill legs per engine
				s.deps.LoadSharer.ShareInFlight(buf)
			}
			blob = s.shareCluster(blob)
			s.followSaturation()
			s.forgetDeparted() // forget.go: drop the state of engines gone from membership
		}
	}
}

// handle is the fasthttp entry point.
func (s *Server) handle(ctx *fasthttp.RequestCtx) {
	defer func() {
		if s.draining.Load() {
			// Every answer while draining closes its connection (fasthttp
			// sends the head after handle returns, streams' included): a
			// keep-alive client reconnects, through its Service, to a live
			// replica. Kept open, the connection took the drain's 503s until
			// the drain ended and then broke under the client's next request.
			ctx.SetConnectionClose()
		}
	}()
	if n := ctx.Request.Header.ContentLength(); n > 0 || n == -1 {
		s.heads.forget(&ctx.Request.Header) // a body read whole: its head's note is not needed
	}
	if p := ctx.Request.Header.Protocol(); len(p) > 5 && p[5] != '1' { // HTTP/2.0 in an HTTP/1 request line
		s.finishOther(ctx, transportEndpoint(ctx.Path()), time.Now(), writeError(ctx, newAPIError(fasthttp.StatusHTTPVersionNotSupported,
			"invalid_request_error", "http_version_not_supported", "",
			fmt.Errorf("%w: %s is not supported: send HTTP/1.1", ErrBadRequest, clipBytes(p)))))
		ctx.SetConnectionClose()
		return
	}
	if s.refuseLoop(ctx) { // loop.go: sent by an ingress (or a client) as if this were an engine
		return
	}
	if s.cfg.OpsOnly && !opsPath(ctx.Path()) { // before CORS: no preflight for what is not served
		writeError(ctx, fmt.Errorf("%w: %s %s", ErrNotFound, clipBytes(ctx.Method()), clipBytes(ctx.Path())))
		return
	}
	if s.cors(ctx) { // cors.go: a preflight, answered
		return
	}
	s.route(ctx)
	if len(s.cfg.CORSOrigins) > 0 {
		// After the answer is made, so error answers (writeError resets
		// the response) carry them too; fasthttp sends the head after
		// handle returns, streams' included.
		s.corsHeaders(ctx, s.corsIndex(ctx.Request.Header.Peek("Origin")))
	}
}

// multipartBody reports whether h announces a multipart/form-data body:
// the ingress serves no multipart endpoint (vLLM's audio ones), and its
// JSON endpoints refuse one with 415 rather than read it as JSON.
func multipartBody(h *fasthttp.RequestHeader) bool {
	ct := h.ContentType()
	const mp = "multipart/form-data"
	return len(ct) >= len(mp) && bytes.EqualFold(ct[:len(mp)], []byte(mp))
}

// opsPath reports whether path is one Config.OpsOnly serves.
func opsPath(path []byte) bool {
	switch string(path) {
	case "/metrics", "/health", "/ready":
		return true
	}
	return false
}

// route serves ctx by its path.
func (s *Server) route(ctx *fasthttp.RequestCtx) {
	if s.deps.Auth != nil {
		if err := repeatedCredential(&ctx.Request.Header); err != nil {
			writeError(ctx, err)
			s.m.requests.WithLabelValues("unknown", "400").Inc()
			return
		}
	}
	path, start := ctx.Path(), time.Now()
	if ep := endpointOf(path); ep != 0 {
		if ctx.IsPost() && multipartBody(&ctx.Request.Header) {
			// The credential first, as for any other body: a caller without
			// one learns nothing about what the endpoint takes.
			if _, err := s.identify(&ctx.Request.Header); err != nil {
				s.finishOther(ctx, ep.String(), start, writeError(ctx, err))
				return
			}
			s.finishOther(ctx, ep.String(), start, writeError(ctx, newAPIError(fasthttp.StatusUnsupportedMediaType,
				"invalid_request_error", "unsupported_media_type", "",
				fmt.Errorf("%w: %s takes a JSON body (Content-Type: application/json), not multipart/form-data", ErrBadRequest, clipBytes(path)))))
			return
		}
		s.handleInference(ctx, ep) // epMessages: messages.go, epOther: passthrough.go
		return
	}
	switch string(path) {
	case "/v1/models", "/health", "/ready", "/version", "/metrics":
		if !ctx.IsGet() && !ctx.IsHead() { // read-only: 405, as vLLM's (FastAPI's) routes answer
			endpoint := "unknown"
			if p := string(path); p == "/v1/models" || p == "/metrics" {
				endpoint = p[strings.LastIndexByte(p, '/')+1:]
			}
			s.finishOther(ctx, endpoint, start, writeError(ctx, methodNotAllowed("GET, HEAD", ctx.Method(), path)))
			return
		}
		s.serveReadOnly(ctx, path, start)
	case "/ping": // vLLM's (SageMaker's health check): 200 when ready
		if !ctx.IsGet() && !ctx.IsPost() && !ctx.IsHead() { // vLLM's: GET and POST (HEAD with GET)
			s.finishOther(ctx, "unknown", start, writeError(ctx, methodNotAllowed("GET, HEAD, POST", ctx.Method(), path)))
			return
		}
		s.handlePing(ctx)
	default: // /debug/* included: admin listener only (admin.go)
		if bytes.HasPrefix(path, []byte("/v1/responses/")) {
			s.handleResponseByID(ctx) // responses.go
			return
		}
		if id, ok := bytes.CutPrefix(path, []byte("/v1/models/")); ok && len(id) > 0 {
			if !ctx.IsGet() && !ctx.IsHead() {
				s.finishOther(ctx, "models", start, writeError(ctx, methodNotAllowed("GET, HEAD", ctx.Method(), path)))
				return
			}
			s.finishOther(ctx, "models", start, s.handleModel(ctx, string(id))) // models.go
			return
		}
		s.finishOther(ctx, "unknown", start, writeError(ctx, fmt.Errorf("%w: %s %s", ErrNotFound, clipBytes(ctx.Method()), clipBytes(path))))
	}
}

// serveReadOnly answers the read-only paths (GET and HEAD).
func (s *Server) serveReadOnly(ctx *fasthttp.RequestCtx, path []byte, start time.Time) {
	switch string(path) {
	case "/v1/models":
		s.finishOther(ctx, "models", start, s.handleModels(ctx)) // otherlog.go
	case "/health":
		ctx.SetContentType("application/json")
		ctx.SetBodyString(`{"status":"ok"}`)
	case "/ready":
		s.handleReady(ctx)
	case "/version": // vLLM's: {"version": ...}, kvmesh's here
		s.handleVersion(ctx)
	case "/metrics":
		if s.cfg.AdminListen != "" { // served on the admin listener instead
			s.finishOther(ctx, "unknown", start, writeError(ctx, fmt.Errorf("%w: %s %s", ErrNotFound, clipBytes(ctx.Method()), clipBytes(path))))
			return
		}
		// With client authentication on, the metrics (engine addresses,
		// tenants' names) need a client credential like the API does; a
		// scraper sends one as a bearer token.
		if _, err := s.authenticate(&ctx.Request.Header); err != nil {
			s.finishOther(ctx, "metrics", start, writeError(ctx, err))
			return
		}
		s.metricsHandler(ctx)
		s.finishOther(ctx, "metrics", start, nil)
	}
}

// handleTransportError answers requests fasthttp could not read (too large, malformed HTTP).
func (s *Server) handleTransportError(ctx *fasthttp.RequestCtx, err error) {
	if s.tlsHandshakeFailed(ctx, err) { // tlshandshake.go: not a request, nothing can be answered on it
		return
	}
	h := &ctx.Request.Header
	// fasthttp resets the whole request, head included, when reading a
	// body fails (a chunked one too large or broken, any one cut by
	// readTimeout): what headerReceived read of that head is in heads.
	var broken fasthttp.ErrBrokenChunk
	ne, isNet := errors.AsType[net.Error](err)
	timeout := isNet && ne.Timeout()
	// The client closed its connection before its whole body came.
	cut := errors.Is(err, io.ErrUnexpectedEOF)
	reset := h.ContentLength() == 0 && (errors.Is(err, fasthttp.ErrBodyTooLarge) || errors.As(err, &broken) || timeout || cut)
	start := time.Now()
	note := headNote{cors: s.corsIndex(h.Peek("Origin")), messages: messagesPath(ctx.Path()), endpoint: transportEndpoint(ctx.Path())}
	id := h.Peek("X-Request-Id")
	if reset {
		note = s.heads.take(h)
		id = []byte(note.reqID)
		if note.endpoint == "" { // no note: its head is lost, or there was none
			if timeout && nothingRead(err) {
				// Not a byte of a request within readTimeout (a preconnect,
				// a probe holding the socket): closed without an answer and
				// counted as no request, as fasthttp closes an idle
				// keep-alive connection. A 408 here would be read as the
				// answer by a client starting its request just now.
				// fasthttp writes its response after this returns; to the
				// closed connection it goes nowhere.
				ctx.Conn().Close()
				return
			}
			note.endpoint = "unknown"
		}
		if note.path != "" { // the head as it came, for the access line
			h.SetMethod(note.method)
			ctx.Request.SetRequestURI(note.path)
		}
	} else {
		s.heads.forget(h) // a body refused before it was read (413, 401)
	}
	fail := func(err error, status string) {
		ae := writeErrorShape(ctx, err, note.messages)
		if status == "" {
			status = s.m.status(ae.status)
		}
		// Counted, logged and answered with a request id as a request the
		// handlers refused is (finishOther): an operator finds the client's
		// 413 by the id its SDK reports.
		s.refusedUnread(ctx, ae, status, note.endpoint, id, note.cors, start)
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) && s.deps.Auth != nil {
		aerr := note.authErr
		if !reset {
			_, aerr = s.authenticate(h)
		}
		if aerr != nil {
			fail(aerr, "") // headerReceived kept its body small: no credential, no buffer
			return
		}
	}
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		fail(fmt.Errorf("%w: limit is %d bytes", ErrTooLarge, s.cfg.MaxBodyBytes), "413")
		return
	}
	var small *fasthttp.ErrSmallBuffer
	if errors.As(err, &small) {
		fail(newAPIError(fasthttp.StatusRequestHeaderFieldsTooLarge, "invalid_request_error", "request_header_too_large", "",
			fmt.Errorf("%w: request header fields too large: limit is %d bytes", ErrBadRequest, maxHeaderBytes)), "431")
		return
	}
	if timeout {
		// The request did not arrive within readTimeout: 408, as RFC 9110
		// names it, and the connection closes.
		fail(newAPIError(fasthttp.StatusRequestTimeout, "invalid_request_error", "request_timeout", "",
			fmt.Errorf("%w: the request was not received within %v", ErrBadRequest, s.cfg.ReadTimeout)), "408")
		ctx.SetConnectionClose()
		return
	}
	if cut && note.path != "" {
		// Its head came and the client left during the body: a client
		// gone (499, as elsewhere), under the request's own endpoint and
		// id, not a 400 nobody reads.
		fail(newAPIError(StatusClientClosed, "invalid_request_error", "client_closed", "",
			fmt.Errorf("%w: the client closed the connection before its whole body came", ErrBadRequest)), "499")
		return
	}
	fail(badRequest("", fmt.Errorf("%w: %s", ErrBadRequest, transportErrText(err))), "400")
}

// nothingRead reports whether err, fasthttp's error reading a request
// whose head has no note (so no body was being read), is the first read
// on its connection failing: fasthttp hands that read's error over as it
// is, while a head cut short comes wrapped ("error when reading request
// headers: ...").
func nothingRead(err error) bool {
	_, bare := err.(net.Error) //nolint:errorlint // the unwrapped error is the signal
	return bare
}

// endpointOf is the inference endpoint path serves, 0 for none.
func endpointOf(path []byte) endpoint {
	switch string(path) {
	case "/v1/completions":
		return epCompletions
	case "/v1/chat/completions":
		return epChat
	case "/v1/responses":
		return epResponses
	case "/v1/messages":
		return epMessages
	case "/v1/embeddings", "/pooling", "/classify", "/score", "/v1/score", "/rerank", "/v1/rerank", "/v2/rerank", "/tokenize", "/detokenize",
		"/v1/messages/count_tokens":
		return epOther
	}
	return 0
}

// transportEndpoint is the endpoint label of a request fasthttp could not
// read, by its path ("unknown" when the path is not served or was lost
// with the request).
func transportEndpoint(path []byte) string {
	if ep := endpointOf(path); ep != 0 {
		return ep.String()
	}
	return "unknown"
}

// transportErrText is a fixed text for an error fasthttp met reading a
// request: its parse errors quote the offending header value (an
// Authorization header with a stray byte is the credential), so neither
// the client's answer nor the log gets their text. Connection errors keep
// theirs (addresses and a cause, no content).
func transportErrText(err error) string {
	var small *fasthttp.ErrSmallBuffer
	var chunk fasthttp.ErrBrokenChunk
	var ne net.Error
	var se syscall.Errno
	switch {
	case errors.As(err, &small):
		return "request header fields too large"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		return "request body too large"
	case errors.As(err, &chunk):
		return "malformed chunked request body"
	case errors.As(err, &ne), errors.As(err, &se), errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
		return err.Error()
	case strings.Contains(err.Error(), "request headers"):
		return "malformed request header"
	}
	return "malformed request"
}

// fasthttpLogger sends fasthttp's own messages (e.g. a client's malformed
// request, already answered) to slog at debug level, their errors as
// transportErrText.
type fasthttpLogger struct{ log *slog.Logger }

func (l fasthttpLogger) Printf(format string, args ...any) {
	if l.log.Enabled(context.Background(), slog.LevelDebug) {
		for i, a := range args {
			if err, ok := a.(error); ok {
				args[i] = transportErrText(err)
			}
		}
		l.log.Debug(fmt.Sprintf(format, args...), "source", "fasthttp")
	}
}

// limitSetter is the optional capability of an Admitter whose limit can
// follow the cluster's load (ingress/session's Admitter has it).
type limitSetter interface {
	SetLimit(n int)
	Stats() (inFlight, boosted, normal, limit int)
}

// followSaturation shrinks the admission limit to what is in service now
// while every engine is queueing (the cluster is saturated: more requests
// would only wait on the engines, where they cannot be prioritized), so new
// requests queue here instead, where follow-up turns of recent sessions go
// first; the configured limit returns when any engine has room.
func (s *Server) followSaturation() {
	ls, ok := s.deps.Admitter.(limitSetter)
	if !ok || s.admitBase <= 0 {
		return
	}
	engines := 0
	saturated := true
	s.satBuf = s.deps.Membership.Engines(s.satBuf[:0])
	for _, e := range s.satBuf {
		if !e.Healthy {
			continue
		}
		engines++
		if e.Waiting == 0 {
			saturated = false
		}
	}
	target := s.admitBase
	inFlight, _, _, limit := ls.Stats()
	if saturated && engines > 0 {
		target = min(s.admitBase, max(1, inFlight))
	}
	if target != limit {
		ls.SetLimit(target)
	}
}
