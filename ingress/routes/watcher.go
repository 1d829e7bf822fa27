package routes

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/filewatch"
)

// WatcherConfig configures a Watcher.
type WatcherConfig struct {
	// Path is the RouteConfig file.
	Path string
	// Interval is how often the file's modification time, size and content are
	// polled (no fsnotify dependency; a reload within Interval is enough for
	// configuration). Default 2s.
	Interval time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer receives kvmesh_ingress_route_reload_errors_total and
	// kvmesh_ingress_route_reloads_total; nil: not registered.
	Registerer prometheus.Registerer
	// Optional lets the file not exist yet: until it appears there are no
	// routes (the ConfigMap the orchestrator renders from ModelRoutes,
	// mounted optional, appears with the first one). A file that exists
	// and is invalid still fails NewWatcher.
	Optional bool
}

// Watcher holds the current Table and reloads it when its file changes. A
// file that fails to read, parse or validate is logged and counted, and the
// previous Table stays. Table is safe for concurrent use.
type Watcher struct {
	cfg  WatcherConfig
	log  *slog.Logger
	cur  atomic.Pointer[Table]
	errs prometheus.Counter
	oks  prometheus.Counter

	// checkMu serializes Check (Run's ticks and a direct call).
	checkMu sync.Mutex
	file    *filewatch.File
}

// NewWatcher loads the file once; an invalid file at start is an error (bad
// configuration fails at start).
func NewWatcher(cfg WatcherConfig) (*Watcher, error) {
	if cfg.Interval <= 0 {
		cfg.Interval = 2 * time.Second
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	w := &Watcher{cfg: cfg, log: cfg.Logger.With("component", "routes", "file", cfg.Path),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_route_reload_errors_total",
			Help: "Route config reloads rejected (unreadable or invalid file); the previous routes stay."}),
		oks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_route_reloads_total",
			Help: "Route configs loaded (at start and on change)."}),
	}
	if cfg.Registerer != nil {
		for _, c := range []prometheus.Collector{w.errs, w.oks} {
			if err := cfg.Registerer.Register(c); err != nil {
				var are prometheus.AlreadyRegisteredError
				if !errors.As(err, &are) {
					return nil, err
				}
			}
		}
	}
	var err error
	w.file, err = filewatch.New(cfg.Path)
	if err != nil && cfg.Optional && errors.Is(err, fs.ErrNotExist) {
		w.cur.Store(NewTable(&Config{}, nil))
		w.log.Info("route config not there yet; no routes until it appears") // Check loads it once it does
		return w, nil
	}
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrConfig, err) // errors.Join put a newline in the one-line message
	}
	if err := w.load(); err != nil {
		return nil, err
	}
	return w, nil
}

// Table is the current routes (never nil after NewWatcher).
func (w *Watcher) Table() *Table { return w.cur.Load() }

// ReloadErrors is the number of rejected reloads (tests, /debug).
func (w *Watcher) ReloadErrors() float64 { return counterValue(w.errs) }

// Run polls the file until stop is closed. The caller owns the goroutine
// (the ingress server runs it on its own and stops it with Close).
func (w *Watcher) Run(stop <-chan struct{}) {
	t := time.NewTicker(w.cfg.Interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			w.Check()
		}
	}
}

// Check reloads the file if its modification time, size or content changed. Run
// calls it; tests call it directly. Safe to call concurrently.
func (w *Watcher) Check() {
	w.checkMu.Lock()
	defer w.checkMu.Unlock()
	changed, err := w.file.Poll()
	if err != nil { // once until the file is back
		w.errs.Inc()
		w.log.Error("route config unreadable; keeping the previous routes", "err", err)
	}
	if !changed {
		return
	}
	if err := w.load(); err != nil {
		w.errs.Inc()
		w.log.Error("route config rejected; keeping the previous routes", "err", err)
	}
}

func (w *Watcher) load() error {
	c, err := Load(w.cfg.Path)
	if err != nil {
		return err
	}
	w.cur.Store(NewTable(c, w.cur.Load()))
	w.oks.Inc()
	w.log.Info("route config loaded", "routes", len(c.Routes))
	return nil
}

// Static is a fixed Table (tests, embedders without a file).
type Static struct{ T *Table }

// Table returns the fixed table.
func (s Static) Table() *Table { return s.T }
