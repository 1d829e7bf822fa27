//go:build !linux

package index

// largeMem owns one large array; off Linux it is ordinary Go memory.
type largeMem struct{}

func allocLarge[T any](n int) ([]T, *largeMem) { return make([]T, n), &largeMem{} }

func (m *largeMem) free() {}
