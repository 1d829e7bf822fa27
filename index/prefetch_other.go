//go:build !amd64

package index

// hasPrefetch is false: the lookup touches lines with plain loads instead.
const hasPrefetch = false

func prefetch(addrs []uintptr) {}
