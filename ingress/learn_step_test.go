package ingress

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/scheduler"
)

// TestKVBoundSinceAcrossWallStep: whether an engine was seen KV-bound
// after an attempt's send follows the order of the two sends in real
// time, whatever the wall clock did between them. On the wall clock, a
// KV-bound send a second after the attempt, with the clock stepped back a
// minute in between, read as before it (the attempt's prefill sample went
// to the engine's own line), and one noted before the attempt, with the
// clock stepped forward, read as after it for the size of the step.
func TestKVBoundSinceAcrossWallStep(t *testing.T) {
	bound := &call{cands: []scheduler.Engine{{ID: "e", Waiting: 1, KVUsage: 0.97}}}
	sent := time.Now()

	up := &upstream{id: "e"}
	bound.noteSent(up, testutil.WallStepped(sent.Add(time.Second), -time.Minute))
	if !kvBoundSince(up, sent) {
		t.Fatal("a KV-bound send a second after the attempt, the wall clock stepped back a minute between them: not seen as since")
	}

	up = &upstream{id: "e"}
	bound.noteSent(up, sent)
	if kvBoundSince(up, testutil.WallStepped(sent.Add(time.Second), -time.Minute)) {
		t.Fatal("a KV-bound send a second before the attempt, the wall clock stepped back a minute between them: seen as since")
	}
}
