package epp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/kvmesh/kvmesh/ingress"
)

// Deps are the picker's collaborators.
type Deps struct {
	// Ingress makes the routing decisions (required). New narrows its
	// engine list to the pool, so New must run before Ingress.Start.
	Ingress *ingress.Server
	// Pool is the InferencePool's ready endpoints; nil: every engine the
	// mesh knows is a candidate.
	Pool PoolEndpoints
	// Disaggregator decides P/D when Config.PD.Enabled; nil: the built-in
	// UncachedThreshold rule.
	Disaggregator Disaggregator
}

// Server is the ext_proc endpoint picker with its gRPC health service.
// New → Start → Close.
type Server struct {
	extprocv3.UnimplementedExternalProcessorServer

	cfg  Config
	ing  *ingress.Server
	mem  *poolMembership
	pool PoolEndpoints
	pd   Disaggregator
	eps  endpointCache
	log  *slog.Logger
	m    *metrics
	// authOn: client authentication is on, so the client's credentials
	// stay at the gateway; engineAuth: the Authorization the engines get
	// ("": none). ingress.Server.AuthOn, EngineAuthorization.
	authOn     bool
	engineAuth string

	gs     *grpc.Server
	health *health.Server
	ln     net.Listener
	xs     sync.Pool // *exchange
	// onPick, when set (benchmarks), gets every kvmesh_epp_pick_seconds
	// observation as it is made.
	onPick func(time.Duration)

	known     atomic.Bool // an engine of the pool has been known (readiness)
	readyMu   sync.Mutex  // orders setReady's updates against Close's
	draining  bool        // Close began: readiness stays NOT_SERVING (readyMu)
	quit      chan struct{}
	wg        sync.WaitGroup // owned goroutines: serve loop, readiness loop
	closeOnce sync.Once
}

// New builds a picker around an ingress that is not started yet.
func New(cfg Config, deps Deps) (*Server, error) {
	cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Ingress == nil {
		return nil, fmt.Errorf("%w: no ingress", ErrConfig)
	}
	s := &Server{cfg: cfg, ing: deps.Ingress, pool: deps.Pool, pd: deps.Disaggregator,
		log: cfg.Logger.With("component", "epp"), m: newMetrics(cfg.Registerer), quit: make(chan struct{}),
		authOn: deps.Ingress.AuthOn(), engineAuth: deps.Ingress.EngineAuthorization()}
	if cfg.PD.Enabled && s.pd == nil {
		s.pd = UncachedThreshold{Min: cfg.PD.MinUncachedTokens}
	}
	s.ing.WrapMembership(func(inner ingress.Membership) ingress.Membership {
		s.mem = &poolMembership{inner: inner, pool: deps.Pool, eps: &s.eps}
		return s.mem
	})
	s.xs.New = func() any { return &exchange{s: s} }
	tc, err := cfg.tlsConfig()
	if err != nil {
		return nil, err
	}
	// A message carries a whole body (BUFFERED, or a large chunk) and the
	// full-duplex answer passes it back in one: the size bound is the
	// body's plus room for headers and metadata, so a body past
	// MaxBodyBytes reaches requestBody's 413 instead of failing the stream
	// with grpc-go's 4 MiB default (ResourceExhausted, counted nowhere).
	msg := cfg.MaxBodyBytes + msgOverhead
	opts := append(transportOptions(), grpc.MaxRecvMsgSize(msg), grpc.MaxSendMsgSize(msg),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}))
	if tc != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(tc)))
	}
	s.health = health.NewServer()
	s.gs = grpc.NewServer(opts...)
	extprocv3.RegisterExternalProcessorServer(s.gs, s)
	healthpb.RegisterHealthServer(s.gs, s.health)
	s.setReady(false)
	return s, nil
}

// Start listens and serves until Close; it returns once listening.
func (s *Server) Start() error {
	ln, err := net.Listen("tcp", s.cfg.Listen)
	if err != nil {
		return fmt.Errorf("epp listen: %w", err)
	}
	s.ln = ln
	s.updateReady()
	s.wg.Add(2)
	go func() {
		defer s.wg.Done()
		if err := s.gs.Serve(ln); err != nil && !errors.Is(err, grpc.ErrServerStopped) {
			s.log.Error("grpc serve", "err", err)
		}
	}()
	go func() {
		defer s.wg.Done()
		s.readyLoop()
	}()
	s.log.Info("endpoint picker listening", "addr", s.Addr(), "tls", s.cfg.TLS, "pool", s.pool != nil, "pd", s.pd != nil)
	return nil
}

