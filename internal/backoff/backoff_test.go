package backoff

import (
	"context"
	"testing"
	"time"
)

func TestDelayDoublesCapsAndJitters(t *testing.T) {
	b := Backoff{Min: 100 * time.Millisecond, Max: time.Second}
	for n, want := range []time.Duration{100, 200, 400, 800, 1000, 1000} {
		if got := b.Delay(n); got != want*time.Millisecond {
			t.Errorf("Delay(%d) = %v, want %v", n, got, want*time.Millisecond)
		}
	}
	b.Jitter = 0.2
	distinct := map[time.Duration]bool{}
	for i := 0; i < 200; i++ {
		d := b.Delay(3)
		if d < 640*time.Millisecond || d > 960*time.Millisecond {
			t.Fatalf("jittered delay %v outside 800ms ±20%%", d)
		}
		distinct[d] = true
	}
	if len(distinct) < 10 {
		t.Fatalf("only %d distinct delays in 200: no jitter", len(distinct))
	}
}

func TestSleepStopsOnContext(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep returned true on a canceled context")
	}
	if !Sleep(context.Background(), time.Microsecond) {
		t.Fatal("Sleep returned false without cancel")
	}
}
