package des

import (
	"context"
	"math"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// gapTrace has busy stretches hours apart, and a session whose second turn
// comes an hour after the first's answer (a closed-loop follow-up).
const gapTrace = `{"timestamp": 0, "input_length": 1200, "output_length": 40, "hash_ids": [1, 2, 3]}
{"timestamp": 150, "session_id": "s", "input_length": 1200, "output_length": 40, "hash_ids": [1, 2, 4]}
{"session_id": "s", "delay": 3600000, "input_length": 1900, "output_length": 8, "hash_ids": [1, 2, 4, 8]}
{"timestamp": 900, "input_length": 700, "output_length": 20, "hash_ids": [5, 6]}
{"timestamp": 7200000, "input_length": 1200, "output_length": 40, "hash_ids": [1, 2, 7]}
{"timestamp": 7200050, "input_length": 1300, "output_length": 30, "hash_ids": [1, 2, 3]}
{"timestamp": 7201234, "input_length": 900, "output_length": 10, "hash_ids": [5, 6]}
{"timestamp": 18000000, "input_length": 1200, "output_length": 40, "hash_ids": [1, 2, 9]}
`

func gapConfig(t *testing.T) ([]workload.Request, Config) {
	t.Helper()
	reqs, err := workload.Mooncake{BlockTokens: 512}.Read(strings.NewReader(gapTrace))
	if err != nil {
		t.Fatal(err)
	}
	prof, err := engine.LookupProfile("8b-h100")
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{Engines: 2, Engine: engine.Config{GPUBlocks: 400, Profile: prof}}
	cfg.Defaults()
	return reqs, cfg
}

// TestIdleSnapshotsSkipped: through idle virtual time the router's
// snapshot jumps to the first grid point at or after the next event,
// instead of stepping every SnapshotInterval (a trace with a 55-year gap,
// a relative row among epoch ones, ran for half an hour), and the run's
// every number and request is what the stepping gives.
func TestIdleSnapshotsSkipped(t *testing.T) {
	reqs, cfg := gapConfig(t)
	for _, p := range []string{"kvmesh", "random", "dynamo"} {
		var res [2]struct {
			stats runStats
			snaps int
		}
		for i, every := range []bool{false, true} {
			s, err := newSim(&cfg, reqs, p)
			if err != nil {
				t.Fatal(err)
			}
			s.everyTick = every
			res[i].stats, res[i].snaps = s.run(context.Background()), s.snapshots
		}
		jump, step := res[0], res[1]
		// 5 hours of 200 ms snapshots against a few per busy stretch.
		if step.snaps < 80_000 || jump.snaps > 500 {
			t.Errorf("%s: %d snapshots with the jump, %d stepping every interval", p, jump.snaps, step.snaps)
		}
		a, b := jump.stats.result(), step.stats.result()
		a.Wall, b.Wall = 0, 0
		if a.Completed != len(reqs) || !reflect.DeepEqual(a, b) {
			t.Errorf("%s: result with the jump\n%+v\nstepping\n%+v", p, a, b)
		}
		if ra, rb := jump.stats.recs.run(), step.stats.recs.run(); !reflect.DeepEqual(ra, rb) {
			t.Errorf("%s: requests with the jump\n%+v\nstepping\n%+v", p, ra.Records, rb.Records)
		}
	}
}

// TestIdleSnapshotsSkippedPD: the same in a P/D run, whose transfers are
// events of their own.
func TestIdleSnapshotsSkippedPD(t *testing.T) {
	reqs, c := gapConfig(t)
	cfg := PDConfig{Config: c, Roles: Roles{Prefill: 1, Decode: 1, Mixed: 1}}
	cfg.Defaults()
	for _, p := range []string{"aggregated", "kvmesh", "kthena"} {
		var res [2]PDResult
		var recs [2]any
		var snaps [2]int
		for i, every := range []bool{false, true} {
			s, err := newPDSim(&cfg, reqs, p)
			if err != nil {
				t.Fatal(err)
			}
			s.everyTick = every
			res[i] = s.run(context.Background())
			res[i].Wall = 0
			recs[i], _ = s.records()
			snaps[i] = s.snapshots
		}
		if snaps[1] < 80_000 || snaps[0] > 500 {
			t.Errorf("%s: %d snapshots with the jump, %d stepping every interval", p, snaps[0], snaps[1])
		}
		if res[0].Completed != len(reqs) || !reflect.DeepEqual(res[0], res[1]) || !reflect.DeepEqual(recs[0], recs[1]) {
			t.Errorf("%s: with the jump\n%+v\nstepping\n%+v", p, res[0], res[1])
		}
	}
}

func TestNextGridPoint(t *testing.T) {
	const every = 200 * time.Millisecond
	at := func(ts ...time.Duration) *eventHeap {
		var h eventHeap
		for _, t := range ts {
			h.push(t, evArrival, 0)
		}
		return &h
	}
	for _, tc := range []struct {
		now  time.Duration
		h    *eventHeap
		want time.Duration
	}{
		{0, at(), every},                                   // nothing pending: the next point
		{0, at(50 * time.Millisecond), every},              // an event before it
		{0, at(every), every},                              // an event at it
		{400 * time.Millisecond, at(time.Hour), time.Hour}, // on the grid: at the event
		{400 * time.Millisecond, at(time.Hour + time.Nanosecond), time.Hour + every}, // just past: the next point
		{100 * time.Millisecond, at(time.Second, 3*time.Hour), 1100 * time.Millisecond},
		{0, at(math.MaxInt64 - 5), math.MaxInt64 - 5}, // no grid point left: the event's time
	} {
		if got := nextGridPoint(tc.now, every, tc.h); got != tc.want {
			t.Errorf("now %v, next event %v: %v, want %v", tc.now, tc.h.ev[0].at, got, tc.want)
		}
	}
}
