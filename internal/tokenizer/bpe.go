package tokenizer

import (
	"fmt"
	"slices"
	"unicode/utf8"
	"unsafe"
)

// model turns one pre-tokenized word into ids.
type model interface {
	tokenize(dst []uint32, word string, sc *bpeScratch) []uint32
	tokenToID(tok string) (uint32, bool)
	idToToken(id uint32) (string, bool)
	size() int
}

// bpe is the BPE model. In a byte-level tokenizer vocab and merges are stored
// as raw bytes (see bytelevel.go).
type bpe struct {
	vocab  map[string]uint32
	vocabR []string // by id
	has    []bool   // ids present in vocab
	// merges maps left<<32|right to rank<<32|merged id.
	merges    map[uint64]uint64
	byteLevel bool
	byteIDs   [256]int64 // byte-level: id of each single byte, -1 if absent
	// byteSlow: a byte-level word needs byteLevelSymbols, not the byteIDs
	// loop: the model has a continuing_subword_prefix or end_of_word_suffix,
	// or a byte without a token and an unknown token or byte fallback to
	// spell it with.
	byteSlow bool
	// affixIDs: byte-level with a prefix or suffix: the id of each byte's
	// token in each position (affixNotFirst, affixLast bits), -1 if absent.
	affixIDs     *[4][256]int64
	ignoreMerges bool
	byteFallback bool
	fallbackIDs  [256]int64 // <0xXX> tokens
	unk          int64      // -1: none
	fuseUnk      bool
	contPrefix   string
	eowSuffix    string
	cache        *wordCache // nil: no cache
}

var _ model = (*bpe)(nil)

// bpeScratch is reused across words and calls.
type bpeScratch struct {
	syms  []uint32
	ranks []uint32
	init  []uint64 // mergeLarge's sorted first pairs: rank<<32 | position
	h     []uint64 // mergeLarge's heap of later pairs, the same
	prev  []int32
	next  []int32
	bound bound // the encoding's limits (bound.go); zero: none
}

const noRank = ^uint32(0)

// smallWord is the symbol count up to which a quadratic scan beats the heap.
const smallWord = 48

func (m *bpe) size() int { return len(m.vocabR) }

// spellsEveryByte reports whether every character has tokens without the
// unknown token: a byte-level vocabulary with all 256 bytes, or byte
// fallback with all 256 <0xXX> tokens.
func (m *bpe) spellsEveryByte() bool {
	if m.byteLevel {
		all := !slices.Contains(m.byteIDs[:], -1)
		if m.affixIDs != nil {
			for _, ids := range m.affixIDs {
				all = all && !slices.Contains(ids[:], -1)
			}
		}
		if all {
			return true
		}
	}
	return m.byteFallback && !slices.Contains(m.fallbackIDs[:], -1)
}

func (m *bpe) tokenToID(tok string) (uint32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}

func (m *bpe) idToToken(id uint32) (string, bool) {
	if int(id) >= len(m.vocabR) || !m.has[id] {
		return "", false
	}
	return m.vocabR[id], true
}

func (m *bpe) rank(a, b uint32) (uint32, uint32) {
	v, ok := m.merges[uint64(a)<<32|uint64(b)]
	if !ok {
		return noRank, 0
	}
	return uint32(v >> 32), uint32(v)
}

func (m *bpe) tokenize(dst []uint32, word string, sc *bpeScratch) []uint32 {
	if m.ignoreMerges {
		if id, ok := m.vocab[word]; ok {
			return append(dst, id)
		}
	}
	if m.cache != nil && len(word) <= maxCachedWord {
		if out, ok := m.cache.appendIDs(dst, word); ok {
			return out
		}
	}
	syms := m.initialSymbols(sc.syms[:0], word)
	if len(syms) <= smallWord {
		syms = m.mergeSmall(syms, sc)
	} else {
		syms = m.mergeLarge(syms, sc)
	}
	if m.cache != nil && len(word) <= maxCachedWord && sc.bound.err == nil {
		m.cache.put(word, syms)
	}
	dst = append(dst, syms...)
	sc.syms = keep(syms[:0])
	return dst
}

