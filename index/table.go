package index

// table is an open-addressing hash table (linear probing, backward-shift
// deletion, no tombstones) from a chain key to its engine elements. 16 bytes
// per key: the key plus four 16-bit elements, so a key on one engine costs
// 16/loadFactor ≈ 21–32 bytes.
//
// Element encoding (uint16): bits 0-11 engine slot, bits 12-14 tier mask
// (GPU, CPU, other), bit 15 speculative. An element with no tier or
// speculative bit is stored as 0 (empty), so a non-zero value below 1<<12
// is never an element: the last inline element uses that range to mark a
// key on more than four engines (see isOv). Such a key keeps two elements
// inline and the rest in a chain of 64-byte chunks in one arena (ov), so it
// costs one more cache line per lookup, not a map lookup and two pointer
// chases.
//
// Not safe for concurrent use; Index guards it.
type table struct {
	// b holds key and elements side by side so one probe is one cache
	// miss (four buckets per 64-byte line).
	b     []bucket
	mem   *largeMem // owner of b
	mask  uint64
	shift uint8
	used  int // occupied buckets (excluding the zero key, kept aside)

	// The zero key cannot mark an empty bucket and be a key at once; it is
	// astronomically rare for xxh3 but must still be correct.
	zeroUsed bool
	zeroElem [inlineN]uint16

	// ov is the overflow chunk arena; chunk 0 is never used so a reference
	// is never 0. ovFree heads the free list (linked through next), ovLen
	// is the high-water mark, ovKeys counts keys that use chunks.
	ov     []chunk
	ovMem  *largeMem
	ovFree uint32
	ovLen  uint32
	ovKeys int
}

const (
	inlineN  = 4
	lineN    = 4           // buckets per 64-byte cache line
	ovInline = inlineN - 2 // inline elements left when e[2:4] hold a chunk reference
	chunkN   = 30
	// maxChunks bounds chunk references so e[3] = 1 + ref>>16 stays below
	// 1<<12 (17 GB of chunks; a write beyond it is dropped, not a panic).
	maxChunks  = (1<<tierShift - 1) << 16
	slotBits   = 12
	slotMask   = 1<<slotBits - 1
	tierShift  = slotBits
	specBit    = 1 << 15
	fibMul     = 0x9E3779B97F4A7C15
	minBuckets = 1024
	maxLoadNum = 3 // grow beyond 3/4 full
	maxLoadDen = 4
	// MaxEngines is how many distinct engines one Index can track.
	MaxEngines = slotMask
)

// bucket is one table slot: key 0 means empty.
type bucket struct {
	key uint64
	e   [inlineN]uint16
}

// chunk holds overflow elements of one key (0 = empty), next links the
// key's following chunk (0 = last). 64 bytes: one cache line.
type chunk struct {
	e    [chunkN]uint16
	next uint32
}

// isOv reports whether e[2:4] hold a chunk reference instead of elements.
func isOv(e *[inlineN]uint16) bool { return e[3] != 0 && e[3] < 1<<tierShift }

func ovRef(e *[inlineN]uint16) uint32 { return uint32(e[3]-1)<<16 | uint32(e[2]) }

func setOvRef(e *[inlineN]uint16, r uint32) {
	e[2] = uint16(r)
	e[3] = uint16(r>>16) + 1
}

// normalize maps an element with no tier or speculative bit to 0.
func normalize(v uint16) uint16 {
	if v>>tierShift == 0 {
		return 0
	}
	return v
}

func newTable(buckets int) *table {
	n := minBuckets
	for n < buckets {
		n <<= 1
	}
	t := &table{}
	t.alloc(n)
	return t
}

func (t *table) alloc(n int) {
	t.b, t.mem = allocLarge[bucket](n)
	t.mask = uint64(n - 1)
	shift := uint8(64)
	for m := n; m > 1; m >>= 1 {
		shift--
	}
	t.shift = shift
	t.used = 0
}

// home is the preferred bucket of k: the first bucket of a 64-byte line
// (lineN buckets), so a key is almost always found in the one line its hash
// names, and a probe spills into the next line only when that line is full.
// Fibonacci hashing spreads keys that are not uniformly random (tests,
// traces) as well as xxh3 outputs.
func (t *table) home(k uint64) uint64 {
	return homeOf(k, t.shift)
}

