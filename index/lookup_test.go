package index

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// specModel extends model with speculative entries, with the index's rules:
// a speculative entry is added only for a (key, engine) pair with no entry,
// and any Store or Remove of the pair drops it.
type specModel struct {
	model
	spec map[string]map[uint64]bool
}

func (m *specModel) has(e string, k uint64) bool {
	for _, keys := range m.held[e] {
		if keys[k] {
			return true
		}
	}
	return false
}

func (m *specModel) match(e string, keys []uint64) Match {
	want := m.model.match(e, keys)
	want.Spec = len(keys)
	for i, k := range keys {
		if !m.has(e, k) && !m.spec[e][k] {
			want.Spec = i
			break
		}
	}
	return want
}

// collidingKeys returns n distinct non-zero keys whose home lines (in a
// table of minBuckets buckets) are among `lines` lines, so home lines fill
// up and probes spill into the following lines.
func collidingKeys(rng *rand.Rand, n, lines int) []uint64 {
	shift := uint8(64)
	for m := minBuckets; m > 1; m >>= 1 {
		shift--
	}
	seen := map[uint64]bool{}
	out := make([]uint64, 0, n)
	for len(out) < n {
		k := rng.Uint64()
		if k == 0 || seen[k] || homeOf(k, shift)/lineN >= uint64(lines) {
			continue
		}
		seen[k] = true
		out = append(out, k)
	}
	return out
}

// TestLookupPipelineAgainstModel drives the batched lookup through every
// path the small model test does not reach: chains longer than several
// batches that share prefixes (runs of equal elements broken and resumed),
// home lines full enough to spill, keys on more engines than fit inline and
// in one overflow chunk, mixed tiers, speculative entries and key 0.
func TestLookupPipelineAgainstModel(t *testing.T) {
	x := newExactIndex(t)
	m := &specModel{model: model{held: map[string]map[kvevents.Tier]map[uint64]bool{}}, spec: map[string]map[uint64]bool{}}
	rng := rand.New(rand.NewPCG(7, 11))
	engines := make([]string, 72) // > 2 inline + 2 chunks on one key
	for i := range engines {
		engines[i] = "engine-" + strconv.Itoa(i)
	}
	// 3 chains of 150 keys: a shared 40-key prefix, most keys crammed into
	// 24 home lines, key 0 in the middle of one chain.
	prefix := collidingKeys(rng, 40, 24)
	chains := make([][]uint64, 3)
	for i := range chains {
		rest := collidingKeys(rng, 110, 24+40*i)
		chains[i] = append(slices.Clone(prefix), rest...)
	}
	chains[2][90] = 0
	now := time.Unix(100, 0) // fixed: nothing expires
	var res Result
	check := func(step int, q []uint64) {
		t.Helper()
		matched := lookupAgainst(t, x, m, engines, q, &res, fmt.Sprintf("step %d query len %d", step, len(q)))
		if len(res.Slots) != matched {
			t.Fatalf("step %d: %d slots reported, %d engines matched", step, len(res.Slots), matched)
		}
	}
	for step := 0; step < 3500; step++ {
		// Few engines do most of the work so runs form; the rest pile
		// onto the shared prefix.
		ei := rng.IntN(6)
		if rng.IntN(4) == 0 {
			ei = rng.IntN(len(engines))
		}
		e := engines[ei]
		tier := kvevents.Tier(rng.IntN(3))
		if rng.IntN(3) > 0 {
			tier = kvevents.TierGPU
		}
		c := chains[rng.IntN(len(chains))]
		lo := 0
		if rng.IntN(3) == 0 {
			lo = rng.IntN(len(c))
		}
		hi := lo + rng.IntN(len(c)-lo) + 1
		keys := c[lo:hi]
		switch r := rng.IntN(100); {
		case r < 50:
			x.Store(e, tier, keys)
			m.store(e, tier, keys)
			for _, k := range keys {
				delete(m.spec[e], k)
			}
		case r < 62:
			x.AddSpeculative(e, keys, now)
			if m.spec[e] == nil {
				m.spec[e] = map[uint64]bool{}
			}
			for _, k := range keys {
				if !m.has(e, k) {
					m.spec[e][k] = true
				}
			}
		case r < 98:
			// Remove a short range: it breaks runs in the middle of chains.
			keys = keys[:min(len(keys), 1+rng.IntN(8))]
			x.Remove(e, tier, keys)
			m.remove(e, tier, keys)
			for _, k := range keys {
				delete(m.spec[e], k)
			}
		default:
			x.ClearEngine(e)
			delete(m.held, e)
			delete(m.spec, e)
		}
		if step%3 == 0 {
			q := chains[rng.IntN(len(chains))]
			check(step, q)
			check(step, q[:rng.IntN(len(q)+1)])
		}
	}
	if x.MemStats().OverflowKeys == 0 {
		t.Fatal("no key overflowed: the test does not reach the chunk path")
	}
	clearAll(t, x, engines)
}

