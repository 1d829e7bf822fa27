package tokenizer

import (
	"math"
	"unicode/utf8"
)

// wordPiece is the WordPiece model: greedy longest match, continuation
// pieces spelled with a prefix ("##").
type wordPiece struct {
	vocab    map[string]uint32
	cont     map[string]uint32 // continuation pieces keyed without the prefix
	vocabR   []string
	has      []bool
	unk      uint32
	hasUnk   bool
	maxChars int
}

var _ model = (*wordPiece)(nil)

func newWordPiece(vocab map[string]uint32, prefix, unk string, maxChars int) *wordPiece {
	m := &wordPiece{vocab: vocab, cont: map[string]uint32{}, maxChars: maxChars}
	m.vocabR, m.has = reverseVocab(vocab)
	for tok, id := range vocab {
		if len(tok) > len(prefix) && tok[:len(prefix)] == prefix {
			m.cont[tok[len(prefix):]] = id
		}
	}
	m.unk, m.hasUnk = vocab[unk]
	return m
}

func reverseVocab(vocab map[string]uint32) ([]string, []bool) {
	maxID := -1
	for _, id := range vocab {
		maxID = max(maxID, int(id))
	}
	r := make([]string, maxID+1)
	has := make([]bool, maxID+1)
	for tok, id := range vocab {
		r[id] = tok
		has[id] = true
	}
	return r, has
}

func (m *wordPiece) size() int { return len(m.vocabR) }
func (m *wordPiece) tokenToID(tok string) (uint32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}
func (m *wordPiece) idToToken(id uint32) (string, bool) {
	if int(id) >= len(m.vocabR) || !m.has[id] {
		return "", false
	}
	return m.vocabR[id], true
}

func (m *wordPiece) tokenize(dst []uint32, word string, _ *bpeScratch) []uint32 {
	if utf8.RuneCountInString(word) > m.maxChars {
		return m.appendUnk(dst)
	}
	base := len(dst)
	for start := 0; start < len(word); {
		end := len(word)
		found := false
		for end > start {
			var id uint32
			var ok bool
			if start == 0 {
				id, ok = m.vocab[word[start:end]]
			} else {
				id, ok = m.cont[word[start:end]]
			}
			if ok {
				dst = append(dst, id)
				found = true
				break
			}
			// Step back one rune.
			_, n := utf8.DecodeLastRuneInString(word[start:end])
			end -= n
		}
		if !found {
			return m.appendUnk(dst[:base])
		}
		start = end
	}
	return dst
}

func (m *wordPiece) appendUnk(dst []uint32) []uint32 {
	if m.hasUnk {
		dst = append(dst, m.unk)
	}
	return dst
}

// wordLevel maps each word to its id or the unknown token.
type wordLevel struct {
	vocab  map[string]uint32
	vocabR []string
	has    []bool
	unk    uint32
	hasUnk bool
}

var _ model = (*wordLevel)(nil)

func (m *wordLevel) size() int { return len(m.vocabR) }
func (m *wordLevel) tokenToID(tok string) (uint32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}
func (m *wordLevel) idToToken(id uint32) (string, bool) {
	if int(id) >= len(m.vocabR) || !m.has[id] {
		return "", false
	}
	return m.vocabR[id], true
}
func (m *wordLevel) tokenize(dst []uint32, word string, _ *bpeScratch) []uint32 {
	if id, ok := m.vocab[word]; ok {
		return append(dst, id)
	}
	if m.hasUnk {
		dst = append(dst, m.unk)
	}
	return dst
}

// unigram is the Unigram (SentencePiece) model: the Viterbi best
// segmentation by piece log-probabilities.
type unigram struct {
	vocab        map[string]uint32
	scores       []float64
	vocabR       []string
	has          []bool
	unk          uint32
	hasUnk       bool
	unkScore     float64
	maxLen       int // longest piece in bytes
	byteFallback bool
	fallbackIDs  [256]int64
}

var _ model = (*unigram)(nil)

func newUnigram(pieces []string, scores []float64, unkID int, byteFallback bool) *unigram {
	m := &unigram{vocab: make(map[string]uint32, len(pieces)), scores: scores, byteFallback: byteFallback}
	minScore := math.Inf(1)
	for i, p := range pieces {
		if _, dup := m.vocab[p]; !dup {
			m.vocab[p] = uint32(i)
		}
		m.maxLen = max(m.maxLen, len(p))
		minScore = min(minScore, scores[i])
	}
	m.vocabR, m.has = reverseVocab(m.vocab)
	if unkID >= 0 && unkID < len(pieces) {
		m.unk, m.hasUnk = uint32(unkID), true
	}
	// tokenizers' kUnkPenalty: an unknown rune costs 10 nats more than the rarest piece.
	m.unkScore = minScore - 10
	for b := range 256 {
		m.fallbackIDs[b] = -1
		if id, ok := m.vocab[fmtByte(byte(b))]; ok {
			m.fallbackIDs[b] = int64(id)
		}
	}
	return m
}

func fmtByte(b byte) string {
	const hex = "0123456789ABCDEF"
	return "<0x" + string(hex[b>>4]) + string(hex[b&15]) + ">"
}

func (m *unigram) size() int { return len(m.vocabR) }
func (m *unigram) tokenToID(tok string) (uint32, bool) {
	id, ok := m.vocab[tok]
	return id, ok
}
func (m *unigram) idToToken(id uint32) (string, bool) {
	if int(id) >= len(m.vocabR) || !m.has[id] {
		return "", false
	}
	return m.vocabR[id], true
}

func (m *unigram) tokenize(dst []uint32, word string, _ *bpeScratch) []uint32 {
	n := len(word)
	best := make([]float64, n+1)
	from := make([]int, n+1)
	ids := make([]int64, n+1) // id of the piece ending here; -1 unknown rune
	for i := 1; i <= n; i++ {
		best[i] = math.Inf(-1)
	}
	for i := 0; i < n; i++ {
		if math.IsInf(best[i], -1) || !utf8.RuneStart(word[i]) {
			continue
		}
		matched := false
		_, rn := utf8.DecodeRuneInString(word[i:])
		for j := i + 1; j <= n && j-i <= m.maxLen; j++ {
			id, ok := m.vocab[word[i:j]]
			if !ok {
				continue
			}
			if j-i == rn {
				matched = true
			}
			if s := best[i] + m.scores[id]; s > best[j] {
				best[j], from[j], ids[j] = s, i, int64(id)
			}
		}
		if !matched {
			if s := best[i] + m.unkScore; s > best[i+rn] {
				best[i+rn], from[i+rn], ids[i+rn] = s, i, -1
			}
		}
	}
	// Walk back, then emit in order.
	var rev []int
	for j := n; j > 0; j = from[j] {
		rev = append(rev, j)
	}
	lastUnk := false
	for k := len(rev) - 1; k >= 0; k-- {
		j := rev[k]
		if ids[j] >= 0 {
			dst = append(dst, uint32(ids[j]))
			lastUnk = false
			continue
		}
		if m.byteFallback {
			for _, b := range []byte(word[from[j]:j]) {
				if id := m.fallbackIDs[b]; id >= 0 {
					dst = append(dst, uint32(id))
				}
			}
			continue
		}
		if m.hasUnk && !lastUnk {
			dst = append(dst, m.unk)
		}
		lastUnk = true
	}
	return dst
}
