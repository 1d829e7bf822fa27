package ingress

import (
	"testing"
	"time"
)

// The stall watch compares progress and its cutoff on one monotonic clock:
// an engine that answered just now is not stalled, and one silent for
// longer than StallAfter is (a wall-clock cutoff against monotonic progress
// would call every engine with requests in flight stalled, or none).
func TestStallClockMonotonic(t *testing.T) {
	cfg := DefaultConfig()
	u := newUpstreams(&cfg)
	up, err := u.get("e", "http://127.0.0.1:1")
	if err != nil {
		t.Fatal(err)
	}
	up.inflight.Add(1)
	up.progress.Store(monoNow())
	now := time.Now()
	if got := u.stalled(nil, stallCutoff(now, time.Second)); len(got) != 0 {
		t.Fatalf("an engine that answered now is stalled")
	}
	if got := u.stalled(nil, stallCutoff(now.Add(2*time.Second), time.Second)); len(got) != 1 {
		t.Fatalf("an engine silent for 2 s is not stalled after 1 s")
	}
	up.inflight.Add(-1)
	if got := u.stalled(nil, stallCutoff(now.Add(2*time.Second), time.Second)); len(got) != 0 {
		t.Fatalf("an engine with nothing in flight is stalled")
	}
}
