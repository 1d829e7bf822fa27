package index

// specQueue is a FIFO of speculative insertions in expiry order (TTL is
// constant and expiries are monotonic-clock readings, so insertion order is
// expiry order). Keys are copied into one reused buffer, so steady-state
// speculation allocates nothing.
//
// A key re-speculated to the same engine before expiry is not refreshed: the
// first record's expiry clears it. Speculation only bridges the event
// propagation delay, so expiring early is harmless.
type specQueue struct {
	recs []specRec
	head int
	keys []uint64
	koff int // keys[:koff] belong to popped records
}

type specRec struct {
	exp  int64
	slot uint16
	gen  uint32 // the slot's generation: a record of a released slot is void
	off  int
	n    int
}

func (q *specQueue) push(exp int64, slot uint16, gen uint32, keys []uint64) {
	if q.head == len(q.recs) {
		// Empty: restart both buffers from the beginning.
		q.recs, q.head = q.recs[:0], 0
		q.keys, q.koff = q.keys[:0], 0
	} else if q.head > 1024 && q.head*2 > len(q.recs) {
		q.compact()
	}
	q.recs = append(q.recs, specRec{exp: exp, slot: slot, gen: gen, off: len(q.keys), n: len(keys)})
	q.keys = append(q.keys, keys...)
}

func (q *specQueue) compact() {
	n := copy(q.recs, q.recs[q.head:])
	q.recs = q.recs[:n]
	q.head = 0
	base := q.koff
	m := copy(q.keys, q.keys[base:])
	q.keys = q.keys[:m]
	q.koff = 0
	for i := range q.recs {
		q.recs[i].off -= base
	}
}

// popExpired returns the oldest record if it expired at or before now, or
// if it expires after latest (now plus the TTL): no record pushed at or
// before now can, unless the caller's clock went back (a time without a
// monotonic reading, stepped back), and such a record would block every
// record behind it for the size of the step.
func (q *specQueue) popExpired(now, latest int64) (specRec, []uint64, bool) {
	if q.head == len(q.recs) {
		return specRec{}, nil, false
	}
	if e := q.recs[q.head].exp; e > now && e <= latest {
		return specRec{}, nil, false
	}
	r := q.recs[q.head]
	q.head++
	q.koff = r.off + r.n
	return r, q.keys[r.off : r.off+r.n], true
}
