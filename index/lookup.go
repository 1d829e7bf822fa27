package index

import "unsafe"

// Match is one engine's matched prefix depth, in blocks, for a key chain.
// Depths are cumulative over tiers so they are monotone and easy to weigh:
// GPU counts leading keys held on GPU; CPU leading keys held on GPU or CPU;
// Other leading keys held in any confirmed tier; Spec leading keys held in any
// tier or speculatively. So GPU ≤ CPU ≤ Other ≤ Spec.
type Match struct {
	GPU, CPU, Other, Spec int
}

// Result is a caller-owned lookup result buffer, reused across lookups so a
// lookup allocates nothing. Not safe for concurrent use: one per goroutine
// (or pooled).
type Result struct {
	gen   uint32
	depth []slotDepth
	// Slots lists the engine slots that matched at least one block, in the
	// order first seen.
	Slots []uint16
	names []string // slot → engine id at lookup time (the index's slice; read-only)
	sink  uint64
	// search holds the search's buffers (search.go).
	search searchBufs
}

type slotDepth struct {
	gen uint32
	d   [4]uint32
}

// Get returns the match of engine slot s in the last lookup (zero when s did
// not match).
func (r *Result) Get(s uint16) Match {
	if int(s) >= len(r.depth) || r.depth[s].gen != r.gen {
		return Match{}
	}
	d := r.depth[s].d
	return Match{GPU: int(d[0]), CPU: int(d[1]), Other: int(d[2]), Spec: int(d[3])}
}

// Engine returns the id of slot s as of the last lookup.
func (r *Result) Engine(s uint16) string {
	if int(s) < len(r.names) {
		return r.names[s]
	}
	return ""
}

// Slot returns engine's slot and whether the index knows it. A slot is
// stable until ClearEngine releases it (another engine may get it then), so
// resolve slots under the same lookup, as LookupFor does.
func (x *Index) Slot(engine string) (uint16, bool) {
	x.mu.RLock()
	s, ok := x.slots[engine]
	x.mu.RUnlock()
	return s, ok
}

// levels maps an element's tier/spec bits (bits 12-15 shifted down) to a mask
// of the cumulative levels it extends: GPU→all four, CPU→CPU/Other/Spec, etc.
var levels = func() (l [16]uint8) {
	for b := 1; b < 16; b++ {
		switch {
		case b&1 != 0:
			l[b] = 0b1111
		case b&2 != 0:
			l[b] = 0b1110
		case b&4 != 0:
			l[b] = 0b1100
		default:
			l[b] = 0b1000
		}
	}
	return
}()

// Lookup computes every engine's matched prefix depth for keys (a request's
// chain keys, in order) into res. It stops at the first key no engine
// extends, and allocates nothing once res has grown to the engine count.
// By default it searches the chain rather than reading every key, which is
// exact when engines hold prefixes of chains (search.go); with
// Config.ExactLookup it reads every key.
func (x *Index) Lookup(keys []uint64, res *Result) {
	x.mu.RLock()
	x.lookupLocked(keys, res)
	x.mu.RUnlock()
}

// lookupBatch is how many keys a lookup stage handles at once. Over a large
// table every probe is a cache miss, and the keys' probes are independent,
// so the lookup is a three-stage pipeline over batches: hash batch b+2 and
// prefetch its home lines, resolve batch b+1's buckets (now cached) and
// prefetch their overflow chunks and spill lines, extend the depths with
// batch b (runs of keys with equal elements at once). The misses of a whole
// batch are in flight together, behind useful work, instead of being paid
// one at a time. Batches of 8–32 keys with a lead of 2–6 batches measured
// the same within noise; a short match wastes at most ~3 batches of
// prefetches.
const lookupBatch = 32

// lookupLead is how many batches ahead of its resolution a batch's buckets
// are prefetched.
const lookupLead = 2

// The spill masks hold one bit per key of a batch.
const _ = uint64(64 - lookupBatch)

// lookupState is one lookup's pipeline; it lives on the lookup's stack.
type lookupState struct {
	t     *table
	keys  []uint64
	limit int // keys[limit] is the first key found missing (len(keys) if none yet)
	pos   [lookupLead + 1][lookupBatch]uint64
	els   [2][lookupBatch]*[inlineN]uint16
	// spill marks the keys of a resolved batch whose home line was full
	// without them: their next line was prefetched and extendBatch probes
	// on from there, one stage later, when it has arrived.
	spill [2]uint64
	addrs [lookupBatch]uintptr
	sink  uint64
	// A run of keys whose elements are bitwise equal (a chain held by the
	// same engines in the same tiers: the common case) is applied once, by
	// its length. runW is the run's inline elements (0: no run), runRef its
	// first overflow chunk (0: none), runI the position of its first key,
	// run how many equal keys followed it.
	runW   uint64
	runRef uint32
	runI   uint32
	run    uint32
	// ovKeys marks the keys of a resolved batch that have overflow chunks.
	ovKeys [2]uint64
	chunks [lookupBatch]uint32
}

