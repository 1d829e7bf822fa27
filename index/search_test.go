package index

import (
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// searchOnly runs the search alone; ok is false when it gave up.
func searchOnly(x *Index, q []uint64, res *Result) bool {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.begin(res)
	return x.searchLocked(q, res, searchBudget(len(q)))
}

// scanOnly runs the exact scan.
func scanOnly(x *Index, q []uint64, res *Result) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	x.begin(res)
	x.scanLocked(q, res)
}

// heldLevels returns, per engine slot holding any key of q, its level mask
// at each position of q (bit 0 GPU … bit 3 speculative: the levels its
// element there extends), read key by key.
func heldLevels(x *Index, q []uint64) map[uint16][]uint8 {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := map[uint16][]uint8{}
	mark := func(i int, v uint16) {
		if v == 0 {
			return
		}
		s := v & slotMask
		if out[s] == nil {
			out[s] = make([]uint8, len(q))
		}
		out[s][i] = levels[v>>tierShift]
	}
	for i, k := range q {
		e := x.t.elemsOf(k)
		if e == nil {
			continue
		}
		n := inlineN
		if isOv(e) {
			n = ovInline
			for c := ovRef(e); c != 0; c = x.t.ov[c].next {
				for _, v := range x.t.ov[c].e {
					mark(i, v)
				}
			}
		}
		for _, v := range e[:n] {
			mark(i, v)
		}
	}
	return out
}

// checkSearch compares the search with the scan on q for every engine and
// level: equal where the engine's holdings at that level are a prefix of q
// (the property the search relies on), never shallower elsewhere. It
// returns how many (engine, level) pairs were prefix-closed.
func checkSearch(t *testing.T, x *Index, q []uint64) (closedPairs int) {
	t.Helper()
	var scan, found Result
	scanOnly(x, q, &scan)
	// The search with no budget, so it never gives up for the scan.
	x.mu.RLock()
	x.begin(&found)
	x.searchLocked(q, &found, 1<<30)
	x.mu.RUnlock()
	if len(found.Slots) != len(scan.Slots) {
		t.Fatalf("search matched %d engines, scan %d", len(found.Slots), len(scan.Slots))
	}
	held := heldLevels(x, q)
	for _, s := range scan.Slots {
		a, b := scan.Get(s), found.Get(s)
		sd := [4]int{a.GPU, a.CPU, a.Other, a.Spec}
		fd := [4]int{b.GPU, b.CPU, b.Other, b.Spec}
		for l := range 4 {
			closed := true
			for i := sd[l]; i < len(q); i++ {
				if held[s][i]&(1<<l) != 0 {
					closed = false // a hole before this key
					break
				}
			}
			if closed {
				closedPairs++
				if fd[l] != sd[l] {
					t.Fatalf("engine %s level %d (prefix-closed): search %d, scan %d (query of %d keys)", scan.Engine(s), l, fd[l], sd[l], len(q))
				}
			} else if fd[l] < sd[l] {
				t.Fatalf("engine %s level %d: search %d below scan %d", scan.Engine(s), l, fd[l], sd[l])
			}
		}
	}
	return closedPairs
}

// trie is a set of chains sharing prefixes, like the prompts of a cluster:
// chain j extends a prefix of an earlier chain.
type trie struct {
	chains [][]uint64
	// pos[k] lists (chain, position) of every occurrence of key k.
	pos map[uint64][][2]int
}

func newTrie(rng *rand.Rand, n, length int, fresh func(int) []uint64) *trie {
	tr := &trie{pos: map[uint64][][2]int{}}
	for j := 0; j < n; j++ {
		var c []uint64
		if j > 0 && rng.IntN(4) > 0 {
			parent := tr.chains[rng.IntN(j)]
			c = slices.Clone(parent[:rng.IntN(len(parent))])
		}
		c = append(c, fresh(length-len(c))...)
		tr.chains = append(tr.chains, c)
		for i, k := range c {
			tr.pos[k] = append(tr.pos[k], [2]int{j, i})
		}
	}
	return tr
}

// evict removes keys[at:] of chain c and, so engines keep holding
// prefixes, every key after them in any chain that shares them (as an
// engine evicting children before parents does).
func (tr *trie) evict(x *Index, engine string, tier kvevents.Tier, c, at int) {
	k := tr.chains[c][at]
	for _, p := range tr.pos[k] {
		x.Remove(engine, tier, tr.chains[p[0]][p[1]:])
	}
}

