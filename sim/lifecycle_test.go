package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"runtime"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// Map-encoded events, the legacy replay layout and the CPU tier together:
// evicted blocks reappear as CPU location updates and CachedKeys(CPU) has them.
func TestMapFormLegacyReplayAndCPUTier(t *testing.T) {
	s := startSim(t, func(c *Config) {
		c.EventForm, c.ReplayLayout = kvtest.MapForm, kvtest.ReplayLegacy
		c.Engine.GPUBlocks, c.Engine.CPUBlocks = 7, 16
	})
	ec := newEventClient(t, s, 0)
	ec.legacy = true
	a := tokens(1, 13) // 3 full blocks
	complete(t, s, a, 1)
	complete(t, s, tokens(500, 27), 1) // needs all 7 blocks: a's go to the CPU tier
	ec.poll(5*time.Second, func() bool { return ec.next == s.EventStats(0).Published })
	cpuStored := 0
	for _, ev := range ec.events() {
		if ev.Kind == kvevents.BlockStored && ev.Tier() == kvevents.TierCPU {
			cpuStored += len(ev.BlockHashes)
		}
	}
	if cpuStored != 3 {
		t.Fatalf("%d CPU location updates, want 3", cpuStored)
	}
	want := kvevents.AppendKeys(nil, kvevents.Root("test-model", "", ""), a, 4)
	slices.Sort(want)
	if got := s.CachedKeys(0, kvevents.TierCPU); !slices.Equal(got, want) {
		t.Fatalf("CPU keys %x, want %x", got, want)
	}
	// a comes back from the CPU tier: counted as cached tokens.
	if c := complete(t, s, a, 1); c.Usage.CachedTokens() != 12 {
		t.Fatalf("cached %d after CPU reload, want 12", c.Usage.CachedTokens())
	}
}

// A client that goes away aborts its request and frees its blocks.
func TestClientDisconnectAborts(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 })
	ctx, cancel := context.WithCancel(context.Background())
	b, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": tokens(1, 20), "max_tokens": 900, "ignore_eos": true, "stream": true})
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, s.URL()+"/v1/completions", bytes.NewReader(b))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the request to run", func() bool { return s.Load(0).Running == 1 })
	cancel()
	resp.Body.Close()
	testutil.WaitFor(t, 5*time.Second, "the abort", func() bool { l := s.Load(0); return l.Running == 0 && l.UsedBlocks == 0 })
	if s.Load(0).Finished != 0 {
		t.Fatal("aborted request counted as finished")
	}
}

// Close is idempotent, and a new simulator can take over the same ports.
func TestCloseAndRestartOnSamePorts(t *testing.T) {
	s := startSim(t, nil)
	complete(t, s, tokens(1, 9), 1)
	addr, ev, rep := s.HTTPAddr(), s.EventsEndpoint(0), s.ReplayEndpoint(0)
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
	if _, err := http.Get(s.URL() + "/health"); err == nil {
		t.Fatal("still serving after Close")
	}
	s2 := startSim(t, func(c *Config) { c.HTTPAddr, c.KVEvents, c.KVReplay = addr, ev, rep })
	ec := newEventClient(t, s2, 0)
	if c := complete(t, s2, tokens(1, 9), 1); c.Usage.CachedTokens() != 0 {
		t.Fatal("new process kept the old cache")
	}
	ec.poll(5*time.Second, func() bool { return ec.next >= 1 })
}

// Many requests at once on a small cache: preemptions happen, every request
// still completes with exactly max_tokens, and nothing leaks. The driver is
// held until all n requests wait, so they overlap however busy the host is.
func TestConcurrentLoadWithPreemption(t *testing.T) {
	s := startSim(t, func(c *Config) { c.Engine.GPUBlocks = 40; c.TimeScale = 200 })
	const n = 12
	s.ranks[0].hold(true)
	errs := make(chan error, n)
	for i := 0; i < n; i++ {
		go func() {
			b, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": tokens(100*i+1, 20), "max_tokens": 40, "ignore_eos": true})
			resp, err := http.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
			if err != nil {
				errs <- err
				return
			}
			defer resp.Body.Close()
			var c struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				}
			}
			if err := json.NewDecoder(resp.Body).Decode(&c); err != nil || c.Usage.CompletionTokens != 40 {
				errs <- &httpError{resp.StatusCode, "bad completion"}
				return
			}
			errs <- nil
		}()
	}
	testutil.WaitFor(t, 10*time.Second, "every request to be queued", func() bool { return s.Load(0).Waiting == n })
	s.ranks[0].hold(false)
	for i := 0; i < n; i++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	l := s.Load(0)
	if l.Preemptions == 0 || l.Finished != n || l.UsedBlocks != 0 || l.Running+l.Waiting != 0 {
		t.Fatalf("load after the burst: %+v", l)
	}
}