// flush applies the pending run: every depth that the run's first key
// extended at every level it reached grows by the run's length, exactly as
// extending key by key would have.
func (s *lookupState) flush(res *Result) {
	if s.run == 0 {
		return
	}
	r, i := s.run, s.runI+1
	for w := s.runW; w != 0; w >>= 16 {
		if v := uint16(w); v != 0 {
			advance(res, v, i, r)
		}
	}
	for c := s.runRef; c != 0; c = s.t.ov[c].next {
		for _, v := range s.t.ov[c].e {
			if v != 0 {
				advance(res, v, i, r)
			}
		}
	}
	s.run = 0
}

// advance grows by r the depths of v's engine that reached i.
func advance(res *Result, v uint16, i, r uint32) {
	d := &res.depth[v&slotMask]
	if d.gen != res.gen || d.d[3] != i {
		return
	}
	d.d[3] += r
	if l := levels[v>>tierShift]; l&4 != 0 && d.d[2] == i {
		d.d[2] += r
		if l&2 != 0 && d.d[1] == i {
			d.d[1] += r
			if l&1 != 0 && d.d[0] == i {
				d.d[0] += r
			}
		}
	}
}

// batch returns the index of batch b's first key and its keys; nil when
// the batch starts at or past the limit (the chain ended before it).
func (s *lookupState) batch(b int) (int, []uint64) {
	lo := b * lookupBatch
	if lo >= s.limit {
		return lo, nil
	}
	return lo, s.keys[lo:min(lo+lookupBatch, len(s.keys))]
}

// hash computes the home lines of batch b and prefetches them (without
// prefetch instructions, it touches them with plain loads).
func (s *lookupState) hash(b int) {
	_, batch := s.batch(b)
	if batch == nil {
		return
	}
	t := s.t
	if !hasPrefetch {
		pos := &s.pos[b%(lookupLead+1)]
		for j, k := range batch {
			p := homeOf(k, t.shift)
			pos[j] = p
			s.sink += t.b[p&t.mask].key
		}
		return
	}
	base := uintptr(0)
	if len(t.b) > 0 {
		base = uintptr(unsafe.Pointer(&t.b[0]))
	}
	const size = unsafe.Sizeof(bucket{})
	shift := t.shift
	pos, addrs := &s.pos[b%(lookupLead+1)], &s.addrs
	for j, k := range batch {
		p := homeOf(k, shift)
		pos[j] = p
		addrs[j] = base + uintptr(p)*size
	}
	prefetch(s.addrs[:len(batch)])
}

// resolve finds the buckets of batch b, lowering limit at the first missing
// key, and prefetches the first overflow chunk of keys that have one.
func (s *lookupState) resolve(b int) {
	lo, batch := s.batch(b)
	if batch == nil {
		return
	}
	t := s.t
	buckets, mask := t.b, t.mask
	pos, els := &s.pos[b%(lookupLead+1)], &s.els[b%2]
	spill, ovKeys := uint64(0), uint64(0)
	n := 0
	for j, k := range batch {
		var e *[inlineN]uint16
		if k == 0 {
			if t.zeroUsed {
				e = &t.zeroElem
			}
		} else {
			// Look in the home line without branching on where the key
			// sits in it (that branch mispredicts on most keys), then
			// probe on only in the rare case of a full line.
			p := pos[j]
			line := (*[lineN]bucket)(buckets[p : p+lineN])
			// inLine by hand: the compiler does not inline it, and the
			// call cost the scan ~10% (BenchmarkLookup256 …/scan).
			m0, m1, m2, m3 := isZero(line[0].key^k), isZero(line[1].key^k), isZero(line[2].key^k), isZero(line[3].key^k)
			if m0|m1|m2|m3 != 0 {
				e = &line[m1|m2<<1|m3*3].e // keys are unique: at most one m is 1
			} else if line[3].key != 0 {
				spill |= 1 << j
				s.addrs[n] = uintptr(unsafe.Pointer(&buckets[(p+lineN)&mask]))
				n++
				continue
			}
		}
		if e == nil {
			s.limit = lo + j
			break
		}
		els[j] = e
		if isOv(e) {
			ovKeys |= 1 << j
			if hasPrefetch {
				s.addrs[n] = uintptr(unsafe.Pointer(&t.ov[ovRef(e)]))
				n++
			} else {
				s.sink += uint64(t.ov[ovRef(e)].next)
			}
		}
	}
	s.spill[b%2], s.ovKeys[b%2] = spill, ovKeys
	if n > 0 {
		prefetch(s.addrs[:n])
	}
}

