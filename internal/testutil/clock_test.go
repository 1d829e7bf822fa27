package testutil

import (
	"testing"
	"time"
)

// WallStepped moves the wall reading alone: Sub still measures the real
// interval, UnixNano jumps by the step.
func TestWallStepped(t *testing.T) {
	now := time.Now()
	later := WallStepped(now.Add(time.Second), -10*time.Minute)
	if d := later.Sub(now); d != time.Second {
		t.Fatalf("Sub across the step: %v, want 1s (monotonic)", d)
	}
	if d := time.Duration(later.UnixNano() - now.UnixNano()); d != time.Second-10*time.Minute {
		t.Fatalf("wall difference: %v, want 1s-10m", d)
	}
}
