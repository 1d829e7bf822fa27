package ingress

import (
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestEngineTokenizeBackoffUnderLoad: /tokenize calls that go unanswered
// (a burst: the engines are slow, not missing the endpoint) pause the
// fallback for slowBackoff, doubling while it recurs and back to
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
	clock := time.Unix(1_000_000, 0)
	et.now = func() time.Time { return clock }
	c := &call{s: s, model: "m"}
	warns := func() int { return strings.Count(logs.String(), `"level":"WARN"`) }
	offFor := func() time.Duration { return time.Duration(et.model("m").off.Load() - clock.UnixNano()) }

	// A burst: 88 calls time out at once.
	var wg sync.WaitGroup
	for range 88 {
		wg.Add(1)
		go func() { defer wg.Done(); et.fail(c, "e", tokSlow, "fasthttp: timeout") }()
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
	for range failRun {
		et.fail(c, "e", tokSlow, "fasthttp: timeout")
	}
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
	et.succeeded("m")
	for range failRun {
		et.fail(c, "e", tokSlow, "fasthttp: timeout")
	}
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
}