// isZero is 1 when x is 0, else 0, without a branch: comparing the home
// line's keys with branches mispredicts on most keys, each time discarding
// the speculative work (and loads) behind a cache miss.
func isZero(x uint64) uint64 {
	return ((x | -x) >> 63) ^ 1
}

// inLine returns the elements of k when it sits in line (nil otherwise),
// matching the line's four keys without a branch on where.
func inLine(line *[lineN]bucket, k uint64) *[inlineN]uint16 {
	m1, m2, m3 := isZero(line[1].key^k), isZero(line[2].key^k), isZero(line[3].key^k)
	if isZero(line[0].key^k)|m1|m2|m3 == 0 {
		return nil
	}
	return &line[m1|m2<<1|m3*3].e // keys are unique: at most one m is 1
}

// probeSpill finds k beyond its full home line p.
func (t *table) probeSpill(k, p uint64) *[inlineN]uint16 {
	for p := (p + lineN) & t.mask; ; p = (p + 1) & t.mask {
		if kk := t.b[p].key; kk == k {
			return &t.b[p].e
		} else if kk == 0 {
			return nil
		}
	}
}

func (x *Index) lookupLocked(keys []uint64, res *Result) {
	x.begin(res)
	if !x.cfg.ExactLookup {
		if x.searchLocked(keys, res, searchBudget(len(keys))) {
			return
		}
		x.begin(res) // gave up: the scan starts over
	}
	x.scanLocked(keys, res)
}

// begin resets res for a new lookup.
func (x *Index) begin(res *Result) {
	res.gen++
	if res.gen == 0 { // wrapped: invalidate every stamp
		for i := range res.depth {
			res.depth[i].gen = 0
		}
		res.gen = 1
	}
	if n := len(x.names); len(res.depth) < n {
		res.depth = append(res.depth, make([]slotDepth, n-len(res.depth))...)
	}
	res.names = x.names
	res.Slots = res.Slots[:0]
}

// scanLocked is the exact lookup: it reads every key up to the first that
// extends no engine (Config.ExactLookup, or a search that gave up).
func (x *Index) scanLocked(keys []uint64, res *Result) {
	s := lookupState{t: x.t, keys: keys, limit: len(keys)}
	nb := (len(keys) + lookupBatch - 1) / lookupBatch
	for b := 0; b < lookupLead && b < nb; b++ {
		s.hash(b)
	}
	s.resolve(0)
	for b := 0; b < nb; b++ {
		if b+lookupLead < nb {
			s.hash(b + lookupLead)
		}
		if b+1 < nb {
			s.resolve(b + 1)
		}
		if !x.extendBatch(&s, b, res) {
			break
		}
	}
	s.flush(res)
	res.sink = s.sink // keep the touch loads: an unused sum would be eliminated
}

// extendBatch extends the depths with the resolved keys of batch b and
// reports whether the lookup goes on (every key present and extending some
// engine's run).
func (x *Index) extendBatch(s *lookupState, b int, res *Result) bool {
	lo := b * lookupBatch
	hi := min(lo+lookupBatch, s.limit)
	els, spill := &s.els[b%2], s.spill[b%2]
	depth, gen := res.depth, res.gen
	if ov := s.ovKeys[b%2]; ov != 0 && hasPrefetch {
		s.prefetchChains(els, ov)
	}
	for j := 0; j < hi-lo; j++ {
		e := els[j]
		if spill&(1<<j) != 0 {
			if e = s.t.probeSpill(s.keys[lo+j], s.pos[b%(lookupLead+1)][j]); e == nil {
				s.limit = lo + j
				return false
			}
		}
		w := uint64(e[0]) | uint64(e[1])<<16 | uint64(e[2])<<32 | uint64(e[3])<<48
		i := uint32(lo + j)
		if isOv(e) {
			// Runs also cover keys with overflow chunks, compared by
			// content (each key has its own chunks).
			ref := ovRef(e)
			w &= 1<<32 - 1
			if s.runRef != 0 && w == s.runW && sameChunks(s.t.ov, ref, s.runRef) {
				s.run++
				continue
			}
			s.flush(res)
			s.runW, s.runRef = 0, 0
			if !x.extendKey(s.t, e, i, res) {
				return false
			}
			s.runW, s.runRef, s.runI = w, ref, i
			continue
		}
		if w == s.runW && s.runRef == 0 {
			s.run++
			continue
		}
		s.flush(res)
		s.runW, s.runRef = 0, 0
		extended := false
		for w := w; w != 0; w >>= 16 {
			v := uint16(w)
			if v == 0 {
				continue
			}
			d := &depth[v&slotMask]
			if d.gen != gen {
				if i != 0 {
					continue
				}
				d.gen = gen
				d.d = [4]uint32{}
				res.Slots = append(res.Slots, v&slotMask)
			}
			if d.d[3] != i {
				continue
			}
			extended = true
			if v&(1<<tierShift) != 0 && d.d[0] == i {
				// Fast path: a GPU element extending a run alive at every level.
				d.d = [4]uint32{i + 1, i + 1, i + 1, i + 1}
				continue
			}
			extendDepth(d, levels[v>>tierShift], i)
		}
		if !extended {
			return false
		}
		s.runW, s.runI = w, i
	}
	return hi == lo+lookupBatch
}

