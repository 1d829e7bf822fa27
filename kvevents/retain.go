package kvevents

import "unsafe"

// eventSize is the bytes of one Event in a Batch's Events array.
const eventSize = int(unsafe.Sizeof(Event{}))

// retainedBytes is the memory b keeps for reuse: its Events array to its
// capacity and, at every position, the event's slices to theirs (a
// position keeps the biggest slices any batch decoded there).
func (b *Batch) retainedBytes() int {
	n := cap(b.Events) * eventSize
	for _, e := range b.Events[:cap(b.Events)] {
		n += cap(e.BlockHashes)*8 + cap(e.TokenIDs)*4 + cap(e.ExtraKeys)
	}
	return n
}