// Close stops every goroutine the simulator started (drivers, HTTP, replay
// services, stream handlers), even with a stream in flight.
func TestCloseLeavesNoGoroutines(t *testing.T) {
	before := runtime.NumGoroutine()
	cfg := Config{Model: "test-model", KVEvents: "tcp://127.0.0.1:0", KVReplay: "tcp://127.0.0.1:0", DP: 2,
		Engine: engine.Config{BlockSize: 4, GPUBlocks: 512, Profile: mustProfile(t, "tiny")}, TimeScale: 1, Logger: quietLogger()}
	s, err := Start(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tr := &http.Transport{}
	client := &http.Client{Transport: tr}
	b, _ := json.Marshal(map[string]any{"model": "test-model", "prompt": tokens(1, 8), "max_tokens": 1500, "ignore_eos": true, "stream": true})
	resp, err := client.Post(s.URL()+"/v1/completions", "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 5*time.Second, "the stream to start", func() bool { return s.Load(0).Running+s.Load(1).Running == 1 })
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	_, _ = io.Copy(io.Discard, resp.Body) // the stream ends (truncated) instead of hanging
	resp.Body.Close()
	tr.CloseIdleConnections()
	deadline := time.Now().Add(5 * time.Second)
	for runtime.NumGoroutine() > before && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	if n := runtime.NumGoroutine(); n > before {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d goroutines before, %d after Close:\n%s", before, n, buf[:runtime.Stack(buf, true)])
	}
}

// Stopping the context passed to Start stops the server too.
func TestStartContextStops(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	s, err := Start(ctx, Config{Model: "m", Logger: quietLogger()})
	if err != nil {
		t.Fatal(err)
	}
	cancel()
	testutil.WaitFor(t, 5*time.Second, "the server to stop", func() bool {
		_, err := http.Get(s.URL() + "/health")
		return err != nil
	})
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}

// reset_prefix_cache refuses while a request runs, unless asked to preempt
// running requests; the request then recomputes and still completes.
func TestResetWhileRunning(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 })
	ec := newEventClient(t, s, 0)
	done := make(chan openai.Completion, 1)
	go func() {
		defer close(done) // a failing helper ends this goroutine; the test then stops below
		done <- complete(t, s, tokens(1, 20), 300)
	}()
	testutil.WaitFor(t, 5*time.Second, "the request to run", func() bool { return s.Load(0).Running == 1 })
	if code, _, _ := post(t, s.URL()+"/reset_prefix_cache", nil); code != http.StatusConflict {
		t.Fatalf("reset while running: %d, want 409", code)
	}
	if code, b, _ := post(t, s.URL()+"/reset_prefix_cache?reset_running_requests=true", nil); code != http.StatusOK {
		t.Fatalf("forced reset: %d %s", code, b)
	}
	c, ok := <-done
	if !ok {
		t.FailNow()
	}
	if c.Usage.CompletionTokens != 300 || s.Load(0).Preemptions != 1 {
		t.Fatalf("after forced reset: %+v, preemptions %d", c.Usage, s.Load(0).Preemptions)
	}
	ec.poll(5*time.Second, func() bool { return ec.next == s.EventStats(0).Published })
	cleared := false
	for _, ev := range ec.events() {
		cleared = cleared || ev.Kind == kvevents.AllBlocksCleared
	}
	if !cleared {
		t.Fatal("no AllBlocksCleared")
	}
}

// A request in flight when the engine restarts gets an error, not an empty 200.
func TestRestartFailsRequestsInFlight(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 })
	type answer struct {
		code int
		body []byte
	}
	done := make(chan answer, 1)
	go func() {
		defer close(done)
		code, b, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": tokens(1, 8), "max_tokens": 500, "ignore_eos": true})
		done <- answer{code, b}
	}()
	testutil.WaitFor(t, 5*time.Second, "the request to run", func() bool { return s.Load(0).Running == 1 })
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	a, ok := <-done
	if !ok {
		t.FailNow()
	}
	if _, isErr := openai.DecodeError(a.body); a.code != http.StatusServiceUnavailable || !isErr {
		t.Fatalf("request across a restart: %d %s", a.code, a.body)
	}
}
