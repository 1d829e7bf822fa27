package demo

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestDemoKvmeshBeatsRandom runs the real mesh (NATS, simulated engines, sidecars,
// gossip, ingresses) with a reduced workload sized so that random routing must evict
// prefixes it will need again while prefix-aware routing fits each engine's share.
func TestDemoKvmeshBeatsRandom(t *testing.T) {
	if testing.Short() {
		t.Skip("starts the whole mesh")
	}
	before := runtime.NumGoroutine()
	cfg := Config{
		Engines: 4, Ingresses: 2,
		Workload:    workload.SharedPrefix{Groups: 12, Prompts: 8, Shared: 2048, Question: 32, Output: 8, Seed: 3},
		Concurrency: 16,
		Engine:      engine.Config{BlockSize: 16, GPUBlocks: 768, Profile: profile(t, "70b-4xh100")},
	}
	var phases []string
	cfg.Status = func(msg string) { phases = append(phases, msg) }
	// The components' warnings (ejections, stalls, retries), shown if the
	// test fails: a request lost on a loaded machine says why.
	var warnings testutil.SyncBuffer
	cfg.Logger = slog.New(slog.NewTextHandler(&warnings, &slog.HandlerOptions{Level: slog.LevelWarn}))
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the components' warnings and errors:\n%s", lastLines(warnings.String(), 200))
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := Run(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	rnd, kv := res.Report.Policies["random"], res.Report.Policies["kvmesh"]
	t.Logf("random: %+v", rnd)
	t.Logf("kvmesh: %+v", kv)
	for name, p := range map[string]struct {
		completed int
		imb       float64
	}{"random": {rnd.Completed, rnd.LoadImbalance}, "kvmesh": {kv.Completed, kv.LoadImbalance}} {
		if p.completed != 96 {
			t.Fatalf("%s completed %d of 96", name, p.completed)
		}
		if p.imb < 1 || p.imb > 2.5 {
			t.Errorf("%s load imbalance %.2f: an engine was starved or missing", name, p.imb)
		}
	}
	if kv.PrefixHitRate < rnd.PrefixHitRate+0.15 {
		t.Errorf("kvmesh hit rate %.3f not clearly above random %.3f", kv.PrefixHitRate, rnd.PrefixHitRate)
	}
	if kv.PrefixHitRate > res.Report.OracleHitRate+1e-9 {
		t.Errorf("hit rate %.3f above the oracle %.3f: cached tokens are miscounted", kv.PrefixHitRate, res.Report.OracleHitRate)
	}
	// TTFT is wall time of real-time simulators: on a machine busy with other
	// work their waits overshoot at random, by more than the routing saves
	// (a -race run on a loaded host once saw kvmesh 1.22 s vs random 1.14 s),
	// so the test asserts what routing decides — hits and balance — and
	// leaves latency to the demo's report and docs/BENCHMARKS.md.
	t.Logf("TTFT mean: kvmesh %.3fs, random %.3fs (not asserted)", kv.TTFTMean, rnd.TTFTMean)
	if !strings.Contains(strings.Join(phases, "\n"), "resetting the engines' prefix caches") {
		t.Errorf("caches were not reset between runs: %v", phases)
	}

	// The JSON is the `kvmesh bench --json` shape.
	b, err := json.Marshal(res.Report)
	if err != nil {
		t.Fatal(err)
	}
	var shape struct {
		Policies map[string]map[string]float64 `json:"policies"`
	}
	if err := json.Unmarshal(b, &shape); err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{"random", "kvmesh"} {
		for _, k := range []string{"throughput_rps", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_mean_s", "prefix_hit_rate", "load_imbalance"} {
			if _, ok := shape.Policies[p][k]; !ok {
				t.Errorf("json %s lacks %s: %s", p, k, b)
			}
		}
	}
	var table strings.Builder
	if err := res.WriteTable(&table); err != nil || !strings.Contains(table.String(), "kvmesh vs random") {
		t.Fatalf("table: %v\n%s", err, table.String())
	}

	waitNoLeaks(t, before)
}

// waitNoLeaks waits until no more goroutines run than before (plus the test's own),
// ignoring fasthttp's idle-connection cleaners: a closed client's cleaner sleeps out its
// idle period (library behaviour) and then exits on its own, holding no connection.
func waitNoLeaks(t *testing.T, before int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	buf := make([]byte, 1<<20)
	for {
		stacks := strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n")
		var live []string
		for _, s := range stacks {
			if !strings.Contains(s, "fasthttp.(*HostClient).connsCleaner") {
				live = append(live, s)
			}
		}
		if len(live) <= before+1 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines left (was %d):\n%s", len(live), before, strings.Join(live, "\n\n"))
		}
		<-tick.C
	}
}

// profile returns a named timing profile. The test uses a large model so that the
// prefill time kvmesh saves dominates the CPU cost of the mesh itself under -race.
func profile(t *testing.T, name string) engine.Profile {
	t.Helper()
	p, err := engine.LookupProfile(name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestConfigValidate(t *testing.T) {
	cfg := Config{Engines: -1, Ingresses: 99, Concurrency: -1, Rate: -2, TimeScale: -1, Policies: []string{"random", "random"}}
	_, err := Run(context.Background(), cfg)
	if !errors.Is(err, ErrConfig) {
		t.Fatalf("err = %v", err)
	}
	for _, want := range []string{"engines", "ingresses", "concurrency", "rate", "time scale", "repeated"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %q: %v", want, err)
		}
	}
}

func TestStartFailureLeavesNothing(t *testing.T) {
	// An unknown policy fails when the first ingress starts, after NATS, engines and
	// sidecars are up: Run must stop all of them and report the cause.
	before := runtime.NumGoroutine()
	cfg := Config{Engines: 1, Ingresses: 1, Policies: []string{"no-such-policy"},
		Workload: workload.SharedPrefix{Groups: 1, Prompts: 1, Shared: 16, Question: 16, Output: 1, Seed: 1}}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err := Run(ctx, cfg)
	if err == nil || !strings.Contains(err.Error(), "no-such-policy") {
		t.Fatalf("err = %v, want the unknown policy named", err)
	}
	waitNoLeaks(t, before)
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}
