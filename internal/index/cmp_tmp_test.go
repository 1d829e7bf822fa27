package index

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/index/oldidx"
	"github.com/kvmesh/kvmesh/kvevents"
)

// TEMPORARY side-by-side comparison with the previous implementation:
// interleaved rounds, thread CPU time per lookup.
func BenchmarkCompare(b *testing.B) {
	for _, repl := range []int{0, 1, 2, 4, 8, 16, 64} {
		nch := 4096
		if repl == 0 { // cached: 256 chains = 64k keys
			nch = 256
		}
		rng := rand.New(rand.NewPCG(1, 1))
		x, _ := New(Config{InitialKeys: 1 << 20})
		o, _ := oldidx.New(oldidx.Config{InitialKeys: 1 << 20})
		chains := make([][]uint64, 4096)
		for i := range chains {
			chains[i] = chain(uint64(i%nch)+1, 256)
			for r := 0; r < max(repl, 1) && i < nch; r++ {
				e := engineName(rng.IntN(64))
				if repl == 64 {
					e = engineName(r)
				}
				x.Store(e, kvevents.TierGPU, chains[i])
				o.Store(e, kvevents.TierGPU, chains[i])
			}
		}
		b.Run(fmt.Sprintf("epk=%d", repl), func(b *testing.B) {
			var ro oldidx.Result
			var rn Result
			bo, bn := time.Duration(1<<62), time.Duration(1<<62)
			i := 0
			for b.Loop() {
				w0 := time.Now()
				for r := 0; r < 100; r++ {
					o.Lookup(chains[i&4095], &ro)
					i += 977
				}
				w1 := time.Now()
				for r := 0; r < 100; r++ {
					x.Lookup(chains[i&4095], &rn)
					i += 977
				}
				w2 := time.Now()
				bo = min(bo, w1.Sub(w0))
				bn = min(bn, w2.Sub(w1))
			}
			b.ReportMetric(float64(bo)/100, "old-best-ns/lookup")
			b.ReportMetric(float64(bn)/100, "new-best-ns/lookup")
		})
	}
}
