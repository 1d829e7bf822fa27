package testutil

import (
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
