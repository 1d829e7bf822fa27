package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim/engine"
)

var errOverloaded = errors.New("sim: too many waiting requests")

// Server is one running simulator instance. All methods are safe for
// concurrent use.
type Server struct {
	cfg     Config
	log     *slog.Logger
	tok     Tokenizer
	chat    ChatRenderer
	ranks   []*rank
	metrics *metrics
	pd      *pdState // nil without P/D
	created int64

	ln      net.Listener
	httpSrv *http.Server
	cancel  context.CancelFunc
	quit    chan struct{} // closed by Close: handlers stop waiting
	wg      sync.WaitGroup

	closeOnce sync.Once
	closeErr  error
	nextID    atomic.Uint64
	loras     *loras // nil unless Config.LoRA.Enable
}

// Start validates cfg, binds the HTTP listener and the ZMQ sockets of every
// rank, and starts serving. It returns once everything is bound, so the
// addresses are known. The server stops when ctx is done or Close is called.
func Start(ctx context.Context, cfg Config) (*Server, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "sim", "model", cfg.Model), loras: enabledLoRAs(cfg.LoRA),
		tok: cfg.Tokenizer, chat: cfg.Chat, quit: make(chan struct{}), created: time.Now().Unix()}
	if s.tok == nil {
		s.tok = byteTokenizer{}
	}
	if s.chat == nil {
		s.chat = llama3Chat{}
	}
	for i := 0; i < cfg.DP; i++ {
		rk, err := newRank(s, i)
		if err != nil {
			s.closeRanks()
			return nil, fmt.Errorf("start sim: %w", err)
		}
		s.ranks = append(s.ranks, rk)
	}
	s.metrics = newMetrics(s)
	if cfg.PD.Enabled() {
		pd, err := newPDState(s)
		if err != nil {
			s.closeRanks()
			return nil, fmt.Errorf("start sim: %w", err)
		}
		s.pd = pd
	}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		if s.pd != nil {
			s.pd.closeListeners()
		}
		s.closeRanks()
		return nil, fmt.Errorf("start sim: listen %s: %w", cfg.HTTPAddr, err)
	}
	s.ln = ln
	s.httpSrv = &http.Server{Handler: s.routes(), ReadHeaderTimeout: cfg.ReadHeaderTimeout, ErrorLog: slog.NewLogLogger(s.log.Handler(), slog.LevelDebug)}
	runCtx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	for _, rk := range s.ranks {
		s.wg.Add(1)
		go func() { defer s.wg.Done(); rk.run(runCtx) }()
	}
	if s.pd != nil {
		s.pd.start()
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := s.httpSrv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			s.log.Error("http serve", "err", err)
		}
	}()
	s.wg.Add(1)
	go func() { // stop with ctx as well as with Close
		defer s.wg.Done()
		select {
		case <-ctx.Done():
			go s.Close() // Close waits for this goroutine
		case <-s.quit:
		}
	}()
	s.log.Info("sim started", "http", s.HTTPAddr(), "kv_events", s.EventsEndpoints(), "kv_replay", s.ReplayEndpoints(),
		"dp", cfg.DP, "profile", cfg.Engine.Profile.Name, "time_scale", cfg.TimeScale)
	return s, nil
}

// Close stops serving, aborts streams in flight, stops the drivers and
// closes the sockets. It is idempotent and returns the first close error.
func (s *Server) Close() error {
	s.closeOnce.Do(func() {
		close(s.quit)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if err := s.httpSrv.Shutdown(ctx); err != nil {
			_ = s.httpSrv.Close()
		}
		s.cancel()
		if s.pd != nil {
			s.pd.close()
		}
		s.wg.Wait()
		s.closeErr = s.closeRanks()
	})
	return s.closeErr
}

func (s *Server) closeRanks() error {
	var errs []error
	for _, rk := range s.ranks {
		if rk.pub != nil {
			if err := rk.pub.Close(); err != nil {
				errs = append(errs, fmt.Errorf("rank %d: close publisher: %w", rk.idx, err))
			}
		}
	}
	return errors.Join(errs...)
}

// Config returns the configuration in effect (defaults applied).
func (s *Server) Config() Config { return s.cfg }

// HTTPAddr is the bound HTTP address (host:port).
func (s *Server) HTTPAddr() string { return s.ln.Addr().String() }

