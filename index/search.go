package index

import "unsafe"

// The default lookup is a search, not a scan. It rests on one property of
// the engines' caches: an engine that holds a chain's key i also holds keys
// 0..i-1, per tier. vLLM guarantees it on the GPU: a request frees its
// blocks tail first (vllm/v1/core/single_type_kv_cache_manager.py, "free
// blocks in reverse order so that the tail blocks are evicted first"), a
// shared parent is freed after its last child, and a hit touches the whole
// prefix from the root, so a child is always evicted before its parent.
// Speculative entries cover a routed request's whole chain, which keeps the
// property too.
//
// Under it, the set of (engine, level) pairs holding key i can only shrink
// as i grows, so when two keys of a chain have equal elements, every key
// between them has the same set: the whole span is a run, applied by its
// length without reading it. A lookup therefore reads a handful of keys per
// distinct depth in the result instead of every key: it probes spread-out
// keys in rounds (all of a round's cache misses in flight together), then
// splits every span whose ends differ, in parallel, until the differing
// ends are neighbours: transitions, applied key by key exactly as the scan
// does. A chain held by the same engines throughout costs one round of 8
// probes; a 256-key chain with a few distinct depths three or four rounds.
//
// Where the property does not hold (a lost event leaving a hole in a chain,
// an offload tier with its own eviction order), the search can report a
// depth beyond the hole; Config.ExactLookup selects the scan, which reads
// every key. TestSearchMatchesScan checks that both agree on prefix-closed
// states; a search gives up for the scan when a chain has so many distinct
// depths that reading it all is cheaper.

// searchFirst is how many keys the first round probes (the first, the last
// and keys evenly spread between); searchSplit how many a later round
// probes inside each span whose ends differ. A round costs about one memory
// latency plus its probes (~170 ns and ~20–50 ns each here, the probes'
// misses overlapping only partly), so 8 and 7 measured best among 4–16 and
// 5–35 (BenchmarkLookupDepths): a chain held alike to its end costs one
// round, each distinct depth in a 256-key chain about 12 more probes over
// three more rounds, shared by every depth.
const (
	searchFirst = 8
	searchSplit = 7
)

// probe is one key a search has read.
type probe struct {
	i uint32
	// next compares e with the next probe's elements: 0 not yet known,
	// sameNext or differsNext. Inserting probes after it resets it.
	next uint8
	e    *[inlineN]uint16 // nil: the key is absent
}

const (
	sameNext    = 1
	differsNext = 2
)

// searchBufs are a search's buffers, kept in the Result so lookups reuse
// them (a lookup allocates nothing once they have grown).
type searchBufs struct {
	probes, merged []probe
	pos, refs      []uint32
	addrs          []uintptr
}

// read probes keys at the ascending positions pos in one round: every home
// line is prefetched before any is resolved, so their misses overlap.
func (b *searchBufs) read(t *table, keys []uint64) []probe {
	if hasPrefetch && len(t.b) > 0 {
		base := uintptr(unsafe.Pointer(&t.b[0]))
		b.addrs = b.addrs[:0]
		for _, i := range b.pos {
			b.addrs = append(b.addrs, base+uintptr(homeOf(keys[i], t.shift))*unsafe.Sizeof(bucket{}))
		}
		prefetch(b.addrs)
	}
	// Merge the new probes (ascending) into the sorted ones.
	old := b.probes
	out := b.merged[:0]
	j := 0
	for _, i := range b.pos {
		for j < len(old) && old[j].i < i {
			out = append(out, old[j])
			j++
		}
		if len(out) > 0 {
			out[len(out)-1].next = 0 // its next probe changes
		}
		out = append(out, probe{i: i, e: find(t, keys[i])})
	}
	out = append(out, old[j:]...)
	b.probes, b.merged = out, old
	if hasPrefetch && t.ovKeys > 0 {
		b.prefetchChunks(t, out)
	}
	return out
}

// prefetchChunks prefetches the overflow chunks of the probes just read
// (those at b.pos), one chain level at a time for all of them, so comparing
// keys on many engines costs a memory latency per level, not per key.
func (b *searchBufs) prefetchChunks(t *table, ps []probe) {
	b.refs = b.refs[:0]
	j := 0
	for _, i := range b.pos {
		for ps[j].i != i {
			j++
		}
		if e := ps[j].e; e != nil && isOv(e) {
			b.refs = append(b.refs, ovRef(e))
		}
	}
	for len(b.refs) > 0 {
		b.addrs = b.addrs[:0]
		for _, c := range b.refs {
			b.addrs = append(b.addrs, uintptr(unsafe.Pointer(&t.ov[c])))
		}
		prefetch(b.addrs)
		n := 0
		for _, c := range b.refs {
			if c = t.ov[c].next; c != 0 {
				b.refs[n] = c
				n++
			}
		}
		b.refs = b.refs[:n]
	}
}