func (m *bpe) initialSymbols(syms []uint32, word string) []uint32 {
	if m.byteLevel {
		if m.byteSlow {
			return m.byteLevelSymbols(syms, word)
		}
		for i := 0; i < len(word); i++ {
			if id := m.byteIDs[word[i]]; id >= 0 {
				syms = append(syms, uint32(id))
			}
		}
		return syms
	}
	lastUnk := false
	for i := 0; i < len(word); {
		_, n := utf8.DecodeRuneInString(word[i:])
		ch := word[i : i+n]
		var id uint32
		var ok bool
		if m.contPrefix == "" && m.eowSuffix == "" {
			id, ok = m.vocab[ch]
		} else {
			tok := ch
			if i > 0 {
				tok = m.contPrefix + tok
			}
			if i+n == len(word) {
				tok += m.eowSuffix
			}
			id, ok = m.vocab[tok]
		}
		i += n
		if ok {
			syms = append(syms, id)
			lastUnk = false
			continue
		}
		syms, lastUnk = appendMissing(m, syms, ch, lastUnk)
	}
	return syms
}

// appendMissing appends what tokenizers gives a character without a token,
// spelled s: its bytes' byte fallback tokens when byte fallback is on and
// every byte has one, else the unknown token (once for a run of them with
// fuse_unk), else nothing. lastUnk says whether the symbol before it was
// the unknown token; the result says whether the last appended one is.
func appendMissing[S ~string | ~[]byte](m *bpe, syms []uint32, s S, lastUnk bool) ([]uint32, bool) {
	if m.byteFallback {
		all := true
		for k := 0; k < len(s); k++ {
			all = all && m.fallbackIDs[s[k]] >= 0
		}
		if all {
			for k := 0; k < len(s); k++ {
				syms = append(syms, uint32(m.fallbackIDs[s[k]]))
			}
			return syms, false
		}
	}
	if m.unk >= 0 {
		if !(m.fuseUnk && lastUnk) {
			syms = append(syms, uint32(m.unk))
		}
		return syms, true
	}
	return syms, lastUnk
}

// The positions of a byte in a word, as affixIDs indexes them.
const (
	affixNotFirst = 1 // takes the continuing_subword_prefix
	affixLast     = 2 // takes the end_of_word_suffix
)

// byteLevelSymbols is initialSymbols for a byte-level vocabulary as
// tokenizers does it: each byte is one character (a rune of the byte-level
// alphabet), spelled with the prefix unless first and the suffix if last.
// A character without a token is spelled with byte fallback tokens (of the
// UTF-8 bytes of its byte-level spelling, affixes included, as tokenizers
// does), else with the unknown token, else dropped.
func (m *bpe) byteLevelSymbols(syms []uint32, word string) []uint32 {
	lastUnk := false
	for i := 0; i < len(word); i++ {
		pos := 0
		if i > 0 {
			pos |= affixNotFirst
		}
		if i == len(word)-1 {
			pos |= affixLast
		}
		id := m.byteIDs[word[i]]
		if m.affixIDs != nil {
			id = m.affixIDs[pos][word[i]]
		}
		if id >= 0 {
			syms = append(syms, uint32(id))
			lastUnk = false
			continue
		}
		var buf [64]byte
		syms, lastUnk = appendMissing(m, syms, m.byteLevelSpelling(buf[:0], word[i], pos), lastUnk)
	}
	return syms
}

// byteLevelSpelling appends the token tokenizers looks up for byte b at pos:
// its byte-level rune with the affixes, as tokenizer.json writes it.
func (m *bpe) byteLevelSpelling(dst []byte, b byte, pos int) []byte {
	if pos&affixNotFirst != 0 {
		dst = append(dst, m.contPrefix...)
	}
	dst = utf8.AppendRune(dst, byteToRune[b])
	if pos&affixLast != 0 {
		dst = append(dst, m.eowSuffix...)
	}
	return dst
}

