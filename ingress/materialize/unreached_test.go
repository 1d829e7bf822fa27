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

// An ingress started while NATS cannot be reached (down, a wrong URL, a
// blackholed path) has an empty index that follows nothing: it is stale
// from the start (Stale, kvmesh_materializer_stale_seconds), as for a
// connection lost later, and stops being stale once NATS is reached.
// Before, it read 0 stale seconds throughout, turned ready after the sync
// grace and routed with no index, and the stale alert never fired.
func TestNATSNeverReachedIsStale(t *testing.T) {
	srv := testutil.NATS(t)
	r := testutil.NewRelay(t, srv.URL()[len("nats://"):])
	r.Freeze() // the path accepts and answers nothing: no connection can be made
	nc := natsutil.DefaultConfig()
	nc.URLs = []string{"nats://" + r.Addr()}
	nc.Stream.Disabled = true
	nc.WaitForServer = true // as the ingress: run, and connect in the background
	nc.ConnectTimeout, nc.ReconnectWait = 200*time.Millisecond, 20*time.Millisecond
	conn, err := natsutil.Connect(context.Background(), nc, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(conn.Close)
	if conn.NC.IsConnected() {
		t.Fatal("connected through a frozen relay")
	}

	idx, reg := meshtest.NewMapIndex(), prometheus.NewRegistry()
	cfg := materialize.DefaultConfig()
	cfg.Conn, cfg.Index, cfg.Registerer = conn.NC, idx, reg
	cfg.CheckInterval = 20 * time.Millisecond
	m := startMaterializer(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "the unreached index reported stale", func() bool {
		return m.Stale() && gauge(t, reg, "kvmesh_materializer_stale_seconds") > 0
	})
	if m.Synced() {
		t.Fatal("synced without ever reaching NATS")
	}

	r.Thaw()
	testutil.WaitFor(t, 30*time.Second, "synced and no longer stale once NATS is reached", func() bool {
		return m.Synced() && !m.Stale() && gauge(t, reg, "kvmesh_materializer_stale_seconds") == 0
	})
}
