package oldidx

// table is an open-addressing hash table (linear probing, backward-shift
// deletion, no tombstones) from a chain key to up to inlineN engine elements.
// A key held by more engines keeps the rest in an overflow slice, marked by
// overflowMark in the last inline element. 16 bytes per key: the key plus four
// 16-bit elements, so a key on one engine costs 16/loadFactor ≈ 21 bytes.
//
// Element encoding (uint16): bits 0-11 engine slot, bits 12-14 tier mask
// (GPU, CPU, other), bit 15 speculative. Zero tier and speculative bits mean
// the element is empty.
//
// Not safe for concurrent use; Index guards it.
type table struct {
	// b holds key and elements side by side so one probe is one cache
	// miss (four buckets per 64-byte line).
	b     []bucket
	mask  uint64
	shift uint8
	used  int // occupied buckets (excluding the zero key, kept aside)

	// The zero key cannot mark an empty bucket and be a key at once; it is
	// astronomically rare for xxh3 but must still be correct.
	zeroUsed bool
	zeroElem [inlineN]uint16

	overflow map[uint64][]uint16
}

const (
	inlineN      = 4
	slotBits     = 12
	slotMask     = 1<<slotBits - 1
	tierShift    = slotBits
	specBit      = 1 << 15
	overflowMark = 0xFFFF // last inline element when the key has overflow elements
	// MaxEngines is how many distinct engines one Index can track (slot
	// 4095 is reserved so overflowMark never looks like a real element).
	MaxEngines = slotMask
	minBuckets = 1024
	maxLoadNum = 3 // grow beyond 3/4 full
	maxLoadDen = 4
)

// bucket is one table slot: key 0 means empty.
type bucket struct {
	key uint64
	e   [inlineN]uint16
}

func newTable(buckets int) *table {
	n := minBuckets
	for n < buckets {
		n <<= 1
	}
	t := &table{overflow: make(map[uint64][]uint16)}
	t.alloc(n)
	return t
}

func (t *table) alloc(n int) {
	t.b = make([]bucket, n)
	t.mask = uint64(n - 1)
	shift := uint8(64)
	for m := n; m > 1; m >>= 1 {
		shift--
	}
	t.shift = shift
	t.used = 0
}

// home is the preferred bucket of k: Fibonacci hashing spreads keys that are
// not uniformly random (tests, traces) as well as xxh3 outputs.
func (t *table) home(k uint64) uint64 {
	return (k * 0x9E3779B97F4A7C15) >> t.shift
}

// find returns the bucket of k, or -1.
func (t *table) find(k uint64) int {
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.b[i].key {
		case k:
			return int(i)
		case 0:
			return -1
		}
	}
}

// elemsOf returns the inline elements of k (nil when absent).
func (t *table) elemsOf(k uint64) *[inlineN]uint16 {
	if k == 0 {
		if t.zeroUsed {
			return &t.zeroElem
		}
		return nil
	}
	if i := t.find(k); i >= 0 {
		return &t.b[i].e
	}
	return nil
}

// insert returns the elements of k, adding an empty bucket when absent.
func (t *table) insert(k uint64) *[inlineN]uint16 {
	if k == 0 {
		t.zeroUsed = true
		return &t.zeroElem
	}
	if (t.used+1)*maxLoadDen > len(t.b)*maxLoadNum {
		t.grow()
	}
	for i := t.home(k); ; i = (i + 1) & t.mask {
		switch t.b[i].key {
		case k:
			return &t.b[i].e
		case 0:
			t.b[i].key = k
			t.used++
			return &t.b[i].e
		}
	}
}

func (t *table) grow() {
	old := t.b
	t.alloc(len(old) * 2)
	for _, ob := range old {
		if ob.key == 0 {
			continue
		}
		for i := t.home(ob.key); ; i = (i + 1) & t.mask {
			if t.b[i].key == 0 {
				t.b[i] = ob
				t.used++
				break
			}
		}
	}
}

