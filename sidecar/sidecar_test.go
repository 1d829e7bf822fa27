package sidecar_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

func TestAdminEndpoints(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()

	// A stand-in engine /metrics in vLLM's format.
	metrics := http.NewServeMux()
	metrics.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3\n"+
			"# TYPE vllm:num_requests_waiting gauge\nvllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2\n"+
			"# TYPE vllm:kv_cache_usage_perc gauge\nvllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.25\n")
	})
	hs := &http.Server{Handler: metrics}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() { _ = hs.Serve(ln) }()
	defer hs.Close()

	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", URL: "http://" + ln.Addr().String(), Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint()}}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.ScrapeInterval = 50 * time.Millisecond
	s, err := sidecar.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- s.Run(context.Background()) }()
	testutil.WaitFor(t, 10*time.Second, "ready", s.Ready)
	base := "http://" + s.AdminAddr().String()
	for i := 0; i < 20; i++ {
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 5*time.Second, "keys and load", func() bool {
		st := s.Status()[0]
		return st.Keys[0] == len(cache.Truth()[0]) && st.Load.Running == 3 && st.Load.Waiting == 2 && st.Load.KVUsage == 0.25
	})
	get := func(path string) (int, string) {
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if code, _ := get("/health"); code != 200 {
		t.Fatalf("/health %d", code)
	}
	if code, _ := get("/ready"); code != 200 {
		t.Fatalf("/ready %d", code)
	}
	code, body := get("/metrics")
	if code != 200 || !strings.Contains(body, `kvmesh_sidecar_keys{engine="e1",tier="gpu"}`) || !strings.Contains(body, "kvmesh_sidecar_deltas_published_total") ||
		!strings.Contains(body, `kvmesh_kvevents_delivered_total{engine="e1"}`) ||
		!strings.Contains(body, `kvmesh_sidecar_bad_events_total{engine="e1"}`) || !strings.Contains(body, `kvmesh_sidecar_skipped_group_events_total{engine="e1"}`) {
		t.Fatalf("/metrics %d:\n%s", code, body)
	}
	_, body = get("/debug/state")
	var st []sidecar.Status
	if err := json.Unmarshal([]byte(body), &st); err != nil || len(st) != 1 || st[0].Engine != "e1" {
		t.Fatalf("/debug/state %q: %v", body, err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	if s.Ready() {
		t.Fatal("ready after close")
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := sidecar.DefaultConfig()
	c.Engines = []sidecar.EngineConfig{{ID: "a"}, {ID: "a", Model: "m", Events: "tcp://x:1", Role: "chef", URL: "::bad"}}
	c.ResyncPolicy = sidecar.ResyncResetEngine
	c.MaxDeltaKeys = 0
	err := c.Validate()
	if !errors.Is(err, sidecar.ErrConfig) {
		t.Fatal(err)
	}
	for _, want := range []string{"no model", "no KV-event endpoint", "duplicate id", "role", "bad url", "needs the engine url", "max delta keys"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

// In DaemonSet mode one broken engine must not stop the others.
func TestBrokenEngineDoesNotStopOthers(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()
	// The broken engine's endpoint is valid but cannot be bound: a port
	// taken by a listener of the test.
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{
		{ID: "good", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"},
		{ID: "broken", Model: "m", Events: "tcp://" + taken.Addr().String(), Bind: true, MetricsURL: "-"},
	}
	cfg.NATS.URLs = []string{srv.URL()}
	s := meshtest.StartSidecar(t, cfg)
	for i := 0; i < 10; i++ {
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "good engine's keys", func() bool {
		st := s.Status()
		return st[0].Running && st[0].Keys[0] == len(cache.Truth()[0]) && !st[1].Running
	})
	if s.Ready() {
		t.Fatal("ready with a broken engine")
	}
}

// TestEngineIDTaken: a sidecar whose engine id another live member serves
// at another URL waits (logged once) and takes the id over when that URL no
// longer answers as the engine (refused, another model there) or gossip
// declares the holder dead; it refuses to run (two engines under one id
// replace each other's index and load in every ingress) only when the
// holder keeps serving its model at its URL for EngineIDWait. At the same
// URL (a sidecar restart overlapping its old self) it runs at once
// (churn report F3b: a rescheduled pod's sidecar exited, then crash-looped).
func TestEngineIDTaken(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 8, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()
	holder := func(url string) *gossip.Node {
		gc := gossip.DefaultConfig()
		gc.Name, gc.Profile, gc.Meta = fmt.Sprintf("old-sidecar-%d", time.Now().UnixNano()), "local", gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1"}
		gc.Logger = slog.New(slog.DiscardHandler)
		n, err := gossip.New(gc)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = n.Close() })
		n.SetEngine(gossip.EngineState{ID: "e1", Model: "m", URL: url})
		return n
	}
	run := func(join *gossip.Node, url string, wait time.Duration, logs io.Writer) (*sidecar.Sidecar, chan error) {
		cfg := sidecar.DefaultConfig()
		cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", URL: url, Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint()}}
		cfg.NATS.URLs = []string{srv.URL()}
		cfg.Logger, cfg.Registerer = slog.New(slog.NewTextHandler(logs, nil)), prometheus.NewRegistry()
		cfg.EngineIDWait = wait
		g := gossip.DefaultConfig()
		g.Profile, g.Join, g.Logger = "local", []string{join.Addr()}, slog.New(slog.DiscardHandler)
		g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1"}
		cfg.Gossip = &g
		s, err := sidecar.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		go func() { done <- s.Run(context.Background()) }()
		return s, done
	}
	runs := func(s *sidecar.Sidecar, done chan error, what string) {
		t.Helper()
		testutil.WaitFor(t, 30*time.Second, what, func() bool {
			select {
			case err := <-done:
				t.Fatalf("%s: Run returned %v", what, err)
			default:
			}
			return s.Ready()
		})
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
	}
	simM, _ := startSimAt(t, "m", 4, simAddrs{}) // the holder's engine, alive and serving its model
	simB, _ := startSimAt(t, "B", 4, simAddrs{}) // another engine, serving another model
	refused, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	refusedURL := "http://" + refused.Addr().String()
	refused.Close() // nothing listens there: connection refused

	// A copied manifest: the holder serves its model at its URL throughout.
	var logs testutil.SyncBuffer
	_, done := run(holder(simM.URL()), "http://127.0.0.1:2", time.Second, &logs)
	select {
	case err := <-done:
		if !errors.Is(err, sidecar.ErrEngineIDTaken) || !strings.Contains(err.Error(), "answers there as that engine") {
			t.Fatalf("Run with a taken engine id: %v, want ErrEngineIDTaken saying the holder answers as the engine", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run with a taken engine id did not return")
	}
	if n := strings.Count(logs.String(), "waiting for gossip to declare it dead"); n != 1 {
		t.Fatalf("%d waiting lines, want 1:\n%s", n, logs.String())
	}

	// The holder's URL takes connections and never answers (a NetworkPolicy
	// dropping sidecar-to-engine traffic looks the same): unknown, not gone,
	// so the sidecar keeps waiting and exits as a conflict when the wait ends.
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		var held []net.Conn
		defer func() {
			for _, c := range held {
				c.Close()
			}
		}()
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			held = append(held, c)
		}
	}()
	s, done := run(holder("http://"+silent.Addr().String()), "http://127.0.0.1:2", time.Second, io.Discard)
	testutil.WaitFor(t, 30*time.Second, "Run to give up on a holder whose URL never answers", func() bool {
		select {
		case err := <-done:
			if !errors.Is(err, sidecar.ErrEngineIDTaken) || !strings.Contains(err.Error(), "gives no answer") {
				t.Fatalf("Run with a holder whose URL never answers: %v, want ErrEngineIDTaken saying it gives no answer", err)
			}
			return true
		default:
		}
		if s.Ready() {
			t.Fatal("the sidecar took over an engine id whose holder's URL never answers")
		}
		return false
	})

	// The holder's pod is gone: its URL refuses, or another engine has the address.
	s, done = run(holder(refusedURL), "http://127.0.0.1:2", time.Minute, io.Discard)
	runs(s, done, "the sidecar taking over from a holder whose URL refuses")
	s, done = run(holder(simB.URL()), "http://127.0.0.1:2", time.Minute, io.Discard)
	runs(s, done, "the sidecar taking over from a holder whose URL serves another model")

	// The holder's URL still serves the model (the address went to a copy
	// of the engine), but the holder crashed: gossip declares it dead.
	h := holder(simM.URL())
	var waitLogs testutil.SyncBuffer
	s, done = run(h, "http://127.0.0.1:2", time.Minute, &waitLogs)
	testutil.WaitFor(t, 10*time.Second, "the sidecar waiting", func() bool { return strings.Contains(waitLogs.String(), "waiting for gossip") })
	h.Shutdown() // a crash: no leave
	runs(s, done, "the sidecar taking over once gossip declares the holder dead")

	s, done = run(holder(simM.URL()), simM.URL(), time.Minute, io.Discard) // the same engine
	runs(s, done, "the sidecar of the same engine ready")
}
