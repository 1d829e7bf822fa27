// Package monotime reads the monotonic clock as int64 nanoseconds, for the
// rate limits kvmesh keeps in atomics (one warning per interval, one probe
// per interval). time.Now().UnixNano() is the wall clock: after the system
// clock is stepped back, now-last stays below the interval for the size of
// the step, and the warning or probe is held that long. Readings here come
// from time.Time.Sub against a base taken at start, which uses the
// monotonic clock. They are meaningful within one process only.
package monotime

import "time"

// base is the process's reference reading.
var base = time.Now()

// Of is t as nanoseconds since base, plus 1 so that a reading is never 0
// (left to mean "never" in the atomics). t from time.Now is read on its
// monotonic clock.
func Of(t time.Time) int64 { return int64(t.Sub(base)) + 1 }

// Now is Of(time.Now()).
func Now() int64 { return Of(time.Now()) }

// Time is the wall-clock time of reading ns, for display.
func Time(ns int64) time.Time { return base.Add(time.Duration(ns - 1)) }