func homeOf(k uint64, shift uint8) uint64 {
	return (k * fibMul) >> shift &^ (lineN - 1)
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
	old, oldMem := t.b, t.mem
	defer oldMem.free()
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

// delete removes k (and its chunks) with backward-shift deletion so probe
// chains stay intact.
func (t *table) delete(k uint64) {
	if k == 0 {
		t.freeChunks(&t.zeroElem)
		t.zeroUsed = false
		t.zeroElem = [inlineN]uint16{}
		return
	}
	i := t.find(k)
	if i < 0 {
		return
	}
	t.freeChunks(&t.b[i].e)
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

// elem returns a pointer to slot's element among k's elements e (inline or
// in a chunk), or nil. The pointer is valid until the next chunk allocation.
func (t *table) elem(e *[inlineN]uint16, slot uint16) *uint16 {
	n := inlineN
	if isOv(e) {
		n = ovInline
		for c := ovRef(e); c != 0; c = t.ov[c].next {
			ch := &t.ov[c]
			for i, v := range ch.e {
				if v != 0 && v&slotMask == slot {
					return &ch.e[i]
				}
			}
		}
	}
	for i := 0; i < n; i++ {
		if v := e[i]; v != 0 && v&slotMask == slot {
			return &e[i]
		}
	}
	return nil
}

// update sets then clears bits on the element of slot for key k, creating
// what is missing. It returns the element's bits before the change. Setting
// and clearing in one step keeps the invariant that an element never holds
// a tier bit and the speculative bit at once.
func (t *table) update(k uint64, slot, set, clear uint16) (before uint16) {
	e := t.insert(k)
	if p := t.elem(e, slot); p != nil {
		v := *p
		*p = normalize((v | set) &^ clear)
		if *p == 0 {
			t.shrink(k, e)
		}
		return v &^ slotMask
	}
	if v := normalize((slot | set) &^ clear); v != 0 {
		t.add(e, v)
	}
	if !isOv(e) && e[0]|e[1]|e[2]|e[3] == 0 {
		t.delete(k) // nothing was added (full arena or empty update)
	}
	return 0
}

// setBits ORs bits into the element of slot for key k; see update.
func (t *table) setBits(k uint64, slot, bits uint16) (before uint16) {
	return t.update(k, slot, bits, 0)
}

// add stores a new element v among e: a free inline element, a free chunk
// element, or a new chunk.
func (t *table) add(e *[inlineN]uint16, v uint16) {
	n := inlineN
	ov := isOv(e)
	if ov {
		n = ovInline
	}
	for i := 0; i < n; i++ {
		if e[i] == 0 {
			e[i] = v
			return
		}
	}
	if !ov {
		// Inline full: move e[2:4] into a new chunk and reference it.
		c := t.newChunk()
		if c == 0 {
			return
		}
		ch := &t.ov[c]
		ch.e[0], ch.e[1], ch.e[2] = e[2], e[3], v
		setOvRef(e, c)
		t.ovKeys++
		return
	}
	r := ovRef(e)
	for c := r; c != 0; c = t.ov[c].next {
		ch := &t.ov[c]
		for i, w := range ch.e {
			if w == 0 {
				ch.e[i] = v
				return
			}
		}
	}
	c := t.newChunk()
	if c == 0 {
		return
	}
	t.ov[c].e[0] = v
	t.ov[c].next = r
	setOvRef(e, c)
}

// clearBits clears bits from the element of slot for key k, dropping empty
// elements and the key when nothing is left. It returns the bits before.
func (t *table) clearBits(k uint64, slot uint16, bits uint16) (before uint16) {
	e := t.elemsOf(k)
	if e == nil {
		return 0
	}
	p := t.elem(e, slot)
	if p == nil {
		return 0
	}
	v := *p
	*p = normalize(v &^ bits)
	if *p == 0 {
		t.shrink(k, e)
	}
	return v &^ slotMask
}

// shrink runs after an element of k emptied: it pulls chunk elements back
// inline when four or fewer remain, unlinks empty chunks, and deletes the
// key when it has no element left.
func (t *table) shrink(k uint64, e *[inlineN]uint16) {
	if isOv(e) {
		total := 0
		for i := 0; i < ovInline; i++ {
			if e[i] != 0 {
				total++
			}
		}
		for c := ovRef(e); c != 0; c = t.ov[c].next {
			for _, v := range t.ov[c].e {
				if v != 0 {
					total++
				}
			}
		}
		if total <= inlineN {
			var out [inlineN]uint16
			n := 0
			for i := 0; i < ovInline; i++ {
				if e[i] != 0 {
					out[n] = e[i]
					n++
				}
			}
			for c := ovRef(e); c != 0; c = t.ov[c].next {
				for _, v := range t.ov[c].e {
					if v != 0 {
						out[n] = v
						n++
					}
				}
			}
			t.freeChunks(e)
			*e = out
		} else {
			t.dropEmptyChunks(e)
		}
	}
	if e[0]|e[1]|e[2]|e[3] == 0 {
		t.delete(k)
	}
}

// dropEmptyChunks unlinks and frees the empty chunks of an overflowing key
// (at least one element remains in some chunk, since more than four remain).
func (t *table) dropEmptyChunks(e *[inlineN]uint16) {
	prev := uint32(0)
	for c := ovRef(e); c != 0; {
		next := t.ov[c].next
		if t.ov[c].e == [chunkN]uint16{} {
			if prev == 0 {
				setOvRef(e, next)
			} else {
				t.ov[prev].next = next
			}
			t.releaseChunk(c)
		} else {
			prev = c
		}
		c = next
	}
}

// freeChunks releases every chunk of e and clears its reference.
func (t *table) freeChunks(e *[inlineN]uint16) {
	if !isOv(e) {
		return
	}
	for c := ovRef(e); c != 0; {
		next := t.ov[c].next
		t.releaseChunk(c)
		c = next
	}
	e[2], e[3] = 0, 0
	t.ovKeys--
}

func (t *table) releaseChunk(c uint32) {
	t.ov[c] = chunk{next: t.ovFree}
	t.ovFree = c
}

// newChunk returns a zeroed chunk, growing the arena by doubling (copying
// into a new mapping); 0 when the arena is at maxChunks.
func (t *table) newChunk() uint32 {
	if c := t.ovFree; c != 0 {
		t.ovFree = t.ov[c].next
		t.ov[c] = chunk{}
		return c
	}
	if t.ovLen == 0 {
		t.ovLen = 1 // chunk 0 is the "no chunk" reference
	}
	if int(t.ovLen) >= maxChunks {
		return 0
	}
	if int(t.ovLen) >= len(t.ov) {
		n := min(max(64, 2*len(t.ov)), maxChunks)
		ov, mem := allocLarge[chunk](n)
		copy(ov, t.ov)
		t.ovMem.free()
		t.ov, t.ovMem = ov, mem
	}
	c := t.ovLen
	t.ovLen++
	return c
}
