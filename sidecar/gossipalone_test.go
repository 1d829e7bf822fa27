package sidecar_test

import (
	"io"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// TestSidecarAloneInGossipIsNotReady (gossip tester F1): a sidecar whose
// gossip seeds do not answer (a dead seed here; another --gossip-key or a
// partition look the same to it) serves an engine no ingress sees. Its
// /ready says so (503), its /metrics carry the gossip series, with
// kvmesh_gossip_alone 1 and kvmesh_gossip_members 1 for an alert, and it is
// ready, kvmesh_gossip_alone 0, once a member answers at the seed. Losing
// that member later makes it alone again (the gauge), not unready.
func TestSidecarAloneInGossipIsNotReady(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	seedAddr := ln.Addr().String()
	_ = ln.Close() // the seed is dead

	srv, _ := startSimAt(t, "m", 4, simAddrs{})
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", URL: srv.URL(), Events: srv.EventsEndpoint(0), Replay: srv.ReplayEndpoint(0)}}
	cfg.NATS.URLs = []string{testutil.NATS(t).URL()}
	cfg.AdminAddr = "127.0.0.1:0"
	cfg.ScrapeInterval, cfg.GossipInterval = 50*time.Millisecond, 50*time.Millisecond
	var logs testutil.SyncBuffer
	reg := prometheus.NewRegistry()
	cfg.Logger, cfg.Registerer = slog.New(slog.NewTextHandler(&logs, nil)), reg
	g := gossip.DefaultConfig()
	g.Name, g.Profile, g.Join = "sidecar-e1", "local", []string{seedAddr}
	g.RejoinInterval = 100 * time.Millisecond
	g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1"}
	cfg.Gossip = &g
	s := meshtest.StartSidecar(t, cfg)

	get := func(path string) (int, string) {
		t.Helper()
		resp, err := http.Get("http://" + s.AdminAddr().String() + path)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	testutil.WaitFor(t, 20*time.Second, "the engine running and gossip started", func() bool {
		return s.Gossip() != nil && s.AdminAddr() != nil && len(s.Status()) == 1 && s.Status()[0].Ready
	})
	if code, _ := get("/ready"); code != http.StatusServiceUnavailable || s.Ready() {
		t.Fatalf("/ready %d (Ready %v) while alone in gossip with a seed given", code, s.Ready())
	}
	_, body := get("/metrics")
	for _, want := range []string{"kvmesh_gossip_alone 1", "kvmesh_gossip_members 1", "kvmesh_gossip_oversize_entries_total 0"} {
		if !strings.Contains(body, want) {
			t.Fatalf("/metrics without %q:\n%s", want, body)
		}
	}

	host, port, _ := net.SplitHostPort(seedAddr)
	sc := gossip.DefaultConfig()
	sc.Name, sc.Profile, sc.BindAddr, sc.Logger = "ingress-1", "local", host, slog.New(slog.DiscardHandler)
	sc.BindPort, _ = strconv.Atoi(port)
	sc.Meta = gossip.NodeMeta{Role: gossip.RoleIngress, ID: "ingress-1"}
	seed, err := gossip.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = seed.Close() })
	testutil.WaitFor(t, 20*time.Second, "the sidecar ready once the seed answers", s.Ready)
	if code, _ := get("/ready"); code != http.StatusOK {
		t.Fatalf("/ready %d once joined", code)
	}
	if v := testutil.MetricSum(t, reg, "kvmesh_gossip_alone"); v != 0 {
		t.Fatalf("kvmesh_gossip_alone %v once joined", v)
	}
	testutil.WaitFor(t, 10*time.Second, "the engine gossiped to the seed", func() bool { _, ok := seed.Engine("e1"); return ok })

	// Every other member gone after the sidecar had some (the rest of the
	// mesh down, a partition): alone again, said by the gauge, but ready:
	// nothing about this sidecar's deployment is wrong.
	if err := seed.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "kvmesh_gossip_alone 1 once the seed left", func() bool {
		return testutil.MetricSum(t, reg, "kvmesh_gossip_alone") == 1
	})
	if !s.Ready() {
		t.Fatal("not ready after losing the other members it had")
	}
}

// A sidecar whose seeds are itself alone (the first member pod behind a
// Kubernetes Service that lists only it) is ready: its seeds answered, and
// nothing is wrong with its --join or --gossip-key; it is alone only until
// another member starts (regression tester 1). Only seeds that never
// answered make it unready.
func TestSidecarSeededByItselfIsReady(t *testing.T) {
	port := testutil.FreePortBase(t, 1)
	srv, _ := startSimAt(t, "m", 4, simAddrs{})
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", URL: srv.URL(), Events: srv.EventsEndpoint(0), Replay: srv.ReplayEndpoint(0)}}
	cfg.NATS.URLs = []string{testutil.NATS(t).URL()}
	cfg.ScrapeInterval, cfg.GossipInterval = 50*time.Millisecond, 50*time.Millisecond
	cfg.Logger, cfg.Registerer = slog.New(slog.DiscardHandler), prometheus.NewRegistry()
	g := gossip.DefaultConfig()
	g.Name, g.Profile = "sidecar-e1", "local"
	g.BindAddr, g.BindPort = "127.0.0.1", port
	g.Join = []string{net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	g.RejoinInterval = 100 * time.Millisecond
	g.Meta = gossip.NodeMeta{Role: gossip.RoleSidecar, ID: "e1"}
	cfg.Gossip = &g
	s := meshtest.StartSidecar(t, cfg)
	testutil.WaitFor(t, 20*time.Second, "ready, alone in gossip with itself as its seed", func() bool {
		return s.Gossip() != nil && s.Gossip().Alone() && s.Ready()
	})
}
