package index

// hasPrefetch reports whether prefetch issues real prefetch instructions.
const hasPrefetch = true

// prefetch hints the CPU to load the cache line of every address in addrs.
// Go has no prefetch intrinsic and a plain load holds its place in the
// reorder buffer until the line arrives, which caps how many misses a loop
// of loads keeps in flight; PREFETCHT0 retires at once. It never faults, so
// an address need not be valid (it is only ever one of the table's lines).
//
//go:noescape
func prefetch(addrs []uintptr)
