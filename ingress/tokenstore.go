package ingress

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// StoreTokenizers finds a model's tokenizer among the locally configured ones
// first and then among those the sidecars published to the mesh's tokenizer
// object store (internal/tokenstore): an ingress needs no local copy of a
// model's tokenizer files. A published model is fetched and loaded on first
// use or as soon as its manifest appears, and reloaded when a sidecar
// publishes a new revision.
//
// For is on the request path and never waits for NATS beyond FirstWait: a
// loaded tokenizer is one atomic load and a map read; a model known to be
// unpublished, or whose published files failed to fetch or load, is answered
// "none" at once, and after its retry time the store is asked again in the
// background (one fetch per model, owned by Run) while requests keep getting
// "none" until it has loaded. Only the very first lookup of a never-seen
// model waits, at most FirstWait, for that fetch; every lookup while the
// NATS connection is down answers with what is known, without a fetch.
type StoreTokenizers struct {
	static Tokenizers
	cfg    StoreTokenizersConfig
	log    *slog.Logger

	loaded atomic.Pointer[map[string]Tokenizer] // copy on write, under mu

	mu      sync.Mutex
	reader  *tokenstore.Reader                // nil until the bucket exists
	loading map[string]chan struct{}          // one fetch per model at a time
	missed  map[string]time.Time              // unpublished or failed models: retry after
	revs    map[string]string                 // model → loaded revision
	series  map[string][]prometheus.Collector // model → its loaded tokenizer's cache series, registered
	stopped bool                              // Run has returned: no new background fetches
	bg      sync.WaitGroup                    // background fetches, waited for by Run
	js      atomic.Pointer[jsHolder]          // set by Run
}

type jsHolder struct {
	js   jetstream.JetStream
	conn *natsutil.Conn  // Connected only: For never takes the nats.Conn's lock
	ctx  context.Context // Run's: ends the background fetches
}

