package materialize_test

import (
	"context"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestDepartedEngineFromStreamIsNotFailing: a restarted ingress finds every
// engine of the delta stream's last max age, the departed ones among them
// (a rollout's old pods). One gossip does not list, whose snapshots find
// nobody, is not a failing engine: no warning and not in
// kvmesh_materializer_failing_engines, which operators alert on. Before,
// each ingress restart after a rollout raised the alert for a minute.
func TestDepartedEngineFromStreamIsNotFailing(t *testing.T) {
	url := testutil.NATSServer(t, server.Options{JetStream: true}).ClientURL()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := natsutil.EnsureStream(ctx, js, natsutil.Default(), natsutil.DefaultConfig().Stream, slog.New(slog.NewTextHandler(io.Discard, nil))); err != nil {
		t.Fatal(err)
	}
	// The departed engine's last delta (its content is not read by discovery).
	if _, err := js.Publish(ctx, natsutil.Default().DeltaSubject("m", "departed"), []byte("x")); err != nil {
		t.Fatal(err)
	}

	for _, gossiped := range []bool{false, true} {
		cfg, _, reg := materializerConfig(t, url)
		warned := &logged{level: slog.LevelWarn}
		cfg.Logger = slog.New(warned)
		cfg.CheckInterval = 20 * time.Millisecond
		mem := &fakeMembership{}
		if gossiped { // the same engine listed by gossip: a live one whose snapshots fail
			mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "departed", Model: "m"}})
		}
		cfg.Membership = mem
		m := startMaterializer(t, cfg)
		testutil.WaitFor(t, 30*time.Second, "three failed snapshots", func() bool {
			st := m.Status()
			return len(st) == 1 && st[0].SnapshotFailures >= 3
		})
		want, warns := 0.0, 0
		if gossiped {
			want, warns = 1, 1
		}
		if g := gauge(t, reg, "kvmesh_materializer_failing_engines"); g != want {
			t.Errorf("gossiped %v: failing engines %v, want %v", gossiped, g, want)
		}
		if n := warned.count("snapshots of an engine keep failing"); n != warns {
			t.Errorf("gossiped %v: %d warnings, want %d (%q)", gossiped, n, warns, warned.msgs)
		}
		if gossiped {
			continue
		}
		// Gossip lists it after its third failure: a live engine whose
		// snapshots fail, counted and warned of once from its next failure.
		mem.set(gossip.EngineView{EngineState: gossip.EngineState{ID: "departed", Model: "m"}})
		testutil.WaitFor(t, 30*time.Second, "the engine counted as failing once gossip lists it", func() bool {
			return gauge(t, reg, "kvmesh_materializer_failing_engines") == 1 && warned.count("snapshots of an engine keep failing") == 1
		})
	}
}
