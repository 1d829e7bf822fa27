package oldidx

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

// Slot returns engine's slot and whether the index knows it. Slots are stable
// for the life of the Index, so callers may cache them.
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
func (x *Index) Lookup(keys []uint64, res *Result) {
	x.mu.RLock()
	x.lookupLocked(keys, res)
	x.mu.RUnlock()
}

func (x *Index) lookupLocked(keys []uint64, res *Result) {
	t := x.t
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

	// Touch every home bucket first: the loads are independent, so the CPU
	// overlaps their cache misses instead of paying them one at a time in
	// the dependent loop below.
	var sink uint64
	for _, k := range keys {
		sink += t.b[t.home(k)].key
	}
	res.sink = sink // keep the loads: an unused sum would be eliminated

	gen := res.gen
	depth := res.depth
	buckets, mask := t.b, t.mask
	for i, k := range keys {
		var e *[inlineN]uint16
		if k == 0 {
			if !t.zeroUsed {
				break
			}
			e = &t.zeroElem
		} else {
			for p := t.home(k); ; p = (p + 1) & mask {
				if kk := buckets[p].key; kk == k {
					e = &buckets[p].e
					break
				} else if kk == 0 {
					break
				}
			}
			if e == nil {
				break
			}
		}
		i32 := uint32(i)
		extended := false
		n := inlineN
		if e[inlineN-1] == overflowMark {
			n = inlineN - 1
		}
		for j := 0; j < n; j++ {
			v := e[j]
			b := v >> tierShift
			if b == 0 {
				continue
			}
			d := &depth[v&slotMask]
			if d.gen != gen {
				if i32 != 0 {
					continue
				}
				d.gen = gen
				d.d = [4]uint32{}
				res.Slots = append(res.Slots, v&slotMask)
			}
			if extendDepth(d, levels[b], i32) {
				extended = true
			}
		}
		if n < inlineN {
			for _, v := range t.overflow[k] {
				d := &depth[v&slotMask]
				if d.gen != gen {
					if i32 != 0 {
						continue
					}
					d.gen = gen
					d.d = [4]uint32{}
					res.Slots = append(res.Slots, v&slotMask)
				}
				if extendDepth(d, levels[v>>tierShift], i32) {
					extended = true
				}
			}
		}
		if !extended {
			break
		}
	}
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
