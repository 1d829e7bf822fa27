package tokenizer

import (
	"container/heap"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// refMergeLarge is mergeLarge as it was with container/heap: the reference
// the typed heap must agree with id for id.
func refMergeLarge(m *bpe, syms []uint32) []uint32 {
	n := len(syms)
	if n == 0 {
		return syms
	}
	prev, next := make([]int32, n), make([]int32, n)
	for i := range n {
		prev[i], next[i] = int32(i-1), int32(i+1)
	}
	next[n-1] = -1
	h := &refHeap{}
	for i := 0; i+1 < n; i++ {
		if r, _ := m.rank(syms[i], syms[i+1]); r != noRank {
			*h = append(*h, refItem{r, int32(i)})
		}
	}
	heap.Init(h)
	for h.Len() > 0 {
		it := heap.Pop(h).(refItem)
		i := it.pos
		j := next[i]
		if prev[i] == -2 || j < 0 {
			continue
		}
		r, id := m.rank(syms[i], syms[j])
		if r != it.rank {
			continue
		}
		syms[i] = id
		prev[j] = -2
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if r, _ := m.rank(syms[p], syms[i]); r != noRank {
				heap.Push(h, refItem{r, p})
			}
		}
		if k := next[i]; k >= 0 {
			if r, _ := m.rank(syms[i], syms[k]); r != noRank {
				heap.Push(h, refItem{r, i})
			}
		}
	}
	var out []uint32
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	return out
}

type refItem struct {
	rank uint32
	pos  int32
}

type refHeap []refItem

func (h refHeap) Len() int { return len(h) }
func (h refHeap) Less(i, j int) bool {
	return h[i].rank < h[j].rank || h[i].rank == h[j].rank && h[i].pos < h[j].pos
}
func (h refHeap) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *refHeap) Push(x any)   { *h = append(*h, x.(refItem)) }
func (h *refHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// randomBPE is a BPE over ids 0..alpha-1 with merges of random pairs in a
// random rank order: ranks need not follow the order merged tokens appear
// in (real files do), so a merge can make a pair of lower rank than itself.
func randomBPE(rng *rand.Rand, alpha int) *bpe {
	m := &bpe{merges: map[uint64]uint64{}}
	tokens := alpha
	nMerges := 1 + rng.IntN(4*alpha)
	ranks := rng.Perm(nMerges)
	for k := range nMerges {
		a, b := uint32(rng.IntN(tokens)), uint32(rng.IntN(tokens))
		key := uint64(a)<<32 | uint64(b)
		if _, dup := m.merges[key]; dup {
			continue
		}
		m.merges[key] = uint64(ranks[k])<<32 | uint64(tokens)
		tokens++
	}
	return m
}

// randomSyms is a word of n symbols: random, a run of one symbol, or runs
// of a few symbols back to back.
func randomSyms(rng *rand.Rand, n, alpha int) []uint32 {
	s := make([]uint32, n)
	switch rng.IntN(3) {
	case 0:
		for i := range s {
			s[i] = uint32(rng.IntN(alpha))
		}
	case 1:
		c := uint32(rng.IntN(alpha))
		for i := range s {
			s[i] = c
		}
	default:
		for i := 0; i < n; {
			c, run := uint32(rng.IntN(alpha)), 1+rng.IntN(200)
			for ; run > 0 && i < n; run, i = run-1, i+1 {
				s[i] = c
			}
		}
	}
	return s
}

// TestMergeLargeMatchesReference: on random merge tables and words (long
// runs among them) the typed heap gives the ids of the container/heap
// merge, and of the quadratic scan where that is affordable.
func TestMergeLargeMatchesReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	var sc bpeScratch
	for iter := range 400 {
		alpha := 1 + rng.IntN(6)
		m := randomBPE(rng, alpha)
		n := 2 + rng.IntN(3000)
		if iter%40 == 0 {
			n = 50000 + rng.IntN(50000)
		}
		word := randomSyms(rng, n, alpha)
		want := refMergeLarge(m, slices.Clone(word))
		got := slices.Clone(m.mergeLarge(slices.Clone(word), &sc))
		if !slices.Equal(got, want) {
			t.Fatalf("iter %d (alpha %d, %d symbols): typed heap %d ids, reference %d, first difference at %d",
				iter, alpha, n, len(got), len(want), firstDiff(got, want))
		}
		if n <= 400 {
			if small := m.mergeSmall(slices.Clone(word), &sc); !slices.Equal(small, want) {
				t.Fatalf("iter %d: scan %v, reference %v", iter, small, want)
			}
		}
	}
}

