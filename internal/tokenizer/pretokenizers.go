package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"
)

// preTokenizer cuts pieces into words. split replaces the words in place
// (using sc.words2 as spare room) and returns the new list.
type preTokenizer interface {
	split(words []string, sc *scratch, atStart bool) []string
	cutSafe() bool
}

// splitBehavior is what Split does with a match (tokenizers'
// SplitDelimiterBehavior).
type splitBehavior uint8

const (
	behRemoved splitBehavior = iota
	behIsolated
	behMergedWithPrevious
	behMergedWithNext
	behContiguous
)

// applyBehavior appends the words of s given its matches.
func applyBehavior(dst []string, s string, matches []span, beh splitBehavior, invert bool) []string {
	// Expand to alternating (span, isMatch) and fold like tokenizers does.
	type part struct {
		start, end int
		match      bool
	}
	var buf [64]part
	parts := buf[:0]
	last := 0
	// As tokenizers' find_matches: an empty match is a part too (it ends
	// runs in Contiguous and the merges), and parts left empty are dropped
	// at the end.
	for _, m := range matches {
		if m.start > last {
			parts = append(parts, part{last, m.start, invert})
		}
		parts = append(parts, part{m.start, m.end, !invert})
		last = m.end
	}
	if last < len(s) {
		parts = append(parts, part{last, len(s), invert})
	}
	base0 := len(dst)
	switch beh {
	case behIsolated:
		for _, p := range parts {
			dst = append(dst, s[p.start:p.end])
		}
	case behRemoved:
		for _, p := range parts {
			if !p.match {
				dst = append(dst, s[p.start:p.end])
			}
		}
	case behMergedWithPrevious:
		base := len(dst)
		prevMatch := false
		lastStart := 0
		for _, p := range parts {
			if p.match && !prevMatch && len(dst) > base {
				dst[len(dst)-1] = s[lastStart:p.end]
			} else {
				dst = append(dst, s[p.start:p.end])
				lastStart = p.start
			}
			prevMatch = p.match
		}
	case behMergedWithNext:
		// Walk backwards: a match joins the part after it.
		var out []string
		prevMatch := false
		lastEnd := 0
		for k := len(parts) - 1; k >= 0; k-- {
			p := parts[k]
			if p.match && !prevMatch && len(out) > 0 {
				out[len(out)-1] = s[p.start:lastEnd]
			} else {
				out = append(out, s[p.start:p.end])
				lastEnd = p.end
			}
			prevMatch = p.match
		}
		for k := len(out) - 1; k >= 0; k-- {
			dst = append(dst, out[k])
		}
	case behContiguous:
		base := len(dst)
		prevMatch := false
		lastStart := 0
		for _, p := range parts {
			if p.match == prevMatch && len(dst) > base {
				dst[len(dst)-1] = s[lastStart:p.end]
			} else {
				dst = append(dst, s[p.start:p.end])
				lastStart = p.start
			}
			prevMatch = p.match
		}
	}
	// PreTokenizedString::split drops empty pieces.
	out := dst[:base0]
	for _, w := range dst[base0:] {
		if w != "" {
			out = append(out, w)
		}
	}
	return out
}

// splitPre is the Split pre-tokenizer.
type splitPre struct {
	m      splitMatcher
	beh    splitBehavior
	invert bool
}

func (p *splitPre) cutSafe() bool { return p.m.cutSafe() && p.beh == behIsolated && !p.invert }

func (p *splitPre) split(words []string, sc *scratch, atStart bool) []string {
	out := sc.words2[:0]
	for _, w := range words {
		ms := p.m.appendMatches(sc.spans[:0], w)
		if p.beh == behIsolated && !p.invert {
			out = applyIsolatedFast(out, w, ms)
		} else {
			out = applyBehavior(out, w, ms, p.beh, p.invert)
		}
		sc.spans = ms[:0]
	}
	sc.words2 = words[:0]
	return out
}

func applyIsolatedFast(dst []string, s string, ms []span) []string {
	last := 0
	for _, m := range ms {
		if m.start > last {
			dst = append(dst, s[last:m.start])
		}
		if m.end > m.start {
			dst = append(dst, s[m.start:m.end])
		}
		last = m.end
	}
	if last < len(s) {
		dst = append(dst, s[last:])
	}
	return dst
}

// byteLevelPre is the ByteLevel pre-tokenizer. The byte mapping itself is
// folded into the vocabulary at load, so here it only adds the prefix space
// and applies GPT-2's pattern.
type byteLevelPre struct {
	addPrefixSpace bool
	useRegex       bool
}

func (p *byteLevelPre) cutSafe() bool { return true }

func (p *byteLevelPre) split(words []string, sc *scratch, atStart bool) []string {
	if p.addPrefixSpace {
		for i, w := range words {
			if !strings.HasPrefix(w, " ") {
				words[i] = " " + w
			}
		}
	}
	if !p.useRegex {
		return words
	}
	out := sc.words2[:0]
	for _, w := range words {
		ms := gpt2Matcher{}.appendMatches(sc.spans[:0], w)
		out = applyIsolatedFast(out, w, ms)
		sc.spans = ms[:0]
	}
	sc.words2 = words[:0]
	return out
}

// funcPre is a pre-tokenizer defined by a per-word function.
type funcPre struct {
	f    func(dst []string, w string) []string
	safe bool
}

func (p *funcPre) cutSafe() bool { return p.safe }

func (p *funcPre) split(words []string, sc *scratch, atStart bool) []string {
	out := sc.words2[:0]
	for _, w := range words {
		out = p.f(out, w)
	}
	sc.words2 = words[:0]
	return out
}

