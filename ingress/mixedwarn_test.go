package ingress

import (
	"log/slog"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The mixed-block-size warning is repeated when the set of sizes its
// model's engines report changes, at most once per tokenCheckWarnEvery:
// sidecars learn their sizes from the first KV events, so a fleet of five
// sizes was warned of once, naming the first two, and never with "more
// than 4" (tester h-reg8 F3). A set that comes back is not warned of again
// in the interval; the change is warned of once it has passed.
func TestMixedBlockSizeWarningFollowsTheSet(t *testing.T) {
	var logs testutil.SyncBuffer
	tc := newTokenCheck(prometheus.NewRegistry(), nil)
	s := &Server{log: slog.New(slog.NewTextHandler(&logs, nil)), check: tc}
	decide := func(sizes ...int) {
		c := &call{s: s}
		for _, bs := range sizes {
			c.sizes.add(bs)
		}
		c.sizes.rank(16)
		tc.mixedBlockSizes(c, "m")
	}
	warnings := func() int { return strings.Count(logs.String(), "KV block sizes") }

	decide(16, 32)
	decide(32, 16, 16) // the same sizes, other counts
	if n := warnings(); n != 1 || !strings.Contains(logs.String(), "16 (1 engines), 32 (1 engines)") {
		t.Fatalf("%d warnings, want 1 naming 16 and 32: %s", n, logs.String())
	}
	decide(16, 16, 32, 48, 64, 128) // three sizes learned since, within the interval
	if n := warnings(); n != 1 {
		t.Fatalf("%d warnings within the interval, want 1: %s", n, logs.String())
	}
	tc.model("m").mixedWarned.Add(-int64(tokenCheckWarnEvery)) // the interval has passed
	decide(16, 16, 32, 48, 64, 128)
	decide(16, 16, 32, 48, 64, 128)
	if n := warnings(); n != 2 || !strings.Contains(logs.String(), "more than 4 KV block sizes") ||
		!strings.Contains(logs.String(), "16 (2 engines), 32 (1 engines), 48 (1 engines), 64 (1 engines), 128 (1 engines)") {
		t.Fatalf("%d warnings, want a second naming the five sizes: %s", n, logs.String())
	}
	tc.model("m").mixedWarned.Add(-int64(tokenCheckWarnEvery))
	decide(128, 64, 48, 32, 16) // the same set, listed otherwise
	if n := warnings(); n != 2 {
		t.Fatalf("%d warnings for an unchanged set, want 2: %s", n, logs.String())
	}
}

// The set's fingerprint depends on the distinct sizes and on whether one
// was left out, not on their order or counts.
func TestBlockSizesSet(t *testing.T) {
	set := func(sizes ...int) uint64 {
		var b blockSizes
		for _, bs := range sizes {
			b.add(bs)
		}
		return b.set()
	}
	if set(16, 32) != set(32, 16, 16) || set(16, 32) == set(16, 48) || set(16) == set(16, 32) || set() == 0 {
		t.Fatal("the fingerprint does not follow the set of sizes")
	}
	if set(1, 2, 3, 4, 5, 6, 7, 8) == set(1, 2, 3, 4, 5, 6, 7, 8, 9) {
		t.Fatal("a size left out does not change the fingerprint")
	}
}
