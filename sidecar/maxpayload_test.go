package sidecar_test

import (
	"context"
	"log/slog"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// A sidecar started before NATS (it connects in the background) cuts its
// first deltas to the server's max_payload: the limit is taken when the
// connection is made, not when the first delta has already been encoded.
// Before, the sidecar stored 0 (no limit) at start and learned the limit
// only as its publish loop took the next delta, so the first delta of
// 10,000 keys (~80 KB) went out uncut and was refused (ErrMaxPayload) by a
// server of 64 KiB: receivers saw a gap and resynced.
func TestFirstDeltasAfterLateConnectFitMaxPayload(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(),
		NoLog: true, NoSigs: true, MaxPayload: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start() // owned by srv: Shutdown stops it
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(func() { srv.Shutdown(); srv.WaitForShutdown() })
	gate := testutil.NewGate(t) // shut: NATS is not there yet

	cache, err := meshtest.NewCache("m", 4, 30000, 0, 47)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cache.Pub.Close() })
	reg := prometheus.NewRegistry()
	sc := sidecar.DefaultConfig()
	sc.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	sc.NATS.URLs = []string{"nats://" + gate.Addr()}
	sc.NATS.ReconnectWait = 20 * time.Millisecond
	sc.Registerer = reg
	var logs testutil.SyncBuffer
	sc.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	side := meshtest.StartSidecar(t, sc)

	_, js := testutil.JetStream(t, srv.ClientURL())
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	testutil.WaitFor(t, 20*time.Second, "the sidecar running without NATS", func() bool { return strings.Contains(logs.String(), "nats not reachable yet") })
	gate.Open(strings.TrimPrefix(srv.ClientURL(), "nats://"))
	// The sidecar ensures the stream once its connect handler ran.
	testutil.WaitFor(t, 20*time.Second, "the sidecar connected and created the stream", func() bool {
		_, err := js.Stream(ctx, natsutil.Default().Stream())
		return err == nil
	})

	rng := rand.New(rand.NewPCG(47, 1))
	toks := make([]uint32, 10000*4) // 10,000 new blocks: keys for a delta over 64 KiB
	for i := range toks {
		toks[i] = rng.Uint32()
	}
	if err := cache.Request(toks); err != nil {
		t.Fatal(err)
	}
	metric := func(name string) float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == name {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	publishErrors := func() float64 { return metric("kvmesh_sidecar_publish_errors_total") }
	testutil.WaitFor(t, 20*time.Second, "every key in a delta", func() bool { return metric("kvmesh_sidecar_delta_keys_total") == 10000 })
	deltas := metric("kvmesh_sidecar_deltas_published_total")
	testutil.WaitFor(t, 20*time.Second, "every delta in the stream, or a publish failed", func() bool {
		if publishErrors() > 0 {
			return true
		}
		st, err := js.Stream(ctx, natsutil.Default().Stream())
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && float64(info.State.Msgs) == deltas
	})
	if n := publishErrors(); n != 0 {
		t.Fatalf("%v delta publishes failed: the first deltas after connecting were not cut to the max_payload", n)
	}
	if deltas < 2 {
		t.Fatalf("%v deltas for 10,000 keys: not cut to the max_payload", deltas)
	}
	if got := side.Status()[0].Keys[kvevents.TierGPU]; got != 10000 {
		t.Fatalf("%d keys", got)
	}
}
