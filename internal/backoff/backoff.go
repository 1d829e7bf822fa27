// Package backoff is the one retry delay every kvmesh loop uses: exponential
// from Min to Max with random jitter, so many processes that lost the same
// dependency (NATS, an engine) do not retry in lock step.
package backoff

import (
	"context"
	"math/rand/v2"
	"time"
)

// Backoff computes retry delays. The zero Jitter means no jitter; 0.2 spreads
// each delay uniformly over ±20 %.
type Backoff struct {
	Min, Max time.Duration
	Jitter   float64 // fraction in [0, 1]
}

// Delay is the wait before retry n (0 for the first retry): Min·2ⁿ capped at
// Max, then jittered. It never returns less than 0.
func (b Backoff) Delay(n int) time.Duration {
	d := b.Min
	for i := 0; i < n && d < b.Max; i++ {
		d *= 2
	}
	if b.Max > 0 && d > b.Max {
		d = b.Max
	}
	return Jitter(d, b.Jitter)
}

// Jitter spreads d uniformly over d·(1±f).
func Jitter(d time.Duration, f float64) time.Duration {
	if f <= 0 || d <= 0 {
		return d
	}
	f = min(f, 1)
	return time.Duration(float64(d) * (1 - f + 2*f*rand.Float64()))
}

// Sleep waits d or until ctx ends; false when ctx ended first.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}
