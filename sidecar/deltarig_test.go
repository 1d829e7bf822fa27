package sidecar_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"

	"github.com/kvmesh/kvmesh/sidecar"
)

// deltaRig is one sidecar (engine "e1" of model "m", idle probe 20 ms, no
// metrics scrape) fed by a kvtest publisher, on an embedded NATS server,
// with a subscription taking every delta it publishes.
type deltaRig struct {
	pub    *kvtest.Publisher
	nc     *nats.Conn
	deltas *nats.Subscription
	s      *sidecar.Sidecar
}

func startDeltaRig(t *testing.T) *deltaRig {
	t.Helper()
	srv := testutil.NATS(t)
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: "tcp://127.0.0.1:0", ReplayEndpoint: "tcp://127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pub.Close() })
	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	deltas, err := nc.SubscribeSync(natsutil.Default().DeltaWildcard())
	if err != nil {
		t.Fatal(err)
	}
	if err := deltas.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	cfg := sidecar.DefaultConfig()
	cfg.IdleProbe = 20 * time.Millisecond
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: pub.Endpoint(), Replay: pub.ReplayEndpoint(), MetricsURL: "-"}}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.Logger = slog.New(slog.DiscardHandler)
	s := meshtest.StartSidecar(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)
	return &deltaRig{pub: pub, nc: nc, deltas: deltas, s: s}
}