// whitespaceSplit splits on Unicode whitespace, dropping it.
func whitespaceSplit(dst []string, w string) []string {
	start := -1
	for i, r := range w {
		if unicode.IsSpace(r) {
			if start >= 0 {
				dst = append(dst, w[start:i])
				start = -1
			}
		} else if start < 0 {
			start = i
		}
	}
	if start >= 0 {
		dst = append(dst, w[start:])
	}
	return dst
}

// isBertPunct is BertPreTokenizer's and Punctuation's test: ASCII
// punctuation (is_ascii_punctuation: symbols too) or Unicode 8's P (see
// oldPunct).
func isBertPunct(r rune) bool {
	if r < utf8.RuneSelf {
		return (r >= 33 && r <= 47) || (r >= 58 && r <= 64) || (r >= 91 && r <= 96) || (r >= 123 && r <= 126)
	}
	return unicode.Is(oldPunct, r)
}

// bertSplit is BertPreTokenizer: whitespace removed, punctuation isolated.
func bertSplit(dst []string, w string) []string {
	start := -1
	for i, r := range w {
		switch {
		case unicode.IsSpace(r):
			if start >= 0 {
				dst = append(dst, w[start:i])
				start = -1
			}
		case isBertPunct(r):
			if start >= 0 {
				dst = append(dst, w[start:i])
				start = -1
			}
			dst = append(dst, w[i:i+utf8.RuneLen(r)])
		default:
			if start < 0 {
				start = i
			}
		}
	}
	if start >= 0 {
		dst = append(dst, w[start:])
	}
	return dst
}

// whitespacePre is Whitespace: `\w+|[^\w\s]+` (Rust's regex crate, not
// Oniguruma), whitespace dropped.
func whitespacePre(dst []string, w string) []string {
	const none, word, other = 0, 1, 2
	kind := func(r rune) int {
		switch {
		case unicode.IsSpace(r):
			return none
		case isRegexWord(r):
			return word
		}
		return other
	}
	start, cur := -1, none
	for i, r := range w {
		k := kind(r)
		if k != cur {
			if start >= 0 {
				dst = append(dst, w[start:i])
			}
			start, cur = i, k
			if k == none {
				start = -1
			}
		}
	}
	if start >= 0 {
		dst = append(dst, w[start:])
	}
	return dst
}

// runeMatcher matches each rune satisfying f (Punctuation, Digits).
type runeMatcher struct {
	f          func(rune) bool
	contiguous bool
}

func (runeMatcher) cutSafe() bool { return false }

func (m runeMatcher) appendMatches(dst []span, s string) []span {
	for i, r := range s {
		if !m.f(r) {
			continue
		}
		n := utf8.RuneLen(r)
		if n < 0 {
			n = 1
		}
		if m.contiguous && len(dst) > 0 && dst[len(dst)-1].end == i {
			dst[len(dst)-1].end = i + n
			continue
		}
		dst = append(dst, span{i, i + n})
	}
	return dst
}

// metaspacePre is Metaspace: spaces become the replacement rune, a prefix is
// prepended by scheme, and words are cut before each replacement rune.
type metaspacePre struct {
	replacement string
	scheme      string // "always", "first", "never"
	splitWords  bool
}

func (p *metaspacePre) cutSafe() bool { return false }

func (p *metaspacePre) split(words []string, sc *scratch, atStart bool) []string {
	out := sc.words2[:0]
	for i, w := range words {
		w = strings.ReplaceAll(w, " ", p.replacement)
		if (p.scheme == "always" || (p.scheme == "first" && atStart && i == 0)) && !strings.HasPrefix(w, p.replacement) {
			w = p.replacement + w
		}
		if !p.splitWords {
			out = append(out, w)
			continue
		}
		ms := literalMatcher(p.replacement).appendMatches(nil, w)
		out = applyBehavior(out, w, ms, behMergedWithNext, false)
	}
	sc.words2 = words[:0]
	return out
}

// mappedPre runs a pre-tokenizer that follows a ByteLevel step: tokenizers
// has mapped the text to the byte-level alphabet by then (one rune per byte),
// so the step classifies those runes. Native keeps raw bytes (the vocabulary
// is converted at load), so the words are mapped for the step and its pieces
// mapped back, byte for rune.
type mappedPre struct{ inner preTokenizer }

// cutSafe: a space is "Ġ" to the step, so it may not cut there.
func (p *mappedPre) cutSafe() bool { return false }

func (p *mappedPre) split(words []string, sc *scratch, atStart bool) []string {
	for i, w := range words {
		words[i] = byteLevelEncodeString(w)
	}
	words = p.inner.split(words, sc, atStart)
	for i, w := range words {
		words[i] = byteLevelDecodeToken(w)
	}
	return words
}

// preSequence runs pre-tokenizers in order.
type preSequence []preTokenizer

func (q preSequence) cutSafe() bool {
	for _, p := range q {
		if !p.cutSafe() {
			return false
		}
	}
	return true
}

func (q preSequence) split(words []string, sc *scratch, atStart bool) []string {
	for _, p := range q {
		words = p.split(words, sc, atStart)
	}
	return words
}

// isRegexWord is \w of Rust's regex crate (UTS #18's word class):
// Alphabetic, marks, decimal digits, connector punctuation and Join_Control.
// Unlike Go's unicode.IsLetter it includes letter numbers (Ⅱ) and the other
// alphabetic symbols (Ⓜ).
func isRegexWord(r rune) bool {
	if r < utf8.RuneSelf {
		return 'a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_'
	}
	return unicode.In(r, unicode.L, unicode.M, unicode.Nd, unicode.Pc, unicode.Nl, unicode.Other_Alphabetic,
		unicode.Other_Lowercase, unicode.Other_Uppercase, unicode.Join_Control)
}
