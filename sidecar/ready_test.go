package sidecar

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// breakableMetrics is a FAKE engine's /metrics answering body, or 503
// while broken is set.
func breakableMetrics(t *testing.T, body string) (url string, broken *atomic.Bool) {
	t.Helper()
	broken = new(atomic.Bool)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		if broken.Load() {
			http.Error(w, "down", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte(body))
	}))
	t.Cleanup(srv.Close)
	return srv.URL, broken
}

// An engine whose metrics stop answering is gossiped as not ready after two
// failed scrapes, and as ready again after the next good one.
func TestScrapeFailuresMakeEngineUnready(t *testing.T) {
	url, broken := breakableMetrics(t, "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\n")
	var logs testutil.SyncBuffer
	s, e := polledEngine(t, url, &logs, true)
	ready := func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.readyLocked() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.scrapeLoop(ctx, http.DefaultClient, url) }()
	defer func() { cancel(); <-done }()

	testutil.WaitFor(t, 10*time.Second, "a good scrape", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.load.Running == 1 })
	if !ready() {
		t.Fatal("not ready with a scraped engine")
	}
	broken.Store(true)
	testutil.WaitFor(t, 10*time.Second, "the engine to turn unready", func() bool { return !ready() })
	testutil.WaitFor(t, 10*time.Second, "more failed scrapes", func() bool { return e.c.scrapeErrs.Load() >= 5 })
	// An operator sees it: the state, the gauge, one warning per outage.
	if st := s.Status()[0]; st.Ready || !strings.Contains(st.ScrapeError, "503") {
		t.Fatalf("status while unready: ready %v, scrape error %q", st.Ready, st.ScrapeError)
	}
	if v := readyGauge(t, s); v != 0 {
		t.Fatalf("kvmesh_sidecar_engine_ready %v while unready", v)
	}
	if n := strings.Count(logs.String(), "engine not answering its metrics"); n != 1 {
		t.Fatalf("%d warnings for one outage:\n%s", n, logs.String())
	}
	broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the engine to be ready again", ready)
	if st := s.Status()[0]; !st.Ready || st.ScrapeError != "" || readyGauge(t, s) != 1 ||
		!strings.Contains(logs.String(), "engine answering its metrics again") {
		t.Fatalf("status once ready again: %+v, gauge %v, logs:\n%s", st, readyGauge(t, s), logs.String())
	}
}

// polledEngine makes a sidecar (not run) for one engine at url whose
// metrics and /v1/models a test polls itself (scrapeLoop, modelsLoop) at
// test speed, logging to logs; running marks its event loop as running
// (the event loop's part of readiness).
func polledEngine(t *testing.T, url string, logs io.Writer, running bool) (*Sidecar, *engine) {
	t.Helper()
	cfg := DefaultConfig()
	cfg.ScrapeInterval, cfg.ModelsInterval = 10*time.Millisecond, 5*time.Millisecond
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: url}}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	e.mu.Lock()
	e.running = running
	e.mu.Unlock()
	return s, e
}

// readyGauge is s's kvmesh_sidecar_engine_ready of its one engine.
func readyGauge(t *testing.T, s *Sidecar) float64 {
	t.Helper()
	mfs, err := s.gather.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_sidecar_engine_ready" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no kvmesh_sidecar_engine_ready")
	return -1
}

// SGLang without --enable-metrics answers 404 on /metrics: the engine is
// alive and stays ready with its load unknown (compat report F5); a refused
// connection still makes it unready.
func TestMetrics404KeepsEngineReady(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits.Add(1); http.NotFound(w, r) }))
	_, e := polledEngine(t, srv.URL, io.Discard, true)
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

