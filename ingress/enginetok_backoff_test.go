package ingress

import (
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestEngineTokenizeBackoffUnderLoad: /tokenize calls that go unanswered
// on two engines (a burst: the engines are slow, not missing the endpoint)
// pause the fallback for slowBackoff, doubling while it recurs and back to
// slowBackoff after a success, with one warning per pause however many
// calls failed at once; a missing /tokenize (404) or answered failures in a
// row still pause it for engineTokenizeOff, and a 404 lengthens a short
// pause. Before, 3 timeouts in a row turned it off for 5 minutes, and a
// burst logged one warning per 3 failures.
func TestEngineTokenizeBackoffUnderLoad(t *testing.T) {
	var logs testutil.SyncBuffer
	s, err := New(testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}),
		Deps{Logger: slog.New(slog.NewJSONHandler(&logs, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	et := s.etok
	clock := time.Now() // read on its monotonic clock, as et.now is
	et.now = func() time.Time { return clock }
	c := &call{s: s, model: "m"}
	warns := func() int { return strings.Count(logs.String(), `"level":"WARN"`) }
	offFor := func() time.Duration { return time.Duration(et.model("m").off.Load() - monotime.Of(clock)) }

	// A burst: 88 calls time out at once, on two engines.
	var wg sync.WaitGroup
	for i := range 88 {
		wg.Add(1)
		go func() { defer wg.Done(); et.fail(c, "e"+strconv.Itoa(i%2), tokSlow, "fasthttp: timeout") }()
	}
	wg.Wait()
	if et.asking("m") || offFor() != slowBackoff || warns() != 1 {
		t.Fatalf("after a burst of timeouts: asking %v, off for %v, %d warnings; want paused for %v, 1 warning", et.asking("m"), offFor(), warns(), slowBackoff)
	}
	clock = clock.Add(slowBackoff)
	if !et.asking("m") {
		t.Fatal("not asking once the pause is over")
	}
	// Still slow: the next pause is twice as long.
	et.fail(c, "e0", tokSlow, "fasthttp: timeout")
	et.fail(c, "e1", tokSlow, "fasthttp: timeout")
	if offFor() != 2*slowBackoff || warns() != 2 {
		t.Fatalf("timeouts again: off for %v, %d warnings; want %v, 2", offFor(), warns(), 2*slowBackoff)
	}
	// A 404 meanwhile: the endpoint is missing, the long pause wins.
	et.fail(c, "e", tokUnsupported, "status 404")
	if offFor() != engineTokenizeOff || warns() != 3 {
		t.Fatalf("a 404 during a short pause: off for %v, %d warnings; want %v, 3", offFor(), warns(), engineTokenizeOff)
	}
	// A success resets the backoff.
	clock = clock.Add(engineTokenizeOff)
	et.succeeded("m", "e0", false)
	et.fail(c, "e0", tokSlow, "fasthttp: timeout")
	et.fail(c, "e1", tokSlow, "fasthttp: timeout")
	if offFor() != slowBackoff {
		t.Fatalf("timeouts after a success: off for %v, want %v", offFor(), slowBackoff)
	}
	// Answered failures (an engine whose /tokenize refuses chat) are the long pause.
	clock = clock.Add(slowBackoff)
	for i := range failRun {
		if !et.asking("m") {
			t.Fatalf("paused after %d answered failures", i)
		}
		et.fail(c, "e", tokRefused, "status 422")
	}
	if offFor() != engineTokenizeOff {
		t.Fatalf("answered failures: off for %v, want %v", offFor(), engineTokenizeOff)
	}
	// The pause is timed on the monotonic clock: a wall clock stepped back
	// an hour does not lengthen it by an hour, nor one stepped forward
	// shorten it (on the wall clock it did both).
	clock = testutil.WallStepped(clock.Add(engineTokenizeOff-time.Second), time.Hour)
	if et.asking("m") {
		t.Fatal("asking a second before the pause ends, the wall clock stepped forward an hour")
	}
	clock = testutil.WallStepped(clock.Add(time.Second), -2*time.Hour)
	if !et.asking("m") {
		t.Fatal("not asking once the pause is over, the wall clock stepped back an hour")
	}
}

// TestEngineTokenizeOneSlowEngineKeepsTheModel: one engine whose /tokenize
// keeps going unanswered (a hung process the stall watch has not ejected
// yet) is not asked for slowEngineBackoff, however often it failed, and the
// model's other engines still are; only a second engine slow while the
// first is in its backoff pauses the model. An answer ends an engine's
// backoff. Before, three timeouts of one engine turned engine-side
// tokenization off for the whole model.
func TestEngineTokenizeOneSlowEngineKeepsTheModel(t *testing.T) {
	s, err := New(testConfig(StaticEngine{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}),
		Deps{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registry: prometheus.NewRegistry()})
	if err != nil {
		t.Fatal(err)
	}
	et := s.etok
	clock := time.Now() // read on its monotonic clock, as et.now is
	et.now = func() time.Time { return clock }
	c := &call{s: s, model: "m"}
	tm := et.model("m")
	for range 10 {
		et.fail(c, "hung", tokSlow, "fasthttp: timeout")
	}
	if !et.asking("m") || !tm.slowEngine("hung", clock) || tm.slowEngine("e", clock) {
		t.Fatalf("one slow engine: model asked %v, hung in backoff %v, e in backoff %v; want true, true, false",
			et.asking("m"), tm.slowEngine("hung", clock), tm.slowEngine("e", clock))
	}
	clock = clock.Add(slowEngineBackoff)
	if tm.slowEngine("hung", clock) {
		t.Fatal("the engine's backoff did not end")
	}
	// Its backoff over, it fails again; then an answer ends it.
	et.fail(c, "hung", tokSlow, "fasthttp: timeout")
	et.succeeded("m", "hung", false)
	if tm.slowEngine("hung", clock) {
		t.Fatal("an answer did not end the engine's backoff")
	}
	// Two engines slow at once: the model pauses.
	et.fail(c, "hung", tokSlow, "fasthttp: timeout")
	clock = clock.Add(slowEngineBackoff - time.Millisecond)
	et.fail(c, "e", tokSlow, "fasthttp: timeout")
	if et.asking("m") {
		t.Fatal("two slow engines: the model's engines are still asked")
	}
	// Two engines slow one after the other (the first's backoff over): no pause.
	clock = clock.Add(engineTokenizeOff)
	et.succeeded("m", "e", false)
	et.fail(c, "hung", tokSlow, "fasthttp: timeout")
	clock = clock.Add(slowEngineBackoff)
	et.fail(c, "e", tokSlow, "fasthttp: timeout")
	if !et.asking("m") {
		t.Fatal("two engines slow at different times paused the model")
	}
}
