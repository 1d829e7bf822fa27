package sidecar

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/kvevents/kvtest"
)

// eventEngine makes a sidecar (not run) for one engine whose events come
// from pub's replay socket and from events (bound with bind), runs the
// engine's event loop until the test ends, and logs to logs.
func eventEngine(t *testing.T, pub *kvtest.Publisher, events string, bind bool, idleProbe time.Duration, logs *testutil.SyncBuffer) *engine {
	t.Helper()
	return eventEngineReplay(t, events, pub.ReplayEndpoint(), bind, idleProbe, logs)
}

// eventEngineReplay is eventEngine with the replay endpoint given ("": none).
func eventEngineReplay(t *testing.T, events, replay string, bind bool, idleProbe time.Duration, logs *testutil.SyncBuffer) *engine {
	t.Helper()
	cfg := DefaultConfig()
	cfg.IdleProbe, cfg.BatchWindow = idleProbe, 0
	cfg.ScrapeInterval = 10 * time.Millisecond
	cfg.Engines = []EngineConfig{{ID: "e", Model: "m", Events: events, Bind: bind, Replay: replay, URL: "http://127.0.0.1:1"}}
	cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	e := s.engines[0]
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = e.run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	testutil.WaitFor(t, 10*time.Second, "the event loop", func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.sub != nil })
	return e
}

// subStats are the running subscriber's counters.
func (e *engine) subStats() kvevents.SubscriberStats {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.sub == nil {
		return kvevents.SubscriberStats{}
	}
	return e.sub.Stats()
}

// gpuKeys is how many GPU keys the engine holds.
func (e *engine) gpuKeys() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.st.keyRefs[kvevents.TierGPU])
}

// block is a batch storing one block of 4 tokens from tok.
func block(hash uint64, tok int) *kvevents.Batch {
	return &kvevents.Batch{Events: []kvevents.Event{stored([]uint64{hash}, nil, toks(tok, 4), "GPU")}}
}

func newPublisher(t *testing.T, endpoint string) *kvtest.Publisher {
	t.Helper()
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{Endpoint: endpoint, ReplayEndpoint: "tcp://127.0.0.1:0",
		Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pub.Close() })
	return pub
}

const noLiveWarning = "KV events arrive only through replay probes"

// A sidecar restarted beside an idle engine (its history replayed at
// start, nothing live since), then the engine restarted, still idle: the
// idle probe finds the restart and replays the new incarnation from 0. The
// live link is fine; this drew the warning that it is missing, with the
// advice to use --bind-events (black-box report, finding 3).
func TestIdleEngineRestartDoesNotWarnNoLive(t *testing.T) {
	pub := newPublisher(t, "tcp://127.0.0.1:0")
	for i := range 5 { // before the sidecar: only its start replay brings them
		if _, err := pub.Publish(block(uint64(100+i), 4*i)); err != nil {
			t.Fatal(err)
		}
	}
	var logs testutil.SyncBuffer
	e := eventEngine(t, pub, pub.Endpoint(), false, 20*time.Millisecond, &logs)
	testutil.WaitFor(t, 10*time.Second, "the start replay", func() bool { return e.gpuKeys() == 5 })
	testutil.WaitFor(t, 10*time.Second, "two idle probes", func() bool { return e.subStats().Probes >= 2 })

	// The engine restarts; its first batch went out before the sidecar's
	// SUB had reconnected (lost live), so only a replay brings it.
	pub.Restart()
	pub.DropNext(1)
	if _, err := pub.Publish(block(200, 1000)); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the restart found and the new incarnation replayed", func() bool {
		return e.c.rankResets.Load() >= 1 && e.gpuKeys() == 1
	})
	p := e.subStats().Probes
	testutil.WaitFor(t, 10*time.Second, "three more idle probes", func() bool { return e.subStats().Probes >= p+3 })
	if st := e.subStats(); st.Received != 0 || st.Replayed < 6 {
		t.Fatalf("the scenario: %d received live, %d replayed; want 0 and at least 6", st.Received, st.Replayed)
	}
	if strings.Contains(logs.String(), noLiveWarning) {
		t.Fatalf("an idle engine's restart warned of a missing live link:\n%s", logs.String())
	}
}

// An engine whose batches keep coming only through the idle probes (no
// live link) is still warned about, with advice for the side that binds:
// without --bind-events, bind the engine or use --bind-events; with it,
// connect the engine to the sidecar (never "use --bind-events" again).
func TestEventsOnlyThroughProbesWarnPerMode(t *testing.T) {
	for _, tc := range []struct {
		name   string
		bind   bool
		events string
		advice string
	}{
		// The sidecar connects where no engine binds; the engine binds elsewhere.
		{"sidecar connects", false, "tcp://127.0.0.1:1", "run the sidecar with --bind-events"},
		// The sidecar binds; the engine binds too (elsewhere), connecting to nothing.
		{"sidecar binds", true, "tcp://127.0.0.1:*", "does not connect to it"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			pub := newPublisher(t, "tcp://127.0.0.1:0")
			var logs testutil.SyncBuffer
			e := eventEngine(t, pub, tc.events, tc.bind, 20*time.Millisecond, &logs)
			// A batch at a time, each brought by a probe, until the warning:
			// noLiveProbes of them, or a few more when one probe's count was
			// read with the next one's (the counters run ahead of Next).
			for i := 0; !strings.Contains(logs.String(), noLiveWarning); i++ {
				if i == 4*noLiveProbes {
					t.Fatalf("no warning after %d batches brought only by probes:\n%s", i, logs.String())
				}
				if _, err := pub.Publish(block(uint64(100+i), 4*i)); err != nil {
					t.Fatal(err)
				}
				testutil.WaitFor(t, 10*time.Second, "a probe to bring the batch", func() bool { return e.c.batches.Load() == uint64(i+1) })
			}
			out := logs.String()
			if !strings.Contains(out, tc.advice) || (tc.bind && strings.Contains(out, "run the sidecar with --bind-events")) {
				t.Fatalf("advice for bind=%v, want %q:\n%s", tc.bind, tc.advice, out)
			}
			if n := strings.Count(out, noLiveWarning); n != 1 {
				t.Fatalf("%d warnings, want 1:\n%s", n, out)
			}
		})
	}
}
