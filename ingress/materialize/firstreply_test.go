package materialize_test

import (
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// After this replica's NATS reconnect, a snapshot request that lands only on
// a subscription nobody answers from (a sidecar's old one, on a connection
// the resumed server has not yet dropped; here a silent subscriber) is given
// up after FirstReplyTimeout, and the retry reaches the sidecar that
// subscribed meanwhile. The whole request's bound is an hour here: before,
// the copy waited that long (5 s by default: 6–7 s of stale index after a
// NATS hang in the fault tester's runs).
func TestReconnectSnapshotRetriesASilentSubscription(t *testing.T) {
	srv := testutil.NATS(t)
	cache, sc := cacheEngine(t, srv.URL(), 16, 41)
	first := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", first.Ready)

	gate := testutil.NewGate(t)
	gate.Open(strings.TrimPrefix(srv.URL(), "nats://"))
	m, conn, idx, reg := materializerVia(t, gate.Addr(), func(nc *natsutil.Config) { nc.ReconnectWait = 10 * time.Millisecond },
		func(cfg *materialize.Config) {
			cfg.SnapshotTimeout, cfg.FirstReplyTimeout = time.Hour, 200*time.Millisecond
		})
	load := func(n int) { loadCache(t, cache, n) }
	equal := func() bool { return indexEquals(idx, cache, "e1") }
	testutil.WaitFor(t, 10*time.Second, "materializer subscribed", m.Synced)
	load(10)
	testutil.WaitFor(t, 10*time.Second, "index equals the cache", equal)

	// The sidecar goes; a subscriber that never answers takes its place.
	_ = first.Close()
	silent, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(silent.Close)
	if _, err := silent.Subscribe(natsutil.Default().SnapSubject("m", "e1"), func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	if err := silent.Flush(); err != nil {
		t.Fatal(err)
	}
	// This replica's connection drops and comes back: every engine is
	// resynced, and the request reaches only the silent subscriber.
	gate.Shut()
	testutil.WaitFor(t, 10*time.Second, "the connection lost", func() bool { return !conn.Connected() })
	gate.Open(strings.TrimPrefix(srv.URL(), "nats://"))
	testutil.WaitFor(t, 10*time.Second, "reconnected", conn.Connected)
	testutil.WaitFor(t, 10*time.Second, "a snapshot no one answers given up", func() bool { return snapshots(t, reg, "timeout") > 0 })

	// The sidecar back, on a new subscription; more blocks cached.
	second := meshtest.StartSidecar(t, sc)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready again", second.Ready)
	load(10)
	testutil.WaitFor(t, 30*time.Second, "index equals the cache again", equal)
}