// Addr is the gRPC address, "" before Start.
func (s *Server) Addr() string {
	if s.ln == nil {
		return ""
	}
	return s.ln.Addr().String()
}

// Close turns readiness off (liveness stays on until the listener closes;
// the HTTP /ready says draining), keeps serving for Config.DrainDelay (new
// streams too: the gateway sends them until it learns the pod is leaving,
// and under FailClose a refused one is a failed request), then stops taking
// streams, lets open ones finish and stops, all bounded by ctx. Safe to
// call more than once.
func (s *Server) Close(ctx context.Context) {
	s.closeOnce.Do(func() {
		close(s.quit)
		// Readiness NOT_SERVING: the gateway stops sending. Liveness stays
		// SERVING while the process answers (a kubelet probing it during a
		// long drain delay must not restart the pod), until the listener
		// closes; the HTTP /ready says draining.
		s.readyMu.Lock()
		s.draining = true
		s.readyMu.Unlock()
		s.setReady(false)
		s.ing.Leaving()
		if d := s.cfg.DrainDelay; d > 0 {
			s.log.Info("draining: readiness NOT_SERVING, still serving", "for", d)
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-ctx.Done():
			}
			t.Stop()
		}
		s.health.Shutdown() // liveness too: the listener closes now
		done := make(chan struct{})
		go func() { s.gs.GracefulStop(); close(done) }()
		select {
		case <-done:
		case <-ctx.Done():
			s.gs.Stop()
			<-done
		}
		s.wg.Wait()
	})
}

// readyLoop follows the picker's readiness (updateReady) into the gRPC
// health service.
func (s *Server) readyLoop() {
	t := time.NewTicker(s.cfg.ReadyInterval)
	defer t.Stop()
	for {
		select {
		case <-s.quit:
			return
		case <-t.C:
			s.updateReady()
		}
	}
}

// updateReady sets readiness as GAIE's means it: the picker can decide
// (the index synced, the pool listed, an engine of the pool known once), not
// that an engine is healthy. With every engine down the picker answers the
// protocol's 503 with Retry-After itself; were it to leave the Service, the
// gateway would have no picker and answer its own error (FailClose) or pick
// blind (FailOpen), and would wait for readiness again when the engines
// return.
func (s *Server) updateReady() {
	if !s.known.Load() && len(s.mem.Engines(nil)) > 0 {
		s.known.Store(true)
	}
	s.setReady(s.ing.Synced() && s.known.Load() && (s.pool == nil || s.pool.Synced()))
}

// setReady sets readiness for the services GAIE's health checking names;
// liveness is SERVING while the process answers.
func (s *Server) setReady(ready bool) {
	s.readyMu.Lock()
	defer s.readyMu.Unlock()
	if s.draining {
		ready = false
	}
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ready {
		st = healthpb.HealthCheckResponse_SERVING
	}
	s.health.SetServingStatus(HealthLiveness, healthpb.HealthCheckResponse_SERVING)
	s.health.SetServingStatus(HealthReadiness, st)
	s.health.SetServingStatus(ExtProcService, st)
	s.health.SetServingStatus("", st)
}

// msgOverhead is what an ext_proc message may hold besides its body
// (headers, trailers, metadata, the protobuf framing): the gRPC message
// bound is Config.MaxBodyBytes plus this.
const msgOverhead = 1 << 20

// transportOptions are the gRPC settings for the data plane's ext_proc
// streams (the split benchmark's no-op server uses them too, so its floor is
// the same transport).
func transportOptions() []grpc.ServerOption {
	// Fixed flow-control windows instead of grpc-go's dynamic ones: a fixed
	// window turns off its bandwidth-delay estimator, which otherwise sends
	// a PING (and reads its ACK) whenever data arrives with no PING out —
	// nearly every request at 1,000 req/s — and a 1 MiB stream window needs
	// a WINDOW_UPDATE once per 256 KiB consumed instead of per 16 KiB. The
	// split benchmark's server reads fell from 5.6–6.2 to 4.1–5.0 per
	// request. 16 MiB for the connection is the estimator's own ceiling.
	return []grpc.ServerOption{grpc.InitialWindowSize(1 << 20), grpc.InitialConnWindowSize(16 << 20)}
}
