//go:build linux && !race

package index

import (
	"runtime"
	"syscall"
	"unsafe"
)

// hugeMin is the array size from which the bucket array and the overflow
// chunk arena live in their own mapping backed by transparent huge pages. A lookup touches hundreds of random
// buckets; with 4 KiB pages every one of them is also a TLB miss (a nested
// page walk under a hypervisor), and the walks, not the cache misses, were
// what serialised lookups over large tables.
const hugeMin = 4 << 20

const hugePage = 2 << 20

// largeMem owns one large array. Small arrays are ordinary Go memory;
// large ones are an anonymous mapping advised MADV_HUGEPAGE, unmapped by
// free (called when the array is replaced by a bigger one) or by a cleanup
// when the table is garbage collected.
type largeMem struct {
	mapping []byte
	cleanup runtime.Cleanup
	mapped  bool
}

// allocLarge returns n zeroed Ts and their owner. T must hold no Go
// pointers: the mapping is invisible to the garbage collector.
func allocLarge[T any](n int) ([]T, *largeMem) {
	var zero T
	size := n * int(unsafe.Sizeof(zero))
	if size < hugeMin {
		return make([]T, n), &largeMem{}
	}
	// Over-allocate one huge page so the array can start on a 2 MiB
	// boundary (THP only backs aligned 2 MiB extents).
	mem, err := syscall.Mmap(-1, 0, size+hugePage, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return make([]T, n), &largeMem{}
	}
	off := 0
	if r := int(uintptr(unsafe.Pointer(&mem[0])) % hugePage); r != 0 {
		off = hugePage - r
	}
	_ = syscall.Madvise(mem[off:off+size], madvHugepage) // best effort: without THP it is plain memory
	m := &largeMem{mapping: mem, mapped: true}
	m.cleanup = runtime.AddCleanup(m, func(mem []byte) { _ = syscall.Munmap(mem) }, mem)
	return unsafe.Slice((*T)(unsafe.Pointer(&mem[off])), n), m
}

// madvHugepage is MADV_HUGEPAGE (not exported by package syscall).
const madvHugepage = 14

// free releases the mapping now. The caller must hold no bucket of it.
func (m *largeMem) free() {
	if m == nil || !m.mapped {
		return
	}
	m.cleanup.Stop()
	_ = syscall.Munmap(m.mapping)
	m.mapping, m.mapped = nil, false
}

// mappedBytes is the size of the mapping (0 for Go memory).
func (m *largeMem) mappedBytes() int {
	if m == nil {
		return 0
	}
	return len(m.mapping)
}
