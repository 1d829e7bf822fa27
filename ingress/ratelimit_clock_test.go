package ingress

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The usage probe's interval is measured on the monotonic clock: after the
// wall clock steps back 10 minutes, the model is probed again once
// forcedUsageEvery has really passed, not that plus the step.
func TestUsageProbeAcrossWallClockStepBack(t *testing.T) {
	var st usageState
	st.verdict.Store(usageForced) // known: the long interval
	t0 := time.Now()
	if !st.claimProbe(t0) {
		t.Fatal("the first request is not the probe")
	}
	if st.claimProbe(t0.Add(time.Minute)) {
		t.Fatal("probed again within forcedUsageEvery")
	}
	later := testutil.WallStepped(t0.Add(forcedUsageEvery+time.Second), -10*time.Minute)
	if !st.claimProbe(later) {
		t.Fatal("no probe forcedUsageEvery after the last one, across a wall-clock step back")
	}
}
