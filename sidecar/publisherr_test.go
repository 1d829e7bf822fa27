package sidecar_test

import (
	"context"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"
	"github.com/kvmesh/kvmesh/test/mesh/meshtest"
)

// The KVMESH_DELTAS stream deleted while NATS stays up: the JetStream
// publishes that fail are counted in kvmesh_sidecar_publish_errors_total and
// logged (rate-limited, and the incident's end once acks come back), and the
// stream is created again once publishes report it missing. Before, the async failures were ignored (the counter
// stayed 0) and the stream came back only with the sidecar's next reconnect.
func TestDeletedStreamCountedAndRecreated(t *testing.T) {
	srv := testutil.NATS(t)
	cache, err := meshtest.NewCache("m", 4, 16, 0, 5)
	if err != nil {
		t.Fatal(err)
	}
	defer cache.Pub.Close()
	reg := prometheus.NewRegistry()
	var logs testutil.SyncBuffer
	cfg := sidecar.DefaultConfig()
	cfg.Engines = []sidecar.EngineConfig{{ID: "e1", Model: "m", Events: cache.Pub.Endpoint(), Replay: cache.Pub.ReplayEndpoint(), MetricsURL: "-"}}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.Registerer = reg
	cfg.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	s := meshtest.StartSidecar(t, cfg)
	testutil.WaitFor(t, 10*time.Second, "sidecar ready", s.Ready)

	_, js := testutil.JetStream(t, srv.URL())
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	publishErrors := func() float64 {
		fams, err := reg.Gather()
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range fams {
			if f.GetName() == "kvmesh_sidecar_publish_errors_total" {
				return f.GetMetric()[0].GetCounter().GetValue()
			}
		}
		return 0
	}
	// The sidecar ensures the stream after connecting, maybe after a first
	// deletion: delete it (again) and make deltas until publishes fail.
	testutil.WaitFor(t, 30*time.Second, "failed publishes counted", func() bool {
		if publishErrors() > 0 {
			return true
		}
		if _, err := js.Stream(ctx, natsutil.Default().Stream()); err == nil {
			if err := js.DeleteStream(ctx, natsutil.Default().Stream()); err != nil && !errors.Is(err, jetstream.ErrStreamNotFound) {
				t.Fatal(err)
			}
		}
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
		return false
	})
	testutil.WaitFor(t, 30*time.Second, "the stream created again", func() bool {
		_, err := js.Stream(ctx, natsutil.Default().Stream())
		return err == nil
	})
	if !strings.Contains(logs.String(), "delta publishes failing") {
		t.Fatalf("failed publishes not logged:\n%s", logs.String())
	}
	// Deltas are captured again.
	before := s.Status()[0].Seq
	testutil.WaitFor(t, 30*time.Second, "a new delta in the stream", func() bool {
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
		st, err := js.Stream(ctx, natsutil.Default().Stream())
		if err != nil {
			return false
		}
		info, err := st.Info(ctx)
		return err == nil && info.State.Msgs > 0 && s.Status()[0].Seq > before
	})
	// The stream's acks end the incident, and the log says so once
	// failures have stopped for the ack timeout.
	testutil.WaitFor(t, 30*time.Second, "the end of the incident logged", func() bool {
		if err := cache.Request(cache.RandomPrompt(2, 2, 2)); err != nil {
			t.Fatal(err)
		}
		return strings.Contains(logs.String(), "delta publishes succeeding again")
	})
}
