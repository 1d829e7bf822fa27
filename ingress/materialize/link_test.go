package materialize_test

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// gauge reads one gauge.
// materializerVia starts a materializer on its own NATS connection through
// addr (a relay or gate in front of the server), checking every 20 ms;
// tuneNATS and tune (nil: none) adjust the connection and the
// materializer.
func materializerVia(t *testing.T, addr string, tuneNATS func(*natsutil.Config), tune func(*materialize.Config)) (*materialize.Materializer, *natsutil.Conn, *meshtest.MapIndex, *prometheus.Registry) {
	t.Helper()
	nc := natsutil.DefaultConfig()
	nc.URLs = []string{"nats://" + addr}
	nc.Stream.Disabled = true
	tuneNATS(&nc)
	conn, err := natsutil.Connect(context.Background(), nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	idx, reg := meshtest.NewMapIndex(), prometheus.NewRegistry()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = conn.NC, idx, reg
	cfg.CheckInterval, cfg.IdleCheck = 20*time.Millisecond, time.Hour
	if tune != nil {
		tune(&cfg)
	}
	return startMaterializer(t, cfg), conn, idx, reg
}

func gauge(t *testing.T, reg *prometheus.Registry, name string) float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range fams {
		if f.GetName() == name {
			return f.GetMetric()[0].GetGauge().GetValue()
		}
	}
	t.Fatalf("no gauge %s", name)
	return 0
}

// The ingress's path to NATS blackholed (a relay that stops forwarding: TCP
// up, nothing flows) is found by the connection's pings, and the
// materializer reports its index stale (Stale, kvmesh_materializer_stale_seconds)
// instead of looking in sync while frozen. While the path stays dead,
// nats.go's reconnect count climbs with every TCP connect to the relay
// although no handshake completes: that is no reconnect, and no engine is
// resynced for it (before, every attempt resynced every engine). Once the
// path works, the index is resynced once and is no longer stale.
func TestBlackholedNATSIsStaleAndResyncsOnRealReconnect(t *testing.T) {
	srv := testutil.NATS(t)
	cache, sc := cacheEngine(t, srv.URL(), 16, 31) // the sidecar's own path stays up
	side := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", side.Ready)

	r := testutil.NewRelay(t, srv.URL()[len("nats://"):])
	m, conn, idx, reg := materializerVia(t, r.Addr(), func(nc *natsutil.Config) {
		nc.PingInterval = 250 * time.Millisecond
		nc.ConnectTimeout, nc.ReconnectWait = 200*time.Millisecond, 20*time.Millisecond
	}, nil)
	load := func(n int) { loadCache(t, cache, n) }
	equal := func() bool { return indexEquals(idx, cache, "e1") }
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)
	load(20)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache, not stale", func() bool {
		return equal() && !m.Stale() && gauge(t, reg, "kvmesh_materializer_stale_seconds") == 0
	})

	r.Freeze()
	testutil.WaitFor(t, 20*time.Second, "the blackholed path reported stale", func() bool {
		return m.Stale() && gauge(t, reg, "kvmesh_materializer_stale_seconds") > 0
	})
	// The reconnects counted from here on connect TCP to the frozen relay
	// and never complete a handshake.
	resyncs := counter(t, reg, "kvmesh_materializer_reconnect_resyncs_total")
	attempts := conn.NC.Stats().Reconnects
	load(20) // the index cannot follow these
	testutil.WaitFor(t, 30*time.Second, "reconnect attempts against the blackhole", func() bool {
		return conn.NC.Stats().Reconnects >= attempts+3
	})
	if got := counter(t, reg, "kvmesh_materializer_reconnect_resyncs_total"); got != resyncs {
		t.Fatalf("%v resyncs for reconnect attempts that never connected", got-resyncs)
	}
	if !m.Stale() {
		t.Fatal("not stale while the path is dead")
	}

	r.Thaw()
	testutil.WaitFor(t, 20*time.Second, "index resynced after the path came back, not stale", func() bool {
		return !m.Stale() && gauge(t, reg, "kvmesh_materializer_stale_seconds") == 0 && equal() &&
			counter(t, reg, "kvmesh_materializer_reconnect_resyncs_total") > resyncs
	})
}
