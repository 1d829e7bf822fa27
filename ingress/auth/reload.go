package auth

import (
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/filewatch"
)

// WatchConfig says how Keys follows its file.
type WatchConfig struct {
	// Interval is how often the keys file is polled (its modification
	// time, size and content, as the ingress's routes file is: no fsnotify
	// dependency). Default 2s.
	Interval time.Duration
	// Logger; default slog.Default(). Keys are never logged, only counts.
	Logger *slog.Logger
	// Registerer receives kvmesh_ingress_api_keys_reloads_total and
	// kvmesh_ingress_api_keys_reload_errors_total; nil: not registered.
	Registerer prometheus.Registerer
}

// Keys is the API keys of a Config with a keys file, re-read when the file
// changes, so a leaked key is revoked by editing the file (or the Secret it
// is mounted from) without a restart. A reload that fails to read or parse,
// or that finds no key in the file, is logged at ERROR and counted, and the
// previous keys stay. Check is safe for concurrent use and does not
// allocate.
type Keys struct {
	cfg      Config
	interval time.Duration
	log      *slog.Logger
	cur      atomic.Pointer[Store]
	errs     prometheus.Counter
	oks      prometheus.Counter

	// Owned by the goroutine calling Poll (Run's), after WatchKeys.
	file *filewatch.File
}

// WatchKeys loads cfg's keys once (every problem fails here: bad
// configuration fails at start) and returns them ready to Run. cfg must name
// a keys file, which must hold a key (Config.Required is implied).
func WatchKeys(cfg Config, wc WatchConfig) (*Keys, error) {
	if cfg.KeysFile == "" {
		return nil, fmt.Errorf("auth: %w: no keys file to watch", ErrConfig)
	}
	cfg.Required = true
	if wc.Interval <= 0 {
		wc.Interval = 2 * time.Second
	}
	if wc.Logger == nil {
		wc.Logger = slog.Default()
	}
	k := &Keys{cfg: cfg, interval: wc.Interval, log: wc.Logger.With("component", "auth", "file", cfg.KeysFile),
		errs: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_api_keys_reload_errors_total",
			Help: "API keys file reloads rejected (unreadable, invalid or without a key); the previous keys stay."}),
		oks: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_api_keys_reloads_total",
			Help: "API keys files loaded (at start and on change)."}),
	}
	if wc.Registerer != nil {
		for _, c := range []prometheus.Collector{k.errs, k.oks} {
			if err := wc.Registerer.Register(c); err != nil {
				if _, dup := errors.AsType[prometheus.AlreadyRegisteredError](err); !dup {
					return nil, err
				}
			}
		}
	}
	var err error
	if k.file, err = filewatch.New(cfg.KeysFile); err != nil {
		return nil, fmt.Errorf("auth: %w: keys file: %w", ErrConfig, err)
	}
	if err := k.load(); err != nil {
		return nil, err
	}
	return k, nil
}

// Check authenticates an Authorization header against the current keys
// (Store.Check).
func (k *Keys) Check(authorization []byte) (string, error) { return k.cur.Load().Check(authorization) }

// Enabled reports whether any key is configured (always, after WatchKeys).
func (k *Keys) Enabled() bool { return k.cur.Load().Enabled() }

// Len is the number of keys now in force.
func (k *Keys) Len() int { return k.cur.Load().Len() }

// Run polls the file until stop is closed. The caller owns the goroutine
// (the ingress server runs it and stops it on Close).
func (k *Keys) Run(stop <-chan struct{}) {
	t := time.NewTicker(k.interval)
	defer t.Stop()
	for {
		select {
		case <-stop:
			return
		case <-t.C:
			k.Poll()
		}
	}
}

// Poll reloads the file if it changed (filewatch.File.Poll). Run
// calls it; tests call it directly. Not safe to call concurrently.
func (k *Keys) Poll() {
	changed, err := k.file.Poll()
	if err != nil { // once until the file is back
		k.errs.Inc()
		k.log.Error("API keys file unreadable; keeping the previous keys", "err", err, "keys", k.Len())
	}
	if !changed {
		return
	}
	if err := k.load(); err != nil {
		k.errs.Inc()
		k.log.Error("API keys file rejected; keeping the previous keys", "err", err, "keys", k.Len())
	}
}

func (k *Keys) load() error {
	s, err := Load(k.cfg)
	if err != nil {
		return err
	}
	k.cur.Store(s)
	k.oks.Inc()
	k.log.Info("API keys loaded", "keys", s.Len())
	return nil
}
