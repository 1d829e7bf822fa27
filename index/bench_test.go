package index

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// benchIndex holds 1M distinct keys as 4,096 chains of 256 blocks, each
// chain stored on `repl` of 64 engines (a prefix lives on a few engines when
// routing is cache-aware).
func benchIndex(b *testing.B, repl int) (*Index, [][]uint64) {
	b.Helper()
	x, err := New(Config{InitialKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	rng := rand.New(rand.NewPCG(1, 1))
	chains := make([][]uint64, 4096)
	for i := range chains {
		chains[i] = chain(uint64(i)+1, 256)
		if repl >= 64 {
			for e := 0; e < 64; e++ {
				x.Store(engineName(e), kvevents.TierGPU, chains[i])
			}
			continue
		}
		for r := 0; r < repl; r++ {
			x.Store(engineName(rng.IntN(64)), kvevents.TierGPU, chains[i])
		}
	}
	return x, chains
}

// BenchmarkLookupPartial is a lookup whose chain is cached only up to a
// point (128 of 256 keys on each engine): the pipeline's prefetches past the
// end of the match are wasted work.
func BenchmarkLookupPartial(b *testing.B) {
	x, err := New(Config{InitialKeys: 1 << 20})
	if err != nil {
		b.Fatal(err)
	}
	chains := make([][]uint64, 4096)
	for i := range chains {
		chains[i] = chain(uint64(i)+1, 256)
		x.Store(engineName(i%64), kvevents.TierGPU, chains[i][:128])
	}
	lookups(b, x, chains)
}

// lookups times Lookup over chains, striding through them so consecutive
// lookups touch unrelated parts of the table.
func lookups(b *testing.B, x *Index, chains [][]uint64) {
	var res Result
	b.ReportAllocs()
	b.ResetTimer()
	i := 0
	for b.Loop() {
		x.Lookup(chains[i%len(chains)], &res)
		i += 977
	}
}

// BenchmarkLookup256 is the target: a 256-block lookup over 1M keys
// and 64 engines (≤ 2 µs, 0 allocs). Beyond 4 engines per key the elements
// spill into overflow chunks; 64 is every engine holding every key. "search"
// is the default lookup, "scan" the exact one (Config.ExactLookup) over the
// same table, side by side.
func BenchmarkLookup256(b *testing.B) {
	for _, repl := range []int{1, 2, 4, 8, 16, 64} {
		x, chains := benchIndex(b, repl)
		benchModes(b, fmt.Sprintf("engines-per-key=%d", repl), x, chains)
	}
}

// benchModes runs the default lookup ("search") and the exact one ("scan")
// over the same table and 4,096 chains, side by side.
func benchModes(b *testing.B, name string, x *Index, chains [][]uint64) {
	for _, mode := range []string{"search", "scan"} {
		b.Run(name+"/"+mode, func(b *testing.B) {
			x.cfg.ExactLookup = mode == "scan"
			lookups(b, x, chains)
		})
	}
	x.cfg.ExactLookup = false
}

// BenchmarkLookupDepths is the search's cost model: 1M keys, each 256-key
// chain held by `depths` engines to distinct depths (256, then evenly
// shorter), so a lookup has that many run ends to find. The search gives
// up for the scan when a chain has too many.
func BenchmarkLookupDepths(b *testing.B) {
	for _, depths := range []int{1, 2, 3, 4, 8} {
		x, err := New(Config{InitialKeys: 1 << 20})
		if err != nil {
			b.Fatal(err)
		}
		rng := rand.New(rand.NewPCG(2, 2))
		chains := make([][]uint64, 4096)
		for i := range chains {
			chains[i] = chain(uint64(i)+1, 256)
			for d := 0; d < depths; d++ {
				x.Store(engineName(rng.IntN(64)), kvevents.TierGPU, chains[i][:256-d*256/depths])
			}
		}
		benchModes(b, fmt.Sprintf("depths=%d", depths), x, chains)
	}
}

// BenchmarkLookupFloor is the memory floor under BenchmarkLookup256: the
// same 256 home-line loads per lookup over the same 1M-key table, issued
// back to back with no other work. A lookup cannot beat it.
func BenchmarkLookupFloor(b *testing.B) {
	x, chains := benchIndex(b, 1)
	t := x.t
	b.ReportAllocs()
	b.ResetTimer()
	var sink uint64
	i := 0
	for b.Loop() {
		for _, k := range chains[i&4095] {
			sink += t.b[t.home(k)].key
		}
		i += 977
	}
	if sink == 1 {
		b.Log(sink) // keep the loads
	}
}

// BenchmarkLookup256Cached is the same lookup over a table that fits in
// cache (64k keys): the compute cost without DRAM misses.
func BenchmarkLookup256Cached(b *testing.B) {
	x, _ := New(Config{})
	chains := make([][]uint64, 256)
	for i := range chains {
		chains[i] = chain(uint64(i)+1, 256)
		x.Store(engineName(i%64), kvevents.TierGPU, chains[i])
	}
	lookups(b, x, chains)
}

// BenchmarkLookupParallel measures readers contending on the read lock.
func BenchmarkLookupParallel(b *testing.B) {
	x, chains := benchIndex(b, 2)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		var res Result
		i := rand.IntN(4096)
		for pb.Next() {
			x.Lookup(chains[i&4095], &res)
			i += 977
		}
	})
}