// TestSpillsHappen checks that collidingKeys really fills home lines (so the
// pipeline test exercises the spill path) and that every key is found.
func TestSpillsHappen(t *testing.T) {
	x := newIndex(t)
	keys := collidingKeys(rand.New(rand.NewPCG(3, 4)), 300, 40)
	x.Store("a", kvevents.TierGPU, keys)
	spilled := 0
	for _, k := range keys {
		i := x.t.find(k)
		if i < 0 {
			t.Fatalf("key %x not found", k)
		}
		if uint64(i)&^(lineN-1) != x.t.home(k) {
			spilled++
		}
	}
	if spilled == 0 {
		t.Fatal("no key outside its home line")
	}
	var res Result
	x.Lookup(keys, &res)
	s, _ := x.Slot("a")
	if got := res.Get(s); got != (Match{300, 300, 300, 300}) {
		t.Fatalf("match %+v, want 300 at every level", got)
	}
}

// TestOverflowChunksReused checks that chunks freed when keys shrink back
// inline are reused rather than growing the arena.
func TestOverflowChunksReused(t *testing.T) {
	x := newIndex(t)
	keys := chain(5, 500)
	for round := 0; round < 5; round++ {
		for e := 0; e < 40; e++ {
			x.Store(engineName(e), kvevents.TierCPU, keys)
		}
		ms := x.MemStats()
		if ms.OverflowKeys != len(keys) || ms.Entries != 40*len(keys) {
			t.Fatalf("round %d: %+v", round, ms)
		}
		for e := 0; e < 40; e++ {
			x.Remove(engineName(e), kvevents.TierCPU, keys)
		}
		if ms := x.MemStats(); ms.Keys != 0 || ms.OverflowKeys != 0 {
			t.Fatalf("round %d after removal: %+v", round, ms)
		}
	}
	// 500 keys × 2 chunks (38 overflow elements), plus the unused chunk 0,
	// rounded up to the arena's doubling.
	if got := len(x.t.ov); got > 2048 {
		t.Fatalf("arena grew to %d chunks: freed chunks are not reused", got)
	}
}

// TestGrowUnderReaders grows the table (and the overflow arena) past the
// size at which they move into huge-page mappings while readers look up,
// so an old mapping released during growth while a reader still used it
// would fault. Readers check that what they see is a consistent prefix.
func TestGrowUnderReaders(t *testing.T) {
	x := newIndex(t)
	const chains, length = 1200, 256 // 307k keys: a 8 MiB table
	all := make([][]uint64, chains)
	for i := range all {
		all[i] = chain(uint64(i)+100, length)
	}
	stop := make(chan struct{})
	errs := make(chan error, 2)
	for r := 0; r < 2; r++ {
		go func(r int) {
			var res Result
			for i := 0; ; i++ {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				x.Lookup(all[(i*7+r)%chains], &res)
				for _, s := range res.Slots {
					if m := res.Get(s); m.GPU != 0 && m.GPU != length {
						errs <- fmt.Errorf("reader %d: partial chain %+v", r, m)
						return
					}
				}
			}
		}(r)
	}
	for i, c := range all {
		x.Store(engineName(i%8), kvevents.TierGPU, c)
		if i%100 == 0 { // a few keys on many engines: the arena grows too
			for e := 8; e < 20; e++ {
				x.Store(engineName(e), kvevents.TierGPU, c)
			}
		}
	}
	close(stop)
	for r := 0; r < 2; r++ {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	var res Result
	x.Lookup(all[100], &res)
	for e := 8; e < 20; e++ {
		s, _ := x.Slot(engineName(e))
		if got := res.Get(s).GPU; got != length {
			t.Fatalf("engine %d depth %d", e, got)
		}
	}
	if ms := x.MemStats(); ms.Keys != chains*length || ms.OverflowKeys != 12*length {
		t.Fatalf("mem stats %+v", ms)
	}
}
