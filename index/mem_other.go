//go:build !linux || race

package index

// largeMem owns one large array; off Linux, and under the race detector
// (which does not check accesses outside the Go heap), it is ordinary Go
// memory.
type largeMem struct{}

func allocLarge[T any](n int) ([]T, *largeMem) { return make([]T, n), &largeMem{} }

func (m *largeMem) free() {}

func (m *largeMem) mappedBytes() int { return 0 }
