package tokenizer

import (
	"sort"
	"unicode"
	"unicode/utf8"
)

// addedToken is one entry of tokenizer.json "added_tokens".
type addedToken struct {
	id         uint32
	content    string
	special    bool
	singleWord bool
	lstrip     bool
	rstrip     bool
	normalized bool
	decodeForm string // what Decode emits for it (byte-level runes mapped back)
}

// piece is a span of the input: an added token (id >= 0) or text to encode.
type piece struct {
	start, end int
	id         int64
}

// addedVocab finds added tokens in text, leftmost-longest as Hugging Face's
// Aho-Corasick matcher does. Tokens with normalized=false are matched in the
// raw input; normalized=true ones in the normalized pieces.
type addedVocab struct {
	byID          map[uint32]*addedToken
	byContent     map[string]uint32
	raw           matcherSet
	norm          matcherSet
	hasNormalized bool
	// anyStrip: some token has lstrip, rstrip or single_word, or contains
	// whitespace; then the prefix cache cannot cut at spaces safely.
	anyStrip bool
}

// matcherSet indexes tokens by first byte, longest first.
type matcherSet struct {
	first [256][]*addedToken
	any   bool
}

func (m *matcherSet) add(a *addedToken, content string) {
	if content == "" {
		return
	}
	b := content[0]
	m.first[b] = append(m.first[b], a)
	m.any = true
}

func (m *matcherSet) sortAll() {
	for i := range m.first {
		l := m.first[i]
		sort.SliceStable(l, func(x, y int) bool { return len(l[x].content) > len(l[y].content) })
	}
}

func newAddedVocab(tokens []*addedToken, normalize func(string) string) *addedVocab {
	v := &addedVocab{byID: map[uint32]*addedToken{}, byContent: map[string]uint32{}}
	for _, a := range tokens {
		v.byID[a.id] = a
		v.byContent[a.content] = a.id
		if a.lstrip || a.rstrip || a.singleWord {
			v.anyStrip = true
		}
		for _, r := range a.content {
			if unicode.IsSpace(r) {
				v.anyStrip = true
			}
		}
		// A token is matched on the normalized text when its flag says so,
		// special ones too (tokenizers' refresh_added_tokens partitions
		// every added token by `normalized` alone: CLIP's
		// <|startoftext|>, normalized under a Lowercase normalizer, matches
		// "<|STARTOFTEXT|>").
		if a.normalized && normalize != nil {
			c := normalize(a.content)
			na := *a
			na.content = c
			v.norm.add(&na, c)
			v.hasNormalized = true
		} else {
			v.raw.add(a, a.content)
		}
	}
	v.raw.sortAll()
	v.norm.sortAll()
	return v
}

func (v *addedVocab) split(dst []piece, text string) []piece {
	return v.raw.split(dst, text)
}

func (v *addedVocab) splitNormalized(dst []piece, text string) []piece {
	if !v.norm.any {
		return append(dst, piece{0, len(text), -1})
	}
	return v.norm.split(dst, text)
}

// split cuts text into pieces: text spans (id -1) and matched tokens, as
// tokenizers' AddedVocabulary::find_matches does. The matches are those of
// its Aho-Corasick automaton (leftmost-longest, each search going on after
// the previous match, whatever became of it); only then are the flags
// applied to each. So a single_word token that is glued to a word is
// dropped with its whole span (no shorter token is tried inside it), and
// an rstrip token's span reaches over the whitespace after it without
// hiding the tokens matched in that whitespace: they are emitted after it
// ("</think>" rstrip then "\n\n" gives both, and a third "\n" after them is
// text again). The pieces may then overlap; each is encoded on its own.
func (m *matcherSet) split(dst []piece, text string) []piece {
	if !m.any {
		return append(dst, piece{0, len(text), -1})
	}
	last := 0 // the end of the last piece (start_offset)
	for i := 0; i < len(text); {
		a := m.longestAt(text, i)
		if a == nil {
			i++
			continue
		}
		start, end := i, i+len(a.content)
		i = end
		if a.singleWord && !isSingleWord(text, start, end) {
			continue
		}
		if a.lstrip {
			for start > 0 {
				r, n := utf8.DecodeLastRuneInString(text[:start])
				if !unicode.IsSpace(r) {
					break
				}
				start -= n
			}
			start = max(start, last) // spaces the previous piece took
		}
		if a.rstrip {
			for end < len(text) {
				r, n := utf8.DecodeRuneInString(text[end:])
				if !unicode.IsSpace(r) {
					break
				}
				end += n
			}
		}
		if last < start {
			dst = append(dst, piece{last, start, -1})
		}
		dst = append(dst, piece{start, end, int64(a.id)})
		last = end
	}
	if last < len(text) {
		dst = append(dst, piece{last, len(text), -1})
	}
	return dst
}

// longestAt is the longest token that text has at i, nil if none.
func (m *matcherSet) longestAt(text string, i int) *addedToken {
	for _, a := range m.first[text[i]] {
		if c := a.content; len(text)-i >= len(c) && text[i:i+len(c)] == c {
			return a
		}
	}
	return nil
}

// isSingleWord: the match is not glued to word characters on either side.
func isSingleWord(text string, start, end int) bool {
	if start > 0 {
		r, _ := utf8.DecodeLastRuneInString(text[:start])
		if isWordChar(r) {
			return false
		}
	}
	if end < len(text) {
		r, _ := utf8.DecodeRuneInString(text[end:])
		if isWordChar(r) {
			return false
		}
	}
	return true
}

func isWordChar(r rune) bool {
	return r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r) || unicode.Is(unicode.M, r)
}
