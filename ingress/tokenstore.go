package ingress

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/tokenstore"
)

// StoreTokenizers finds a model's tokenizer among the locally configured ones
// first and then among those the sidecars published to the mesh's tokenizer
// object store (internal/tokenstore): an ingress needs no local copy of a
// model's tokenizer files. A published model is fetched and loaded on first
// use (the first request waits for it, at most FetchTimeout) or as soon as its
// manifest appears, and reloaded when a sidecar publishes a new revision.
//
// For is on the request path: a loaded tokenizer is one atomic load and a map
// read; a model known to be unpublished, or whose published files failed to
// fetch or load, is answered "none" without I/O until its retry time.
type StoreTokenizers struct {
	static Tokenizers
	cfg    StoreTokenizersConfig
	log    *slog.Logger

	loaded atomic.Pointer[map[string]Tokenizer] // copy on write, under mu

	mu      sync.Mutex
	reader  *tokenstore.Reader       // nil until the bucket exists
	loading map[string]chan struct{} // one fetch per model at a time
	missed  map[string]time.Time     // unpublished or failed models: retry after
	revs    map[string]string        // model → loaded revision
	js      atomic.Pointer[jsHolder] // set by Run
}

type jsHolder struct{ js jetstream.JetStream }

// StoreTokenizersConfig configures StoreTokenizers.
type StoreTokenizersConfig struct {
	// CacheDir receives the fetched files (default: a temporary directory).
	CacheDir string
	// FetchTimeout bounds how long a request waits for a first fetch (default 10s).
	FetchTimeout time.Duration
	// MissRetry is how long an unpublished model (or one whose files failed
	// to fetch or load) is answered "none" before the store is asked again
	// (default 5s).
	MissRetry time.Duration
	// Load builds a tokenizer from a fetched directory (default: as
	// LoadTokenizers does for a configured directory).
	Load   func(model, dir string) (Tokenizer, error)
	Logger *slog.Logger
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
	if cfg.Load == nil {
		cfg.Load = loadTokenizerDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	s := &StoreTokenizers{static: static, cfg: cfg, log: cfg.Logger.With("component", "tokenstore"),
		loading: map[string]chan struct{}{}, missed: map[string]time.Time{}, revs: map[string]string{}}
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

// For returns model's tokenizer: a configured one, a loaded published one, or
// (the first time) one fetched now, waiting at most FetchTimeout.
func (s *StoreTokenizers) For(model string) (Tokenizer, bool) {
	if s.static != nil {
		if t, ok := s.static.For(model); ok {
			return t, true
		}
	}
	if t, ok := (*s.loaded.Load())[model]; ok {
		return t, true
	}
	if s.js.Load() == nil {
		return nil, false
	}
	s.mu.Lock()
	if until, ok := s.missed[model]; ok && time.Now().Before(until) {
		s.mu.Unlock()
		return nil, false
	}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), s.cfg.FetchTimeout)
	defer cancel()
	if err := s.refresh(ctx, model); err != nil {
		return nil, false
	}
	t, ok := (*s.loaded.Load())[model]
	return t, ok
}

// refresh fetches and loads model's current revision unless it is loaded
// already; concurrent calls for a model share one fetch.
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
	s.loaded.Store(&next)
	s.revs[model] = m.Revision
	s.mu.Unlock()
	s.log.Info("published tokenizer loaded", "model", model, "revision", m.Revision)
	return nil
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
	r, err := tokenstore.OpenReader(ctx, h.js, s.cfg.CacheDir)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.reader = r
	s.mu.Unlock()
	return r, nil
}

// Run serves the store over nc until ctx ends: it watches the published
// manifests and (re)loads every model as soon as it is published or changed.
// The bucket may not exist yet (no sidecar has published): Run retries.
// Owned by the ingress's cluster; returns when ctx ends.
func (s *StoreTokenizers) Run(ctx context.Context, nc *nats.Conn) {
	js, err := jetstream.New(nc)
	if err != nil {
		s.log.Error("tokenizer store", "err", err)
		return
	}
	s.js.Store(&jsHolder{js: js})
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