// mergeSmall applies the lowest-ranked merge (leftmost on ties) until none
// applies, keeping each pair's rank so a merge looks up only its two new pairs.
func (m *bpe) mergeSmall(syms []uint32, sc *bpeScratch) []uint32 {
	n := len(syms)
	if n < 2 {
		return syms
	}
	ranks := sc.ranks[:0]
	for i := 0; i+1 < n; i++ {
		r, _ := m.rank(syms[i], syms[i+1])
		ranks = append(ranks, r)
	}
	for {
		best, bi := noRank, -1
		for i, r := range ranks[:n-1] {
			if r < best {
				best, bi = r, i
			}
		}
		if bi < 0 {
			break
		}
		_, id := m.rank(syms[bi], syms[bi+1])
		syms[bi] = id
		copy(syms[bi+1:], syms[bi+2:n])
		copy(ranks[bi:], ranks[bi+1:n-1])
		n--
		syms = syms[:n]
		if bi > 0 {
			ranks[bi-1], _ = m.rank(syms[bi-1], syms[bi])
		}
		if bi+1 < n {
			ranks[bi], _ = m.rank(syms[bi], syms[bi+1])
		}
	}
	sc.ranks = ranks[:0]
	return syms
}

// mergeLarge is the same algorithm with a heap and a linked list, for long
// words (whitespace runs, adversarial input) where the scan would be quadratic.
// The heap holds rank<<32|pos, so one integer comparison orders by rank and
// then leftmost position, as the scan does; it is a plain []uint64 sifted in
// place (container/heap's interface calls and the boxing of every Pop were
// nine tenths of the time on a run of spaces). A long merge polls the
// encoding's bound (bound.go) every pollMerges steps and gives up when it
// says stop: the caller then drops the result.
func (m *bpe) mergeLarge(syms []uint32, sc *bpeScratch) []uint32 {
	n := len(syms)
	prev := growInt32(sc.prev, n)
	next := growInt32(sc.next, n)
	for i := range n {
		prev[i] = int32(i - 1)
		next[i] = int32(i + 1)
	}
	next[n-1] = -1
	// The word's own pairs are sorted once (a run's are sorted already)
	// and taken from the front; the pairs merges make go on the heap h.
	// Each pop takes the least of the two fronts.
	init := sc.init[:0]
	if cap(init) < n {
		init = make([]uint64, 0, n)
	}
	for i := 0; i+1 < n; i++ {
		if r, _ := m.rank(syms[i], syms[i+1]); r != noRank {
			init = append(init, uint64(r)<<32|uint64(i))
		}
	}
	if !slices.IsSorted(init) {
		slices.Sort(init)
	}
	h := sc.h[:0]
	steps := 0
	for at := 0; at < len(init) || len(h) > 0; {
		if steps++; steps >= pollMerges && sc.bound.on {
			steps = 0
			if sc.bound.poll() {
				break
			}
		}
		var top uint64
		if len(h) == 0 || at < len(init) && init[at] < h[0] {
			top = init[at]
			at++
		} else {
			top = h[0]
			last := len(h) - 1
			h[0] = h[last]
			h = h[:last]
			siftDown(h, 0)
		}
		i := int32(uint32(top))
		j := next[i]
		if prev[i] == -2 || j < 0 {
			continue
		}
		r, id := m.rank(syms[i], syms[j])
		if r != uint32(top>>32) {
			continue // stale: the pair changed since it was pushed
		}
		syms[i] = id
		prev[j] = -2 // dead
		next[i] = next[j]
		if next[j] >= 0 {
			prev[next[j]] = i
		}
		if p := prev[i]; p >= 0 {
			if r, _ := m.rank(syms[p], syms[i]); r != noRank {
				h = siftUp(append(h, uint64(r)<<32|uint64(p)))
			}
		}
		if k := next[i]; k >= 0 {
			if r, _ := m.rank(syms[i], syms[k]); r != noRank {
				h = siftUp(append(h, uint64(r)<<32|uint64(i)))
			}
		}
	}
	out := syms[:0]
	for i := int32(0); i >= 0; i = next[i] {
		out = append(out, syms[i])
	}
	sc.h, sc.init, sc.prev, sc.next = keep(h[:0]), keep(init[:0]), keep(prev), keep(next)
	return out
}

