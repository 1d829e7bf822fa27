package sidecar

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// Queueing a delta never blocks the event loop (which holds the engine
// lock): with the publisher stalled and the queue full, the next delta is
// dropped and counted at once, and the lock is free for snapshot replies.
func TestPublishQueueFullDropsWithoutBlocking(t *testing.T) {
	cfg := DefaultConfig()
	cfg.PublishQueue = 2
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: "tcp://127.0.0.1:1"}}
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s.pubq = make(chan pubMsg, cfg.PublishQueue) // as Run makes it; no publishLoop drains it
	e := s.engines[0]
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.mu.Lock()
		for i := 0; i < 5; i++ {
			e.st.pending = append(e.st.pending, kvevents.Op{Kind: kvevents.OpStore, Tier: kvevents.TierGPU, Keys: []uint64{uint64(i + 1)}})
			e.flushLocked()
		}
		e.mu.Unlock()
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second): // a deadlock guard, not a timing assertion
		t.Fatal("flushing blocked on a full publish queue")
	}
	if got := e.c.queueDrops.Load(); got != 3 {
		t.Fatalf("%d deltas dropped, want 3 (5 queued into room for 2)", got)
	}
	if head, _ := e.snapshot(); head.Seq != 5 {
		t.Fatalf("snapshot head seq %d, want 5 (drops still advance seq: receivers see the gap)", head.Seq)
	}
}
