package sidecar

import (
	"context"
	"encoding/json"
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

// workingMetrics is a FAKE vLLM /metrics: while working is set, every
// scrape finds more prompt tokens and prefix-cache queries and a request
// running; otherwise the counters stand still and nothing runs. scrapes
// counts the scrapes answered.
func workingMetrics(t *testing.T) (url string, working *atomic.Bool, scrapes *atomic.Int64) {
	t.Helper()
	working, scrapes = new(atomic.Bool), new(atomic.Int64)
	var tokens atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		defer scrapes.Add(1)
		running, usage := 0, 0.0
		if working.Load() {
			tokens.Add(64)
			running, usage = 1, 0.02
		}
		n := tokens.Load()
		_, _ = fmt.Fprintf(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} %d\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\"} %g\n"+
			"# TYPE vllm:prompt_tokens_total counter\nvllm:prompt_tokens_total{engine=\"0\"} %d\n"+
			"# TYPE vllm:prefix_cache_queries_total counter\nvllm:prefix_cache_queries_total{engine=\"0\"} %d\n", running, usage, n, n)
	}))
	t.Cleanup(srv.Close)
	return srv.URL, working, scrapes
}

// gaugeOf is s's gauge name for engine.
func gaugeOf(t *testing.T, s *Sidecar, name, engine string) float64 {
	t.Helper()
	mfs, err := s.gather.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "engine" && l.GetValue() == engine {
					return m.GetGauge().GetValue()
				}
			}
		}
	}
	t.Fatalf("no %s{engine=%q}", name, engine)
	return -1
}

// A sidecar given the wrong events and replay ports (fault tester N1)
// was ready, its engine gossiped ready with no keys, while the engine
// served thousands of requests routed without cache affinity; only backed-
// off replay timeouts said anything. Now an engine whose metrics show it
// working for EventsSilentAfter with no KV-event batch arriving is warned
// about (naming the endpoints), kvmesh_sidecar_events_silent is 1 and
// /debug/state says events_silent; the sidecar and the engine stay ready
// (the engine serves correctly). A batch ends it. Two engines in one
// sidecar: "typo" listens on ports where nobody publishes; "quiet" on its
// engine's real ones, the engine publishing nothing until told.
func TestWorkingEngineWithoutEventsIsMarked(t *testing.T) {
	srv := testutil.NATS(t)
	typoURL, typoWork, typoScrapes := workingMetrics(t)
	quietURL, quietWork, quietScrapes := workingMetrics(t)
	pub := newPublisher(t, "tcp://127.0.0.1:0")
	const typoEvents, typoReplay = "tcp://127.0.0.1:1", "tcp://127.0.0.1:2"

	var logs testutil.SyncBuffer
	cfg := DefaultConfig()
	cfg.Engines = []EngineConfig{
		{ID: "typo", Model: "m", URL: typoURL, Events: typoEvents, Replay: typoReplay},
		{ID: "quiet", Model: "m", URL: quietURL, Events: pub.Endpoint(), Replay: pub.ReplayEndpoint()},
	}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.ScrapeInterval, cfg.ModelsInterval, cfg.BatchWindow = 5*time.Millisecond, 0, 0
	cfg.EventsSilentAfter = 30 * time.Millisecond
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, 10*time.Second, "ready", s.Ready)
	typo, quiet := s.engines[0], s.engines[1]
	silent := func(e *engine) bool { e.mu.Lock(); defer e.mu.Unlock(); return e.silence.silent }

	// Idle engines are not silent, however long no event comes.
	testutil.WaitFor(t, 10*time.Second, "idle scrapes", func() bool { return typoScrapes.Load() >= 20 })
	if silent(typo) || silent(quiet) {
		t.Fatal("an idle engine marked silent")
	}

	typoWork.Store(true)
	quietWork.Store(true)
	testutil.WaitFor(t, 10*time.Second, "both engines marked silent", func() bool { return silent(typo) && silent(quiet) })

	base := "http://" + s.AdminAddr().String()
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if g := gaugeOf(t, s, "kvmesh_sidecar_events_silent", "typo"); g != 1 {
		t.Fatalf("kvmesh_sidecar_events_silent{engine=typo} %v while silent", g)
	}
	if g := gaugeOf(t, s, "kvmesh_sidecar_engine_ready", "typo"); g != 1 {
		t.Fatalf("kvmesh_sidecar_engine_ready{engine=typo} %v: an engine without events still serves", g)
	}
	if code, _ := get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready %d: the sidecar's readiness gates the engine's pod", code)
	}
	_, body := get("/debug/state")
	var st []Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st) != 2 {
		t.Fatalf("/debug/state %q: %v", body, err)
	}
	if !st[0].EventsSilent || !st[0].Ready || st[0].WorkWithoutEventsSince == nil || st[0].LastBatch != nil {
		t.Fatalf("/debug/state for typo: %s", body)
	}
	out := logs.String()
	warn := "engine serves requests but no KV event arrives"
	if !strings.Contains(out, warn) || !strings.Contains(out, "events="+typoEvents) || !strings.Contains(out, "replay="+typoReplay) {
		t.Fatalf("no warning naming the endpoints:\n%s", out)
	}
	// Warned once per engine, not at every scrape.
	n := strings.Count(logs.String(), warn)
	from := typoScrapes.Load()
	testutil.WaitFor(t, 10*time.Second, "more scrapes", func() bool { return typoScrapes.Load() >= from+20 })
	if m := strings.Count(logs.String(), warn); m != n || n != 2 {
		t.Fatalf("%d warnings, then %d: want one per engine", n, m)
	}

	// The quiet engine stops working and publishes a batch: it arrives,
	// and its events are no longer silent; the typo'd one's still are.
	quietWork.Store(false)
	// Two more scrapes answered: the last working one has been taken.
	from = quietScrapes.Load()
	testutil.WaitFor(t, 10*time.Second, "idle scrapes of quiet", func() bool { return quietScrapes.Load() >= from+2 })
	if _, err := pub.Publish(block(7, 0)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the batch", func() bool { return quiet.c.batches.Load() == 1 })
	if silent(quiet) || !silent(typo) {
		t.Fatalf("after the quiet engine's batch: quiet silent %v, typo silent %v", silent(quiet), silent(typo))
	}
	if g := gaugeOf(t, s, "kvmesh_sidecar_events_silent", "quiet"); g != 0 {
		t.Fatalf("kvmesh_sidecar_events_silent{engine=quiet} %v after a batch", g)
	}
	if st := s.Status()[1]; st.EventsSilent || st.LastBatch == nil || st.WorkWithoutEventsSince != nil {
		t.Fatalf("status of quiet after its batch: %+v", st)
	}
	if !strings.Contains(logs.String(), "KV events arrive again") {
		t.Fatalf("no word that the events arrive again:\n%s", logs.String())
	}
}