// siftUp moves the last item of h up to its place.
func siftUp(h []uint64) []uint64 {
	i := len(h) - 1
	x := h[i]
	for i > 0 {
		p := (i - 1) / 2
		if h[p] <= x {
			break
		}
		h[i] = h[p]
		i = p
	}
	h[i] = x
	return h
}

// siftDown moves h[i] down to its place.
func siftDown(h []uint64, i int) {
	n := len(h)
	if i >= n {
		return
	}
	x := h[i]
	for {
		c := 2*i + 1
		if c >= n {
			break
		}
		if c+1 < n && h[c+1] < h[c] {
			c++
		}
		if x <= h[c] {
			break
		}
		h[i] = h[c]
		i = c
	}
	h[i] = x
}

// maxPooledBytes bounds a scratch buffer kept for the next call: one long
// word (a megabyte run of spaces) must not pin its scratch in the pool.
const maxPooledBytes = 1 << 20

// keep returns s to be kept as scratch, or nil when it is too large to pool.
func keep[T any](s []T) []T {
	var z T
	if uintptr(cap(s))*unsafe.Sizeof(z) > maxPooledBytes {
		return nil
	}
	return s
}

func growInt32(s []int32, n int) []int32 {
	if cap(s) < n {
		return make([]int32, n)
	}
	return s[:n]
}

// newBPE builds the model from vocab and merges as tokenizer.json spells
// them; a byte-level vocabulary is converted to raw bytes after the merges
// are resolved to ids (concatenation commutes with the byte mapping).
func newBPE(vocab map[string]uint32, merges [][2]string, opts bpe) (*bpe, error) {
	m := opts
	m.merges = make(map[uint64]uint64, len(merges))
	var buf []byte
	for rank, mg := range merges {
		a, ok1 := vocab[mg[0]]
		b, ok2 := vocab[mg[1]]
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("bpe merge %d %q: %w: token not in vocab", rank, mg, ErrInvalid)
		}
		buf = append(append(buf[:0], mg[0]...), trimPrefix(mg[1], m.contPrefix)...)
		id, ok := vocab[string(buf)] // no allocation for a map index
		if !ok {
			return nil, fmt.Errorf("bpe merge %d %q: %w: merged token not in vocab", rank, mg, ErrInvalid)
		}
		key := uint64(a)<<32 | uint64(b)
		if _, dup := m.merges[key]; !dup {
			m.merges[key] = uint64(rank)<<32 | uint64(id)
		}
	}
	if m.byteLevel {
		vocab = toRawBytes(vocab)
		if m.contPrefix != "" || m.eowSuffix != "" {
			// Each byte's token in each position, as toRawBytes keyed it.
			m.affixIDs = new([4][256]int64)
			var buf []byte
			for pos := range m.affixIDs {
				for b := range 256 {
					buf = m.byteLevelSpelling(buf[:0], byte(b), pos)
					key, ok := byteLevelDecodeString(string(buf))
					if !ok {
						key = string(buf)
					}
					m.affixIDs[pos][b] = -1
					if id, ok := vocab[key]; ok {
						m.affixIDs[pos][b] = int64(id)
					}
				}
			}
		}
	}
	m.vocab = vocab
	m.vocabR, m.has = reverseVocab(vocab)
	m.cache = newWordCache(wordCacheCapacity)
	for b := 0; b < 256; b++ {
		m.byteIDs[b] = -1
		m.fallbackIDs[b] = -1
		if id, ok := vocab[string([]byte{byte(b)})]; ok && m.byteLevel {
			m.byteIDs[b] = int64(id)
		}
		if id, ok := vocab[fmtByte(byte(b))]; ok {
			m.fallbackIDs[b] = int64(id)
		}
	}
	m.byteSlow = m.byteLevel && (m.affixIDs != nil ||
		slices.Contains(m.byteIDs[:], -1) && (m.unk >= 0 || m.byteFallback))
	return &m, nil
}

func trimPrefix(s, p string) string {
	if p != "" && len(s) >= len(p) && s[:len(p)] == p {
		return s[len(p):]
	}
	return s
}