// delete removes k with backward-shift deletion so probe chains stay intact.
func (t *table) delete(k uint64) {
	delete(t.overflow, k)
	if k == 0 {
		t.zeroUsed = false
		t.zeroElem = [inlineN]uint16{}
		return
	}
	i := t.find(k)
	if i < 0 {
		return
	}
	hole := uint64(i)
	for j := (hole + 1) & t.mask; t.b[j].key != 0; j = (j + 1) & t.mask {
		h := t.home(t.b[j].key)
		// Move j into the hole when its home is not in (hole, j] cyclically.
		if (j-h)&t.mask >= (j-hole)&t.mask {
			t.b[hole] = t.b[j]
			hole = j
		}
	}
	t.b[hole] = bucket{}
	t.used--
}

// setBits ORs bits into the element of slot for key k, creating what is
// missing. It returns the element's bits before the change.
func (t *table) setBits(k uint64, slot uint16, bits uint16) (before uint16) {
	e := t.insert(k)
	free := -1
	n := inlineN
	if e[inlineN-1] == overflowMark {
		n = inlineN - 1
	}
	for i := 0; i < n; i++ {
		v := e[i]
		if v>>tierShift == 0 {
			if free < 0 {
				free = i
			}
			continue
		}
		if v&slotMask == slot {
			e[i] = v | bits
			return v &^ slotMask
		}
	}
	if n < inlineN {
		ov := t.overflow[k]
		for i, v := range ov {
			if v&slotMask == slot {
				ov[i] = v | bits
				return v &^ slotMask
			}
		}
		if free >= 0 {
			e[free] = slot | bits
			return 0
		}
		t.overflow[k] = append(ov, slot|bits)
		return 0
	}
	if free >= 0 {
		e[free] = slot | bits
		return 0
	}
	// Inline full: move the last inline element to overflow and mark it.
	t.overflow[k] = append(t.overflow[k][:0], e[inlineN-1], slot|bits)
	e[inlineN-1] = overflowMark
	return 0
}

// clearBits clears bits from the element of slot for key k, dropping empty
// elements and the key when nothing is left. It returns the bits before.
func (t *table) clearBits(k uint64, slot uint16, bits uint16) (before uint16) {
	e := t.elemsOf(k)
	if e == nil {
		return 0
	}
	n := inlineN
	hasOv := e[inlineN-1] == overflowMark
	if hasOv {
		n = inlineN - 1
	}
	found := false
	for i := 0; i < n; i++ {
		v := e[i]
		if v>>tierShift != 0 && v&slotMask == slot {
			before = v &^ slotMask
			v &^= bits
			if v>>tierShift == 0 {
				v = 0
			}
			e[i] = v
			found = true
			break
		}
	}
	if !found && hasOv {
		ov := t.overflow[k]
		for i, v := range ov {
			if v&slotMask == slot {
				before = v &^ slotMask
				v &^= bits
				if v>>tierShift == 0 {
					ov[i] = ov[len(ov)-1]
					ov = ov[:len(ov)-1]
				} else {
					ov[i] = v
				}
				t.overflow[k] = ov
				break
			}
		}
	}
	if hasOv {
		t.compactOverflow(k, e)
	}
	if e[0]|e[1]|e[2]|e[3] == 0 {
		t.delete(k)
	}
	return before
}

// compactOverflow pulls overflow elements back inline while there is room,
// and drops the overflow mark when the overflow empties.
func (t *table) compactOverflow(k uint64, e *[inlineN]uint16) {
	ov := t.overflow[k]
	for i := 0; i < inlineN-1 && len(ov) > 0; i++ {
		if e[i] == 0 {
			e[i] = ov[len(ov)-1]
			ov = ov[:len(ov)-1]
		}
	}
	switch len(ov) {
	case 0:
		e[inlineN-1] = 0
		delete(t.overflow, k)
	case 1:
		e[inlineN-1] = ov[0]
		delete(t.overflow, k)
	default:
		t.overflow[k] = ov
	}
}