// The window is of work: an engine idle for longer than it, then given a
// prompt too short to fill a block (so no event is due), is not marked
// silent, and the scrape after a batch does not count the work that batch
// reported. Before, the first sign of work after the last batch started a
// window that idle time filled, so a healthy engine was marked after any
// idle spell (regression tester). Scrapes are given to the watch directly:
// no timing.
func TestSilenceWindowIsOfWork(t *testing.T) {
	e := &engine{s: &Sidecar{cfg: Config{EventsSilentAfter: 30 * time.Second}}, log: slog.New(slog.DiscardHandler)}
	t0 := time.Unix(1_000_000, 0)
	scrape := func(at time.Duration, work float64) {
		e.watchSilence(Load{Scraped: t0.Add(at), work: work, workOK: true})
	}
	scrape(0, 100)
	scrape(2*time.Second, 150) // a request: its blocks' batch arrives
	e.batchArrived()
	scrape(4*time.Second, 160) // the rest of that request's counting
	if !e.silence.workSince.IsZero() {
		t.Fatalf("the scrape after a batch counted as work since it (%v)", e.silence.workSince)
	}
	scrape(20*time.Second, 160) // idle
	scrape(40*time.Second, 160)
	scrape(41*time.Second, 165) // "hi": no block, no event due
	if e.silence.silent {
		t.Fatal("a healthy engine marked silent after an idle spell and a short prompt")
	}
	// The same without a batch before: two short prompts 39 s apart are
	// not 39 s of work.
	e2 := &engine{s: e.s, log: e.log}
	for _, sc := range []struct {
		at   time.Duration
		work float64
	}{{0, 100}, {2 * time.Second, 105}, {20 * time.Second, 105}, {40 * time.Second, 105}, {41 * time.Second, 110}} {
		e2.watchSilence(Load{Scraped: t0.Add(sc.at), work: sc.work, workOK: true})
	}
	if e2.silence.silent {
		t.Fatal("two short prompts with an idle spell between them taken for a window of work")
	}
	// Steady work with no batch for the window is silent.
	for at := 42 * time.Second; at <= 75*time.Second; at += 3 * time.Second {
		scrape(at, 165+float64(at/time.Second))
	}
	if !e.silence.silent {
		t.Fatal("an engine working for the window without a batch not marked")
	}
}