// An engine listing more LoRA adapters than gossip carries (64) is warned
// about once per change of how many are left out, not on every poll.
func TestLoRAsLeftOutWarnedOnce(t *testing.T) {
	var count atomic.Int32
	count.Store(70)
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		polls.Add(1)
		var sb strings.Builder
		sb.WriteString(`{"object":"list","data":[{"id":"m","parent":null}`)
		for i := range int(count.Load()) {
			fmt.Fprintf(&sb, `,{"id":"adapter-%03d","parent":"m"}`, i)
		}
		sb.WriteString(`]}`)
		_, _ = w.Write([]byte(sb.String()))
	}))
	defer srv.Close()
	var logs testutil.SyncBuffer
	_, e := polledEngine(t, srv.URL, &logs, false)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.modelsLoop(ctx, srv.Client(), srv.URL+"/v1/models") }()
	defer func() { cancel(); <-done }()
	const warning = "engine lists LoRA adapters the mesh does not gossip"
	testutil.WaitFor(t, 10*time.Second, "polls", func() bool { return polls.Load() >= 4 })
	if n := strings.Count(logs.String(), warning); n != 1 || !strings.Contains(logs.String(), "left_out=6") {
		t.Fatalf("%d warnings for 70 adapters:\n%s", n, logs.String())
	}
	count.Store(10) // fits: nothing to say
	testutil.WaitFor(t, 10*time.Second, "the shorter list", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.lorasLeftOut == 0 })
	count.Store(66)
	testutil.WaitFor(t, 10*time.Second, "a second warning", func() bool { return strings.Count(logs.String(), warning) == 2 })
	if !strings.Contains(logs.String(), "left_out=2") {
		t.Fatalf("second warning:\n%s", logs.String())
	}
}

// An engine whose /v1/models stops listing the sidecar's model (restarted
// with another, or another engine at its URL) is not ready, logged at error
// once per change naming both models and exported as
// kvmesh_sidecar_engine_model_mismatch (0 from the start); it is ready
// again, with one line, once the model is listed again.
func TestModelMismatchMakesEngineUnready(t *testing.T) {
	var served atomic.Value
	served.Store("m")
	var polls atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		polls.Add(1)
		fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"parent":null,"root":"/models/x","max_model_len":4096}]}`, served.Load())
	}))
	defer srv.Close()
	var logs testutil.SyncBuffer
	s, e := polledEngine(t, srv.URL, &logs, true)
	if v := mismatchGauge(t, s); v != 0 {
		t.Fatalf("kvmesh_sidecar_engine_model_mismatch %v before any poll", v)
	}
	ready := func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.readyLocked() }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.modelsLoop(ctx, srv.Client(), srv.URL+"/v1/models") }()
	defer func() { cancel(); <-done }()
	waitPolls := func(n int32) {
		t.Helper()
		from := polls.Load()
		testutil.WaitFor(t, 10*time.Second, "more polls", func() bool { return polls.Load() >= from+n })
	}

	waitPolls(2)
	if !ready() || mismatchGauge(t, s) != 0 {
		t.Fatalf("serving the model: ready %v, gauge %v", ready(), mismatchGauge(t, s))
	}
	const errLine = "engine does not serve the configured model"
	served.Store("other")
	waitPolls(4)
	if st := s.Status()[0]; ready() || st.Ready || st.ModelMismatch != "engine serves other" || mismatchGauge(t, s) != 1 || readyGauge(t, s) != 0 {
		t.Fatalf("serving another model: ready %v, status %+v, mismatch gauge %v", ready(), st, mismatchGauge(t, s))
	}
	if n := strings.Count(logs.String(), errLine); n != 1 || !strings.Contains(logs.String(), "level=ERROR") ||
		!strings.Contains(logs.String(), "configured=m served=other") {
		t.Fatalf("%d errors for one mismatch:\n%s", n, logs.String())
	}
	e.mu.Lock()
	root, maxLen := e.root, e.maxModelLen
	e.mu.Unlock()
	if root != "/models/x" || maxLen != 4096 {
		t.Fatalf("the other model's card replaced this one's: root %q, max_model_len %d", root, maxLen)
	}
	served.Store("third") // a change: said again
	testutil.WaitFor(t, 10*time.Second, "a second error", func() bool { return strings.Count(logs.String(), errLine) == 2 })
	served.Store("m")
	testutil.WaitFor(t, 10*time.Second, "ready again", ready)
	if st := s.Status()[0]; st.ModelMismatch != "" || mismatchGauge(t, s) != 0 ||
		!strings.Contains(logs.String(), "engine serves the configured model again") {
		t.Fatalf("once served again: %+v, gauge %v, logs:\n%s", st, mismatchGauge(t, s), logs.String())
	}
}

// mismatchGauge is s's kvmesh_sidecar_engine_model_mismatch of its one engine.
func mismatchGauge(t *testing.T, s *Sidecar) float64 {
	t.Helper()
	mfs, err := s.gather.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_sidecar_engine_model_mismatch" {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatal("no kvmesh_sidecar_engine_model_mismatch")
	return -1
}