// StoreTokenizersConfig configures StoreTokenizers.
type StoreTokenizersConfig struct {
	// CacheDir receives the fetched files (default: a temporary directory).
	CacheDir string
	// FetchTimeout bounds one fetch (run in the background; default 10s).
	FetchTimeout time.Duration
	// FirstWait bounds how long the first lookup of a never-seen model waits
	// for its fetch (default 1s); the fetch goes on in the background, and
	// every other lookup answers at once with what is known.
	FirstWait time.Duration
	// MissRetry is how long an unpublished model (or one whose files failed
	// to fetch or load) is answered "none" before the store is asked again
	// (default 5s).
	MissRetry time.Duration
	// Load builds a tokenizer from a fetched directory (default: as
	// LoadTokenizers does for a configured directory).
	Load func(model, dir string) (Tokenizer, error)
	// Registry receives each loaded tokenizer's prefix-cache series
	// (kvmesh_tokenizer_cache_*{model}, as LoadTokenizers registers them);
	// a new revision's replace the old one's. Nil: none registered.
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// NewStoreTokenizers wraps static (nil: none) with the mesh's tokenizer store.
// It does nothing until Run is given a NATS connection.
func NewStoreTokenizers(static Tokenizers, cfg StoreTokenizersConfig) *StoreTokenizers {
	if cfg.FetchTimeout <= 0 {
		cfg.FetchTimeout = 10 * time.Second
	}
	if cfg.MissRetry <= 0 {
		cfg.MissRetry = 5 * time.Second
	}
	if cfg.FirstWait <= 0 {
		cfg.FirstWait = time.Second
	}
	if cfg.Load == nil {
		cfg.Load = loadTokenizerDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &StoreTokenizers{static: static, cfg: cfg, log: cfg.Logger.With("component", "tokenstore"),
		loading: map[string]chan struct{}{}, missed: map[string]time.Time{}, revs: map[string]string{},
		series: map[string][]prometheus.Collector{}}
	m := map[string]Tokenizer{}
	s.loaded.Store(&m)
	return s
}

var _ Tokenizers = (*StoreTokenizers)(nil)

// loadTokenizerDir loads a fetched directory the way a configured one is loaded.
func loadTokenizerDir(model, dir string) (Tokenizer, error) {
	t, err := loadTokenizer(model, dir, "", nil)
	if err != nil {
		return nil, err // not a nil *hfTokenizer in an interface
	}
	return t, nil
}

// For returns model's tokenizer: a configured one or a loaded published one.
// It never waits on a NATS round trip, except that the very first lookup of a
// model (nothing known about it yet) waits at most FirstWait for its fetch:
// a tokenizer published long ago is then used from the first request on,
// while NATS being slow or partitioned costs that one request at most
// FirstWait and every other one nothing. A model known to be missing is
// answered "none" at once; once its retry time has passed the fetch is
// started in the background (single-flight) and the lookup still answers
// "none" at once. While the NATS connection is not connected no fetch starts;
// whether it is connected is read from natsutil.Conn.Connected, never from
// the nats.Conn (whose lock a reconnect holds through each attempt).
func (s *StoreTokenizers) For(model string) (Tokenizer, bool) {
	if s.static != nil {
		if t, ok := s.static.For(model); ok {
			return t, true
		}
	}
	if t, ok := (*s.loaded.Load())[model]; ok {
		return t, true
	}
	h := s.js.Load()
	if h == nil {
		return nil, false
	}
	s.mu.Lock()
	until, known := s.missed[model]
	if known && time.Now().Before(until) {
		s.mu.Unlock()
		return nil, false
	}
	// Connected, not nats.Conn.IsConnected: the latter waits for the
	// connection's lock, which the reconnect loop holds through each
	// connect attempt; against a hung server (TCP accepted, no INFO) that
	// stalled every request here for up to ConnectTimeout.
	if !h.conn.Connected() {
		s.mu.Unlock()
		return nil, false
	}
	if !known {
		// From now on the model is known-missing (retry due) until its
		// fetch says otherwise: concurrent lookups do not wait.
		s.missed[model] = time.Now()
	}
	done := s.startLocked(h, model)
	s.mu.Unlock()
	if known || done == nil {
		return nil, false
	}
	t := time.NewTimer(s.cfg.FirstWait)
	defer t.Stop()
	select {
	case <-done:
	case <-t.C:
	}
	tok, ok := (*s.loaded.Load())[model]
	return tok, ok
}

// startLocked starts model's background fetch unless one is under way (its
// channel is returned then) or Run has returned (nil). Called with s.mu held.
// The fetch is owned by the store: bounded by FetchTimeout, ended with Run's
// context, and waited for by Run before it returns.
func (s *StoreTokenizers) startLocked(h *jsHolder, model string) chan struct{} {
	if wait, ok := s.loading[model]; ok {
		return wait
	}
	if s.stopped || h.ctx.Err() != nil {
		return nil
	}
	done := make(chan struct{})
	s.loading[model] = done
	s.bg.Add(1)
	go func() {
		defer s.bg.Done()
		ctx, cancel := context.WithTimeout(h.ctx, s.cfg.FetchTimeout)
		defer cancel()
		err := s.fetch(ctx, model)
		s.finish(model, done, err)
	}()
	return done
}

// finish records the outcome of model's fetch and wakes its waiters.
func (s *StoreTokenizers) finish(model string, done chan struct{}, err error) {
	s.mu.Lock()
	delete(s.loading, model)
	if err != nil {
		// Unpublished, unreachable, or published files that do not
		// load: requests route without it until the retry time (a
		// new revision is loaded as soon as Run's watch sees it).
		// Before, only an unpublished model waited: a tokenizer that
		// failed to load was fetched and parsed again by every
		// request.
		s.missed[model] = time.Now().Add(s.cfg.MissRetry)
	} else {
		delete(s.missed, model)
	}
	s.mu.Unlock()
	close(done)
}

// refresh fetches and loads model's current revision unless it is loaded
// already; concurrent calls for a model share one fetch. Run's watch calls it
// (never a request: For starts a background fetch instead).
func (s *StoreTokenizers) refresh(ctx context.Context, model string) error {
	for {
		s.mu.Lock()
		if wait, ok := s.loading[model]; ok {
			s.mu.Unlock()
			select {
			case <-wait:
				if _, ok := (*s.loaded.Load())[model]; ok {
					return nil
				}
				continue
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		done := make(chan struct{})
		s.loading[model] = done
		s.mu.Unlock()
		err := s.fetch(ctx, model)
		s.finish(model, done, err)
		return err
	}
}

func (s *StoreTokenizers) fetch(ctx context.Context, model string) error {
	r, err := s.readerFor(ctx)
	if err != nil {
		return err
	}
	m, err := r.Manifest(ctx, model)
	if err != nil {
		return err
	}
	s.mu.Lock()
	have := s.revs[model]
	s.mu.Unlock()
	if have == m.Revision {
		return nil
	}
	dir, m, err := r.Fetch(ctx, model)
	if err != nil {
		s.log.Warn("fetch published tokenizer", "model", model, "err", err)
		return err
	}
	t, err := s.cfg.Load(model, dir)
	if err != nil {
		s.log.Warn("load published tokenizer", "model", model, "revision", m.Revision, "err", err)
		return err
	}
	s.mu.Lock()
	next := make(map[string]Tokenizer, len(*s.loaded.Load())+1)
	for k, v := range *s.loaded.Load() {
		next[k] = v
	}
	next[model] = t
	s.registerLocked(model, t) // before t is served: its requests count in its own series
	s.loaded.Store(&next)
	s.revs[model] = m.Revision
	s.mu.Unlock()
	s.log.Info("published tokenizer loaded", "model", model, "revision", m.Revision)
	return nil
}

// registerLocked makes model's kvmesh_tokenizer_cache_* series those of
// t's prefix cache: the series of a tokenizer t replaces are unregistered
// first. A model whose series are registered already by someone else (a
// configured tokenizer, which For answers with first) keeps those. Called
// with s.mu held.
func (s *StoreTokenizers) registerLocked(model string, t Tokenizer) {
	reg := s.cfg.Registry
	if reg == nil {
		return
	}
	for _, c := range s.series[model] {
		reg.Unregister(c)
	}
	delete(s.series, model)
	h, ok := t.(*hfTokenizer)
	if !ok {
		return
	}
	cs := h.enc.Collectors(model)
	for i, c := range cs {
		if err := reg.Register(c); err != nil {
			for _, done := range cs[:i] {
				reg.Unregister(done)
			}
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) {
				s.log.Warn("tokenizer cache metrics not registered", "model", model, "err", err)
			}
			return
		}
	}
	s.series[model] = cs
}

func (s *StoreTokenizers) readerFor(ctx context.Context) (*tokenstore.Reader, error) {
	s.mu.Lock()
	r := s.reader
	s.mu.Unlock()
	if r != nil {
		return r, nil
	}
	h := s.js.Load()
	if h == nil {
		return nil, errors.New("tokenizer store: not connected")
	}
	r, err := tokenstore.OpenReader(ctx, h.js, h.conn.Subjects.TokenizerBucket(), s.cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.reader = r
	s.mu.Unlock()
	return r, nil
}

// Run serves the store over conn until ctx ends: it watches the published
// manifests and (re)loads every model as soon as it is published or changed.
// The bucket may not exist yet (no sidecar has published): Run retries.
// Owned by the ingress's cluster; returns when ctx ends.
func (s *StoreTokenizers) Run(ctx context.Context, conn *natsutil.Conn) {
	js, err := jetstream.New(conn.NC)
	if err != nil {
		s.log.Error("tokenizer store", "err", err)
		return
	}
	s.js.Store(&jsHolder{js: js, conn: conn, ctx: ctx})
	defer func() {
		s.mu.Lock()
		s.stopped = true
		s.mu.Unlock()
		s.bg.Wait() // the background fetches end with ctx
	}()
	for fail := 0; ctx.Err() == nil; fail++ {
		r, err := s.readerFor(ctx)
		if err == nil {
			err = r.Watch(ctx, func(model string) {
				if err := s.refresh(ctx, model); err != nil && ctx.Err() == nil {
					s.log.Warn("reload published tokenizer", "model", model, "err", err)
				}
			})
		}
		if ctx.Err() != nil {
			return
		}
		d := min(time.Second<<min(fail, 5), 30*time.Second)
		d = d/2 + time.Duration(time.Now().UnixNano()%int64(d/2+1)) // jitter
		if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
			s.log.Warn("tokenizer store watch", "err", err, "retry_in", d)
		}
		t := time.NewTimer(d)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
