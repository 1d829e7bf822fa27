package monotime_test

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Readings measure real intervals across a wall-clock step back, are never
// 0, and map back to wall time for display.
func TestReadingsIgnoreWallClockSteps(t *testing.T) {
	now := time.Now()
	a := monotime.Of(now)
	b := monotime.Of(testutil.WallStepped(now.Add(11*time.Second), -10*time.Minute))
	if d := time.Duration(b - a); d != 11*time.Second {
		t.Fatalf("interval across a 10-minute step back: %v, want 11s", d)
	}
	if a == 0 || monotime.Now() == 0 {
		t.Fatal("a reading is 0, which means never")
	}
	if w := monotime.Time(a); !w.Equal(now) {
		t.Fatalf("Time(Of(now)) = %v, want %v", w, now)
	}
}