// sameChunks reports whether chunk chains a and b hold the same elements
// in the same places.
func sameChunks(ov []chunk, a, b uint32) bool {
	for a != 0 && b != 0 {
		if ov[a].e != ov[b].e {
			return false
		}
		a, b = ov[a].next, ov[b].next
	}
	return a == b
}

// prefetchChains prefetches the second and later overflow chunks of the
// batch's keys marked in ov, one chain level at a time for all keys
// together: a key on dozens of engines then costs one memory latency per
// level per batch, not per key.
func (s *lookupState) prefetchChains(els *[lookupBatch]*[inlineN]uint16, ov uint64) {
	cur := &s.chunks
	for j := range lookupBatch {
		if ov&(1<<j) != 0 {
			cur[j] = ovRef(els[j])
		}
	}
	for ov != 0 {
		n := 0
		for j := range lookupBatch {
			if ov&(1<<j) == 0 {
				continue
			}
			if c := s.t.ov[cur[j]].next; c != 0 {
				cur[j] = c
				s.addrs[n] = uintptr(unsafe.Pointer(&s.t.ov[c]))
				n++
			} else {
				ov &^= 1 << j
			}
		}
		prefetch(s.addrs[:n])
	}
}

// extendKey applies the elements e of the key at position i to the depths
// and reports whether any engine's run reached it.
func (x *Index) extendKey(t *table, e *[inlineN]uint16, i uint32, res *Result) bool {
	// The inline elements as one word; an overflow reference in e[2:4] is
	// masked out and its chunks walked below.
	w := uint64(e[0]) | uint64(e[1])<<16 | uint64(e[2])<<32 | uint64(e[3])<<48
	ov := isOv(e)
	if ov {
		w &= 1<<32 - 1
	}
	extended := false
	for ; w != 0; w >>= 16 {
		if v := uint16(w); v != 0 && res.visit(v, i) {
			extended = true
		}
	}
	if ov {
		for c := ovRef(e); c != 0; c = t.ov[c].next {
			ch := &t.ov[c]
			for _, v := range ch.e {
				if v != 0 && res.visit(v, i) {
					extended = true
				}
			}
		}
	}
	return extended
}

// visit applies element v at position i; it reports whether v's engine run
// reached i. An engine is only recorded at position 0: a run must start at
// the first key.
func (r *Result) visit(v uint16, i uint32) bool {
	s := v & slotMask
	d := &r.depth[s]
	if d.gen != r.gen {
		if i != 0 {
			return false
		}
		d.gen = r.gen
		d.d = [4]uint32{}
		r.Slots = append(r.Slots, s)
	}
	return extendDepth(d, levels[v>>tierShift], i)
}

// extendDepth extends the cumulative depths selected by level mask l that
// reached position i; it reports whether the most inclusive depth did.
func extendDepth(d *slotDepth, l uint8, i uint32) bool {
	if d.d[3] != i {
		return false // every level is at most the speculative depth
	}
	d.d[3] = i + 1
	if l&4 != 0 && d.d[2] == i {
		d.d[2] = i + 1
		if l&2 != 0 && d.d[1] == i {
			d.d[1] = i + 1
			if l&1 != 0 && d.d[0] == i {
				d.d[0] = i + 1
			}
		}
	}
	return true
}

// LookupFor is Lookup for a given list of engines: out[i] receives the
// match of engines[i] (zero when the index does not know it). One read
// lock covers the slot resolution and the lookup. len(out) must be at least
// len(engines).
func (x *Index) LookupFor(keys []uint64, engines []string, res *Result, out []Match) {
	x.mu.RLock()
	x.lookupLocked(keys, res)
	for i, e := range engines {
		if s, ok := x.slots[e]; ok {
			out[i] = res.Get(s)
		} else {
			out[i] = Match{}
		}
	}
	x.mu.RUnlock()
}
