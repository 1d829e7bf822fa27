package testutil

import (
	"slices"
	"sync"
	"time"
	"unsafe"
)

// WallStepped is t with its wall-clock reading moved by d (whole seconds)
// and its monotonic reading kept: what time.Now returns after the system
// clock was stepped by d (NTP, an operator's date). t must come from
// time.Now (it must carry a monotonic reading). Code that measures
// intervals with Sub or Since is immune to the step; code that compares
// UnixNano values is not — which is what the tests of such code show.
func WallStepped(t time.Time, d time.Duration) time.Time {
	// time.Time's layout (Go 1.9 on): wall holds, with hasMonotonic set,
	// 33 bits of seconds since 1885 above 30 bits of nanoseconds; ext is
	// the monotonic reading. The standard library offers no way to move one
	// without the other, on purpose.
	type layout struct {
		wall uint64
		ext  int64
		loc  *time.Location
	}
	const hasMonotonic = 1 << 63
	l := (*layout)(unsafe.Pointer(&t))
	if l.wall&hasMonotonic == 0 {
		panic("testutil.WallStepped: t has no monotonic reading")
	}
	l.wall = uint64(int64(l.wall) + int64(d/time.Second)<<30)
	return t
}

// SteppedClock is a clock a test advances by hand: Now and After (a
// channel that fires once Step has moved the clock to or past its time).
// Safe for concurrent use.
type SteppedClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters []steppedWaiter
}

type steppedWaiter struct {
	at time.Time
	c  chan time.Time
}

// NewSteppedClock returns a SteppedClock reading start.
func NewSteppedClock(start time.Time) *SteppedClock { return &SteppedClock{now: start} }

// Now returns the clock's reading.
func (f *SteppedClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

// After returns a channel that receives the clock's reading once it has
// been stepped d past now (at once when d <= 0).
func (f *SteppedClock) After(d time.Duration) <-chan time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if d <= 0 {
		c <- f.now
		return c
	}
	f.waiters = append(f.waiters, steppedWaiter{f.now.Add(d), c})
	return c
}

// Step advances the clock and fires the waiters that are due.
func (f *SteppedClock) Step(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	f.waiters = slices.DeleteFunc(f.waiters, func(w steppedWaiter) bool {
		if w.at.After(f.now) {
			return false
		}
		w.c <- f.now
		return true
	})
}