// find returns the elements of k (nil when absent), matching its home line
// branch-free like the scan.
func find(t *table, k uint64) *[inlineN]uint16 {
	if k == 0 {
		if t.zeroUsed {
			return &t.zeroElem
		}
		return nil
	}
	p := homeOf(k, t.shift)
	line := (*[lineN]bucket)(t.b[p : p+lineN])
	if e := inLine(line, k); e != nil || line[3].key == 0 {
		return e
	}
	return t.probeSpill(k, p)
}

// sameElems reports whether a and b hold the same elements in the same
// places (overflow chunks compared by content).
func sameElems(t *table, a, b *[inlineN]uint16) bool {
	if a == nil || b == nil {
		return false
	}
	if *a == *b {
		return true // an overflow reference names one key's chunks: equal only for one key
	}
	if !isOv(a) || !isOv(b) || a[0] != b[0] || a[1] != b[1] {
		return false
	}
	return sameChunks(t.ov, ovRef(a), ovRef(b))
}

// spread appends n positions evenly spread strictly between a and b.
func spread(pos []uint32, a, b uint32, n int) []uint32 {
	gap := b - a - 1
	if gap <= uint32(n) {
		for i := a + 1; i < b; i++ {
			pos = append(pos, i)
		}
		return pos
	}
	for m := 1; m <= n; m++ {
		pos = append(pos, a+uint32(uint64(gap+1)*uint64(m)/uint64(n+1)))
	}
	return pos
}

// applyRun advances the depths of e's engines that reached position i by r
// keys (the run's keys after its first, at i-1), as extending key by key
// would.
func applyRun(t *table, e *[inlineN]uint16, i, r uint32, res *Result) {
	w := uint64(e[0]) | uint64(e[1])<<16 | uint64(e[2])<<32 | uint64(e[3])<<48
	ov := isOv(e)
	if ov {
		w &= 1<<32 - 1
	}
	for ; w != 0; w >>= 16 {
		if v := uint16(w); v != 0 {
			advance(res, v, i, r)
		}
	}
	if ov {
		for c := ovRef(e); c != 0; c = t.ov[c].next {
			for _, v := range t.ov[c].e {
				if v != 0 {
					advance(res, v, i, r)
				}
			}
		}
	}
}

// searchLocked is the default lookup (see the top of this file). It reads
// at most budget keys, and reports false when it would need more, leaving
// res to be reset for the scan.
func (x *Index) searchLocked(keys []uint64, res *Result, budget int) bool {
	n := len(keys)
	if n == 0 {
		return true
	}
	t, b := x.t, &res.search
	b.probes, b.pos = b.probes[:0], b.pos[:0]
	if n <= searchFirst {
		for i := range n {
			b.pos = append(b.pos, uint32(i))
		}
	} else {
		b.pos = append(b.pos, 0)
		b.pos = spread(b.pos, 0, uint32(n-1), searchFirst-2)
		b.pos = append(b.pos, uint32(n-1))
	}
	budget -= len(b.pos)
	ps := b.read(t, keys)
	// Split every span whose ends differ until they are neighbours. Spans
	// past the first absent key do not matter: no engine holds beyond it.
	for round := 1; ; round++ {
		b.pos = b.pos[:0]
		spans := 0
		for j := 0; j+1 < len(ps) && ps[j].e != nil; j++ {
			lo, hi := &ps[j], &ps[j+1]
			if lo.next == 0 {
				lo.next = differsNext
				if sameElems(t, lo.e, hi.e) {
					lo.next = sameNext
				}
			}
			if lo.next == differsNext && hi.i-lo.i > 1 {
				b.pos = spread(b.pos, lo.i, hi.i, searchSplit)
				spans++
			}
		}
		if len(b.pos) == 0 {
			break
		}
		// A span narrowed from the first round's spacing costs about two
		// rounds of probes: give up at once when those would exceed the
		// budget, rather than after spending most of it.
		if round == 1 && spans*2*searchSplit > budget {
			return false
		}
		if budget -= len(b.pos); budget < 0 {
			return false
		}
		ps = b.read(t, keys)
	}
	// Apply: probes with equal elements bound a run, applied once by its
	// length; differing neighbours are a transition, applied key by key.
	if ps[0].e == nil || !x.extendKey(t, ps[0].e, 0, res) {
		return true
	}
	start := 0 // the current run's first probe
	for j := 0; j+1 < len(ps); j++ {
		if ps[j].next == sameNext {
			continue
		}
		if j > start {
			applyRun(t, ps[start].e, ps[start].i+1, ps[j].i-ps[start].i, res)
		}
		hi := ps[j+1]
		if hi.e == nil || !x.extendKey(t, hi.e, hi.i, res) {
			return true
		}
		start = j + 1
	}
	if last := len(ps) - 1; last > start {
		applyRun(t, ps[start].e, ps[start].i+1, ps[last].i-ps[start].i, res)
	}
	return true
}

// searchBudget is how many keys a search of an n-key chain may read before
// the scan, which reads each key once in a pipeline, is the cheaper way.
func searchBudget(n int) int {
	return max(4*searchFirst, n/4)
}