// BenchmarkStore reports ingest in keys/s (target ≥ 2M keys/s per core).
func BenchmarkStore(b *testing.B) {
	chains := make([][]uint64, 1024)
	for i := range chains {
		chains[i] = chain(uint64(i)+7, 256)
	}
	x, _ := New(Config{InitialKeys: 1 << 20})
	names := make([]string, 64)
	for i := range names {
		names[i] = engineName(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		c := chains[n&1023]
		e := names[n%64]
		x.Store(e, kvevents.TierGPU, c)
		n++
		if n%4096 == 0 { // keep the table from growing forever
			b.StopTimer()
			for _, name := range names {
				x.ClearEngine(name)
			}
			b.StartTimer()
		}
	}
	b.ReportMetric(float64(n*256)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkStoreRemove is steady-state churn: store a chain, remove an old one.
func BenchmarkStoreRemove(b *testing.B) {
	x, chains := benchIndex(b, 1)
	names := make([]string, 64)
	for i := range names {
		names[i] = engineName(i)
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		e := names[n%64]
		x.Remove(e, kvevents.TierGPU, chains[n&4095])
		x.Store(e, kvevents.TierGPU, chains[n&4095])
		n++
	}
	b.ReportMetric(float64(n*512)/b.Elapsed().Seconds(), "keys/s")
}

// BenchmarkSpeculative is the per-request speculative insert.
func BenchmarkSpeculative(b *testing.B) {
	x, chains := benchIndex(b, 1)
	names := make([]string, 64)
	for i := range names {
		names[i] = engineName(i)
	}
	now := time.Unix(0, 0)
	// Warm the speculative queue to its steady-state size (TTL 2 s at one
	// request per ms) so the measurement excludes its one-time growth.
	for i := 0; i < 4096; i++ {
		now = now.Add(time.Millisecond)
		x.AddSpeculative(names[i%64], chains[i&4095], now)
	}
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	for b.Loop() {
		now = now.Add(time.Millisecond)
		x.AddSpeculative(names[n%64], chains[n&4095], now)
		n++
	}
}

// TestMemoryPerEntry reports bytes per (key, engine) pair at 1M keys on
// one, two and eight engines (the last in overflow chunks), and checks the
// ≤ 40 B target. Arrays in huge-page mappings (mem_linux.go) are outside the
// Go heap, so the measured figure adds them to the heap delta.
func TestMemoryPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~30 MB")
	}
	for _, repl := range []int{1, 2, 8} {
		x, _ := New(Config{})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		for i := 0; i < 4096; i++ {
			c := chain(uint64(i)+1, 256)
			for r := 0; r < repl; r++ {
				x.Store(engineName((i+r*17)%64), kvevents.TierGPU, c)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		ms := x.MemStats()
		mapped := x.t.mem.mappedBytes() + x.t.ovMem.mappedBytes()
		heap := float64(int64(after.HeapAlloc)-int64(before.HeapAlloc)+int64(mapped)) / float64(ms.Entries)
		t.Logf("engines/key=%d: %d keys, %d entries, table %.1f B/entry, heap + mapped %.1f B/entry",
			repl, ms.Keys, ms.Entries, ms.BytesPerEntry, heap)
		if ms.Keys != 4096*256 || ms.Entries != repl*4096*256 {
			t.Fatalf("counts %+v", ms)
		}
		if ms.BytesPerEntry > 40 {
			t.Fatalf("%.1f bytes per entry > 40", ms.BytesPerEntry)
		}
		runtime.KeepAlive(x)
	}
}