// TestSearchMatchesScan drives prefix-closed cluster states (chains sharing
// prefixes, engines storing prefixes and evicting tails, speculative
// prefixes, clears) over 72 engines, crowded home lines and key 0, and
// checks that the search equals the scan for every engine at every level.
func TestSearchMatchesScan(t *testing.T) {
	x := newIndex(t)
	rng := rand.New(rand.NewPCG(21, 22))
	fresh := func(n int) []uint64 { return collidingKeys(rng, n, 64) }
	tr := newTrie(rng, 12, 300, fresh)
	tr.chains[3][len(tr.chains[3])-1] = 0 // key 0 at a chain's end
	tr.pos[0] = [][2]int{{3, len(tr.chains[3]) - 1}}
	engines := make([]string, 72)
	for i := range engines {
		engines[i] = "engine-" + strconv.Itoa(i)
	}
	now := time.Unix(100, 0) // nothing expires
	closed, gaveUp, checks := 0, 0, 0
	var res Result
	for step := 0; step < 2000; step++ {
		ei := rng.IntN(8)
		if rng.IntN(4) == 0 {
			ei = rng.IntN(len(engines))
		}
		e := engines[ei]
		tier := kvevents.TierGPU
		if rng.IntN(3) == 0 {
			tier = kvevents.Tier(rng.IntN(3))
		}
		ci := rng.IntN(len(tr.chains))
		c := tr.chains[ci]
		switch r := rng.IntN(100); {
		case r < 45:
			x.Store(e, tier, c[:1+rng.IntN(len(c))])
		case r < 60:
			x.AddSpeculative(e, c[:1+rng.IntN(len(c))], now)
		case r < 98:
			tr.evict(x, e, tier, ci, rng.IntN(len(c)))
		default:
			x.ClearEngine(e)
		}
		if step%4 == 0 {
			q := tr.chains[rng.IntN(len(tr.chains))]
			q = q[:1+rng.IntN(len(q))]
			closed += checkSearch(t, x, q)
			checks++
			if !searchOnly(x, q, &res) {
				gaveUp++
			}
		}
	}
	if closed == 0 {
		t.Fatal("no engine matched: the test checks nothing")
	}
	if x.MemStats().OverflowKeys == 0 {
		t.Fatal("no key overflowed: the chunk comparison is not exercised")
	}
	t.Logf("%d checks, %d closed (engine, level) pairs, %d searches gave up for the scan", checks, closed, gaveUp)
}

// TestSearchReadsFewKeys checks the point of the search: a chain held by
// the same engines to its end is settled in one round, and a chain with a
// few distinct depths in a few rounds, not by reading every key.
func TestSearchReadsFewKeys(t *testing.T) {
	x := newIndex(t)
	keys := chain(9, 1024)
	x.Store("a", kvevents.TierGPU, keys)
	x.Store("b", kvevents.TierGPU, keys)
	count := func(q []uint64) int {
		var res Result
		x.begin(&res)
		x.searchLocked(q, &res, 1<<30)
		return len(res.search.probes)
	}
	if n := count(keys); n != searchFirst {
		t.Fatalf("whole chain on the same engines: read %d keys, want one round of %d", n, searchFirst)
	}
	x.Remove("b", kvevents.TierGPU, keys[700:])
	x.Store("c", kvevents.TierCPU, keys[:300])
	if n := count(keys); n > searchFirst+2*3*searchSplit {
		t.Fatalf("three distinct depths: read %d keys", n)
	}
	var res Result
	x.Lookup(keys, &res)
	for name, want := range map[string]Match{"a": {1024, 1024, 1024, 1024}, "b": {700, 700, 700, 700}, "c": {0, 300, 300, 300}} {
		sl, _ := x.Slot(name)
		if got := res.Get(sl); got != want {
			t.Fatalf("%s: %+v, want %+v", name, got, want)
		}
	}
}

// TestSearchGivesUp checks the fallback: a chain on 64 engines with 64
// distinct depths costs the search more than reading it, so it gives up
// and Lookup's answer is the scan's.
func TestSearchGivesUp(t *testing.T) {
	x := newIndex(t)
	keys := chain(10, 256)
	for e := 0; e < 64; e++ {
		x.Store(engineName(e), kvevents.TierGPU, keys[:4*(e+1)])
	}
	var res Result
	if searchOnly(x, keys, &res) {
		t.Fatal("the search did not give up on 64 distinct depths")
	}
	x.Lookup(keys, &res)
	for e := 0; e < 64; e++ {
		s, _ := x.Slot(engineName(e))
		if got := res.Get(s).GPU; got != 4*(e+1) {
			t.Fatalf("engine %d: depth %d, want %d", e, got, 4*(e+1))
		}
	}
}

// TestExactLookupReadsHoles checks Config.ExactLookup: with a hole in a
// chain (a lost removal), the exact lookup stops at it while the search may
// look past it, and never reports less.
func TestExactLookupReadsHoles(t *testing.T) {
	exact, err := New(Config{ExactLookup: true})
	if err != nil {
		t.Fatal(err)
	}
	fast := newIndex(t)
	keys := chain(11, 256)
	for _, x := range []*Index{exact, fast} {
		x.Store("a", kvevents.TierGPU, keys)
		x.Remove("a", kvevents.TierGPU, keys[100:101])
	}
	var res Result
	exact.Lookup(keys, &res)
	s, _ := exact.Slot("a")
	if got := res.Get(s).GPU; got != 100 {
		t.Fatalf("exact lookup: depth %d, want 100 (the hole)", got)
	}
	fast.Lookup(keys, &res)
	s, _ = fast.Slot("a")
	if got := res.Get(s).GPU; got < 100 {
		t.Fatalf("search: depth %d below the exact 100", got)
	}
}
