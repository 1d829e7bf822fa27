package sidecar

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// An engine whose metrics stop answering and come back after it restarted
// idle, with an empty cache: its sidecar used to gossip it as ready at the
// first good scrape while still holding the dead engine's keys, until the
// next idle probe found the restart (seconds, up to a minute after the
// outage's failed replays), and an ingress routed there on the index's word
// (black-box report, finding 7). The keys are now dropped, and the drop
// published, before it turns ready.
func TestEngineBackAfterOutageDropsDeadKeysBeforeReady(t *testing.T) {
	url, broken := breakableMetrics(t, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
	pub := newPublisher(t, "tcp://127.0.0.1:0")
	var logs testutil.SyncBuffer
	// Idle probes an hour apart: only the check on the way back can find
	// the restart within the test.
	e := eventEngine(t, pub, pub.Endpoint(), false, time.Hour, &logs)
	ready := scrapeEngine(t, e, url)

	testutil.WaitFor(t, 10*time.Second, "ready", ready)
	for i := range 3 {
		if _, err := pub.Publish(block(uint64(100+i), 4*i)); err != nil {
			t.Fatal(err)
		}
	}
	testutil.WaitFor(t, 10*time.Second, "the engine's keys", func() bool { return e.gpuKeys() == 3 })

	broken.Store(true)
	testutil.WaitFor(t, 10*time.Second, "the engine to turn unready", func() bool { return !ready() })
	pub.Restart() // back with an empty cache, idle
	broken.Store(false)
	// What gossip would carry when it turns ready: readiness, keys and the
	// published digest read together.
	keysAtReady, publishedSeq, seq := -1, uint64(0), uint64(0)
	testutil.WaitFor(t, 10*time.Second, "ready again", func() bool {
		e.mu.Lock()
		defer e.mu.Unlock()
		if !e.readyLocked() {
			return false
		}
		keysAtReady, publishedSeq = len(e.st.keyRefs[0])+len(e.st.keyRefs[1])+len(e.st.keyRefs[2]), e.published.Head.Seq
		seq = e.seq
		return true
	})
	if keysAtReady != 0 || publishedSeq != seq || e.c.rankResets.Load() != 1 {
		t.Fatalf("ready again holding %d keys of the dead engine (published seq %d of %d, %d rank resets):\n%s",
			keysAtReady, publishedSeq, seq, e.c.rankResets.Load(), logs.String())
	}
	testutil.WaitFor(t, 10*time.Second, "the line saying it answers again", func() bool {
		return strings.Contains(logs.String(), "engine answering its metrics again")
	})
	if !strings.Contains(logs.String(), "restart_checked=true") {
		t.Fatalf("the way back does not say the restart was checked:\n%s", logs.String())
	}
}

// Without a replay endpoint nothing can check the restart on the way back:
// the line says restart_checked=false, as documented (it said true, while
// the dead engine's keys stayed routed until the engine's next events).
func TestEngineBackWithoutReplaySaysUnchecked(t *testing.T) {
	url, broken := breakableMetrics(t, "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\n")
	pub := newPublisher(t, "tcp://127.0.0.1:0")
	var logs testutil.SyncBuffer
	e := eventEngineReplay(t, pub.Endpoint(), "", false, time.Hour, &logs)
	ready := scrapeEngine(t, e, url)

	testutil.WaitFor(t, 10*time.Second, "ready", ready)
	broken.Store(true)
	testutil.WaitFor(t, 10*time.Second, "the engine to turn unready", func() bool { return !ready() })
	broken.Store(false)
	testutil.WaitFor(t, 10*time.Second, "the line saying it answers again", func() bool {
		return strings.Contains(logs.String(), "engine answering its metrics again")
	})
	if !strings.Contains(logs.String(), "restart_checked=false") {
		t.Fatalf("the way back says the restart was checked with no replay endpoint:\n%s", logs.String())
	}
}

// scrapeEngine runs e's scrape loop against url until the test ends and
// returns whether e is ready.
func scrapeEngine(t *testing.T, e *engine, url string) func() bool {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.scrapeLoop(ctx, http.DefaultClient, url) }()
	t.Cleanup(func() { cancel(); <-done })
	return func() bool { e.mu.Lock(); defer e.mu.Unlock(); return e.readyLocked() }
}
