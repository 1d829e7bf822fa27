package index

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

func BenchmarkProbeTmp(b *testing.B) {
	x, _ := New(Config{InitialKeys: 1 << 20})
	chains := make([][]uint64, 4096)
	for i := range chains {
		chains[i] = chain(uint64(i)+1, 256)
		x.Store(engineName(i%64), kvevents.TierGPU, chains[i])
	}
	t := x.t
	b.Run("touch", func(b *testing.B) {
		var s uint64
		i := 0
		for b.Loop() {
			for _, k := range chains[i&4095] {
				s += t.b[(k*fibMul)>>t.shift].key
			}
			i += 977
		}
		sinkT = s
	})
	b.Run("hash-only", func(b *testing.B) {
		i := 0
		for b.Loop() {
			s := lookupState{t: x.t, keys: chains[i&4095], limit: 256}
			for bb := 0; bb < 8; bb++ {
				s.hash(bb)
			}
			i += 977
		}
	})
	b.Run("hash-resolve", func(b *testing.B) {
		i := 0
		for b.Loop() {
			s := lookupState{t: x.t, keys: chains[i&4095], limit: 256}
			s.hash(0)
			s.hash(1)
			for bb := 0; bb < 8; bb++ {
				if bb+2 < 8 {
					s.hash(bb + 2)
				}
				s.resolve(bb)
			}
			i += 977
		}
	})
	b.Run("hashall-resolveall", func(b *testing.B) {
		i := 0
		for b.Loop() {
			s := lookupState{t: x.t, keys: chains[i&4095], limit: 256}
			for bb := 0; bb < 8; bb++ {
				s.hash(bb)
				sinkT += s.pos[bb%3][0]
			}
			i += 977
		}
	})
	b.Run("lookup", func(b *testing.B) {
		var res Result
		i := 0
		for b.Loop() {
			x.Lookup(chains[i&4095], &res)
			i += 977
		}
	})
	b.Run("lookup-same", func(b *testing.B) {
		var res Result
		for b.Loop() {
			x.Lookup(chains[5], &res)
		}
	})
}

var sinkT uint64