// URL is the base URL of the HTTP API ("http://host:port").
func (s *Server) URL() string { return "http://" + s.HTTPAddr() }

// DP is the number of ranks.
func (s *Server) DP() int { return len(s.ranks) }

// EventsEndpoint is rank r's PUB endpoint for a subscriber ("" without events).
func (s *Server) EventsEndpoint(r int) string {
	if rk := s.ranks[r]; rk.pub != nil {
		return rk.pub.Endpoint()
	}
	return ""
}

// ReplayEndpoint is rank r's ROUTER replay endpoint ("" without replay).
func (s *Server) ReplayEndpoint(r int) string {
	if rk := s.ranks[r]; rk.pub != nil {
		return rk.pub.ReplayEndpoint()
	}
	return ""
}

// EventsEndpoints lists every rank's PUB endpoint.
func (s *Server) EventsEndpoints() []string {
	out := make([]string, len(s.ranks))
	for i := range s.ranks {
		out[i] = s.EventsEndpoint(i)
	}
	return out
}

// ReplayEndpoints lists every rank's replay endpoint.
func (s *Server) ReplayEndpoints() []string {
	out := make([]string, len(s.ranks))
	for i := range s.ranks {
		out[i] = s.ReplayEndpoint(i)
	}
	return out
}

// Load returns rank r's engine load.
func (s *Server) Load(r int) engine.Load { return s.ranks[r].load() }

// CachedBlocks returns rank r's own prefix cache in a tier (GPU or CPU), each
// block with its engine hash, kvmesh key, parent hash and tokens.
func (s *Server) CachedBlocks(r int, tier kvevents.Tier) []engine.CachedBlock {
	rk := s.ranks[r]
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.eng.CachedBlocks(tier)
}

// CachedKeys returns the kvmesh keys (DESIGN.md Contract 1) of every block
// in rank r's cache tier, sorted and de-duplicated: exactly the set a
// sidecar must publish for this engine and tier.
func (s *Server) CachedKeys(r int, tier kvevents.Tier) []uint64 {
	blocks := s.CachedBlocks(r, tier)
	keys := make([]uint64, 0, len(blocks))
	for _, b := range blocks {
		keys = append(keys, b.Key)
	}
	slices.Sort(keys)
	return slices.Compact(keys)
}

// ResetPrefixCache clears every rank's prefix cache (AllBlocksCleared). It
// fails with engine.ErrBusy while requests are running.
func (s *Server) ResetPrefixCache() error { return s.resetPrefixCache(false) }

// ResetPrefixCacheForce preempts every running request first (they
// recompute afterwards), so the reset always succeeds — vLLM's
// reset_prefix_cache(reset_running_requests=True).
func (s *Server) ResetPrefixCacheForce() error { return s.resetPrefixCache(true) }

func (s *Server) resetPrefixCache(force bool) error {
	var errs []error
	for _, rk := range s.ranks {
		rk.mu.Lock()
		if force {
			rk.eng.PreemptAll()
		}
		if err := rk.eng.ResetPrefixCache(rk.arrivalTime()); err != nil {
			errs = append(errs, fmt.Errorf("rank %d: %w", rk.idx, err))
		}
		rk.mu.Unlock()
	}
	return errors.Join(errs...)
}

// Restart simulates an engine process restart on every rank: caches empty,
// requests in flight aborted, event sequence numbers back to 0 and the
// replay buffer emptied, on the same ports.
func (s *Server) Restart() error {
	var errs []error
	for _, rk := range s.ranks {
		errs = append(errs, rk.restart())
	}
	return errors.Join(errs...)
}

// SetDropRate changes the fault switch of every rank's publisher.
func (s *Server) SetDropRate(rate float64) {
	for _, rk := range s.ranks {
		if rk.pub != nil {
			rk.pub.SetDropRate(rate)
		}
	}
}

// DropNext withholds rank r's next n event batches from the live socket.
func (s *Server) DropNext(r, n int) {
	if rk := s.ranks[r]; rk.pub != nil {
		rk.pub.DropNext(n)
	}
}

// EventStats returns rank r's publisher counters.
func (s *Server) EventStats(r int) kvtest.PublisherStats {
	if rk := s.ranks[r]; rk.pub != nil {
		return rk.pub.Stats()
	}
	return kvtest.PublisherStats{}
}
