package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An engine whose metrics stop answering is gossiped as not ready after two
// failed scrapes, and as ready again after the next good one.
func TestScrapeFailuresMakeEngineUnready(t *testing.T) {
	var broken atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if broken.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n"))
	}))
	defer srv.Close()
	cfg := DefaultConfig()
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: srv.URL}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	e.mu.Lock()
	e.running = true // the event loop's part of readiness
	e.mu.Unlock()
	ready := func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.readyLocked() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.scrapeLoop(ctx, srv.Client(), srv.URL) }()
	defer func() { cancel(); <-done }()

	testutil.WaitFor(t, 10*time.Second, "a good scrape", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.load.Running == 1 })
	if !ready() {
		t.Fatal("not ready with a scraped engine")
	}
	broken.Store(true)
	testutil.WaitFor(t, 10*time.Second, "the engine to turn unready", func() bool { return !ready() })
	broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the engine to be ready again", ready)
}

// SGLang without --enable-metrics answers 404 on /metrics: the engine is
// alive and stays ready with its load unknown (compat report F5); a refused
// connection still makes it unready.
func TestMetrics404KeepsEngineReady(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); http.NotFound(w, r) }))
	cfg := DefaultConfig()
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: srv.URL}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	e.mu.Lock()
	e.running = true
	e.mu.Unlock()
	ready := func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.readyLocked() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.scrapeLoop(ctx, srv.Client(), srv.URL+"/metrics") }()
	defer func() { cancel(); <-done }()

	testutil.WaitFor(t, 10*time.Second, "four 404 scrapes", func() bool { return hits.Load() >= 4 })
	if !ready() || e.c.scrapeErrs.Load() != 0 || e.c.metricsMissing.Load() < 3 {
		t.Fatalf("ready %v, %d scrape errors, %d counted 404s: a 404 is an engine without metrics, not a dead one",
			ready(), e.c.scrapeErrs.Load(), e.c.metricsMissing.Load())
	}
	srv.Close() // connection refused from now on
	testutil.WaitFor(t, 10*time.Second, "the engine to turn unready", func() bool { return !ready() })
}