// TestMergeLargeRealRuns: runs of one character and long words with the
// real Llama 3 and Cohere merges agree with the reference.
func TestMergeLargeRealRuns(t *testing.T) {
	text := strings.ReplaceAll(longText(t), " ", "")
	var sc bpeScratch
	for _, name := range []string{"Meta-Llama-3-8B-Instruct", "cohere-tokenizer"} {
		m := loadNamed(t, name).model.(*bpe)
		words := []string{text}
		for _, c := range []string{" ", "a", "\n", "!", "é", "ab", " a", "0"} {
			for _, n := range []int{49, 127, 128, 129, 1000, 4097, 100003} {
				words = append(words, strings.Repeat(c, n))
			}
		}
		for _, w := range words {
			want := refMergeLarge(m, m.initialSymbols(nil, w))
			got := m.mergeLarge(m.initialSymbols(nil, w), &sc)
			if !slices.Equal(got, want) {
				t.Fatalf("%s: %q×%d: first difference at %d", name, w[:min(4, len(w))], len(w), firstDiff(got, want))
			}
		}
	}
}

// FuzzMergeLarge: any merge table and word, as the fuzzer makes them, merge
// alike with the typed heap and the reference.
func FuzzMergeLarge(f *testing.F) {
	f.Add(uint64(1), []byte("aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"))
	f.Add(uint64(2), []byte("abababababababababababababababababababababababababababababababab"))
	f.Add(uint64(3), []byte("\x00\x01\x02\x00\x01\x02\x00\x01\x02\x00\x01\x02\x00\x01\x02\x00\x01\x02"))
	f.Fuzz(func(t *testing.T, seed uint64, in []byte) {
		if len(in) < 2 {
			return
		}
		rng := rand.New(rand.NewPCG(seed, seed>>7))
		alpha := 1 + int(seed%5)
		m := randomBPE(rng, alpha)
		word := make([]uint32, len(in))
		for i, b := range in {
			word[i] = uint32(int(b) % alpha)
		}
		var sc bpeScratch
		want := refMergeLarge(m, slices.Clone(word))
		if got := m.mergeLarge(slices.Clone(word), &sc); !slices.Equal(got, want) {
			t.Fatalf("typed heap %v, reference %v", got, want)
		}
	})
}

// TestLargeScratchNotPooled: after a word of a megabyte the pooled scratch
// holds no buffer over maxPooledBytes.
func TestLargeScratchNotPooled(t *testing.T) {
	tk := withoutWordCache(loadNamed(t, "Meta-Llama-3-8B-Instruct"))
	tk.Encode(strings.Repeat(" ", 1<<20), false)
	sc := tk.getScratch() // most likely the one the encoding put back
	if c := cap(sc.bpe.h) * 8; c > maxPooledBytes {
		t.Fatalf("pooled merge heap of %d bytes", c)
	}
	if c := cap(sc.bpe.prev) * 4; c > maxPooledBytes {
		t.Fatalf("pooled prev of %d bytes", c)
	}
	if c := cap(sc.bpe.syms) * 4; c > maxPooledBytes {
		t.Fatalf("pooled symbols of %d bytes", c)
	}
}

// refModel is the BPE model with the container/heap merge for long words,
// as it was before the typed heap: the "before" of BenchmarkEncodeRun.
type refModel struct{ *bpe }

func (m refModel) tokenize(dst []uint32, word string, sc *bpeScratch) []uint32 {
	if m.cache != nil && len(word) <= maxCachedWord {
		if out, ok := m.cache.appendIDs(dst, word); ok {
			return out
		}
	}
	syms := m.initialSymbols(sc.syms[:0], word)
	if len(syms) <= smallWord {
		syms = m.mergeSmall(syms, sc)
	} else {
		syms = refMergeLarge(m.bpe, syms)
	}
	if m.cache != nil && len(word) <= maxCachedWord {
		m.cache.put(word, syms)
	}
	return append(dst, syms...)
}

// BenchmarkEncodeRun: a megabyte of spaces (one pre-token, merged on the
// heap) and a megabyte of ordinary text, with the typed heap ("typed") and
// with the container/heap merge it replaced ("container-heap"). Run with -cpu 1.
func BenchmarkEncodeRun(b *testing.B) {
	tk := loadNamed(b, "Meta-Llama-3-8B-Instruct")
	old := withoutWordCache(tk)
	old.model = refModel{tk.model.(*bpe)}
	text := strings.Repeat(longText(b), 1+(1<<20)/len(longText(b)))[:1<<20]
	for _, in := range []struct{ name, text string }{{"spaces-1MiB", strings.Repeat(" ", 1<<20)}, {"text-1MiB", text}} {
		for _, v := range []struct {
			name string
			tk   *Native
		}{{"typed", tk}, {"container-heap", old}} {
			b.Run(in.name+"/"+v.name, func(b *testing.B) {
				n := len(v.tk.Encode(in.text, false))
				dst := make([]uint32, 0, n+16)
				b.SetBytes(int64(len(in.text)))
				b.ReportAllocs()
				for b.Loop() {
					dst = v.tk.AppendEncode(dst[:0], in.text, false)
				}
				b.ReportMetric(float64(n)*float64(b.N)/b.Elapsed().Seconds(), "tokens/s")
			})
		}
	}
}
