package sidecar

import (
	"bytes"
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Close right after `go s.Run(ctx)` (how meshtest and the demo start a
// sidecar) stops Run even when Close comes before Run has begun: Close
// before Run is remembered, and that Run returns at once.
func TestCloseBeforeRunStopsRun(t *testing.T) {
	srv := testutil.NATS(t)
	for i := 0; i < 10; i++ {
		cfg := DefaultConfig()
		cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", URL: "http://127.0.0.1:1", MetricsURL: "-"}}
		cfg.NATS.URLs = []string{srv.URL()}
		cfg.Logger = slog.New(slog.DiscardHandler)
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		if i%2 == 0 {
			go func() { done <- s.Run(context.Background()) }()
			_ = s.Close()
		} else {
			_ = s.Close()
			done <- s.Run(context.Background())
		}
		select {
		case err := <-done:
			if err != nil {
				t.Fatalf("try %d: Run after Close: %v", i, err)
			}
		case <-time.After(30 * time.Second): // a hang guard, not a timing assertion
			t.Fatalf("try %d: Run still running 30 s after Close", i)
		}
	}
}

// Deltas queued when the sidecar stops reach NATS: Run stops the loops
// that feed the publisher, then the publisher sends what they queued before
// the connection closes (before, it returned with Run's context and left
// them in the queue, counted nowhere). Here the queue is full when the
// publisher is told to stop.
func TestPublisherSendsItsQueueWhenStopped(t *testing.T) {
	srv := testutil.NATS(t)
	cfg := DefaultConfig()
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1", MetricsURL: "-"}}
	cfg.NATS.URLs = []string{srv.URL()}
	cfg.NATS.Stream.Disabled = true // plain publishes: what arrives is what was sent
	cfg.Logger = slog.New(slog.DiscardHandler)
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	conn, err := natsutil.Connect(t.Context(), cfg.NATS, cfg.Logger)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	s.conn.Store(conn)

	nc, err := nats.Connect(srv.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	marker := []byte("shutdown-test-delta")
	var got atomic.Int64
	sub, err := nc.Subscribe(e.subject, func(m *nats.Msg) {
		if bytes.Equal(m.Data, marker) {
			got.Add(1)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	_ = sub.SetPendingLimits(-1, -1)
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	n := cfg.PublishQueue
	s.pubq = make(chan pubMsg, n) // as Run makes it
	for range n {
		if err := s.enqueue(e, marker); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	close(stop)
	s.publishLoop(stop)
	s.flushPublished(conn)
	if left := len(s.pubq); left != 0 {
		t.Fatalf("the stopped publisher left %d of %d deltas queued", left, n)
	}
	if d, pe := e.c.queueDrops.Load(), e.c.publishErrors.Load(); d != 0 || pe != 0 {
		t.Fatalf("queue drops %d, publish errors %d: want none (NATS up, drained within drainWait)", d, pe)
	}
	testutil.WaitFor(t, 30*time.Second, "every queued delta on NATS", func() bool { return got.Load() >= int64(n) })
	if got.Load() != int64(n) {
		t.Fatalf("%d deltas reached NATS, %d queued", got.Load(), n)
	}
}
