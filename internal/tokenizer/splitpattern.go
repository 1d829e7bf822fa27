package tokenizer

import (
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// span is a byte range of a word.
type span struct{ start, end int }

// splitMatcher finds the matches of a Split pattern in s, in order.
type splitMatcher interface {
	appendMatches(dst []span, s string) []span
	// cutSafe: no match can contain an ASCII space preceded by a non-space,
	// and the matches left of such a space do not depend on what follows it.
	cutSafe() bool
}

// The pre-tokenizer patterns real models use. They are matched by hand-written
// code (exactly, including Llama 3's negative lookahead); any other pattern
// goes to regexp2.
const (
	// gpt2Pattern is GPT-2's (ByteLevel use_regex=true).
	gpt2Pattern = `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
	// llama3Pattern is Llama 3's and cl100k_base's.
	llama3Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
	// qwen2Pattern is Qwen2's: Llama 3's with single digits.
	qwen2Pattern = `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`
)

func newSplitMatcher(pattern string, isRegex bool) (splitMatcher, error) {
	if !isRegex {
		return literalMatcher(pattern), nil
	}
	switch pattern {
	case gpt2Pattern:
		return gpt2Matcher{}, nil
	case llama3Pattern:
		return llama3Matcher{maxDigits: 3}, nil
	case qwen2Pattern:
		return llama3Matcher{maxDigits: 1}, nil
	}
	re, err := compileOnig(pattern)
	if err != nil {
		return nil, fmt.Errorf("split pattern: %w", err)
	}
	return &regexMatcher{re: re}, nil
}

// runeClass classifies a rune for the GPT-2 / Llama 3 patterns.
type runeClass uint8

const (
	clsOther runeClass = iota // [^\s\p{L}\p{N}]
	clsLetter
	clsNumber
	clsSpace
	clsNewline // \r or \n (also a space)
)

// asciiClass caches the class of ASCII runes.
var asciiClass [128]runeClass

func init() {
	for c := 0; c < 128; c++ {
		asciiClass[c] = classifySlow(rune(c))
	}
}

func classifySlow(r rune) runeClass {
	switch {
	case r == '\r' || r == '\n':
		return clsNewline
	case unicode.IsSpace(r):
		return clsSpace
	case unicode.IsLetter(r):
		return clsLetter
	case unicode.IsNumber(r):
		return clsNumber
	}
	return clsOther
}

// classAt returns the class and width of the rune at s[i]; invalid UTF-8 is
// one byte of class other (U+FFFD is a symbol).
func classAt(s string, i int) (runeClass, int) {
	if c := s[i]; c < utf8.RuneSelf {
		return asciiClass[c], 1
	}
	r, n := utf8.DecodeRuneInString(s[i:])
	return classifySlow(r), n
}

func isSpaceClass(c runeClass) bool { return c == clsSpace || c == clsNewline }

// contraction returns the length of 's|'t|'re|'ve|'m|'ll|'d at s[i] (an
// apostrophe), or 0. fold makes it case-insensitive, including the long s
// (U+017F) that Unicode case folding maps to s, as the regex engines do.
func contraction(s string, i int, fold bool) int {
	rest := s[i+1:]
	if rest == "" {
		return 0
	}
	r1, n1 := utf8.DecodeRuneInString(rest)
	if fold {
		r1 = foldContraction(r1)
	}
	switch r1 {
	case 's', 't', 'm', 'd':
		return 1 + n1
	case 'r', 'v', 'l':
		if len(rest) <= n1 {
			return 0
		}
		r2, n2 := utf8.DecodeRuneInString(rest[n1:])
		if fold {
			r2 = foldContraction(r2)
		}
		if (r1 == 'r' || r1 == 'v') && r2 == 'e' || r1 == 'l' && r2 == 'l' {
			return 1 + n1 + n2
		}
	}
	return 0
}

func foldContraction(r rune) rune {
	switch {
	case r >= 'A' && r <= 'Z':
		return r + 'a' - 'A'
	case r == 'ſ':
		return 's'
	}
	return r
}

// runEnd returns the end of the run of runes at s[i:] whose class satisfies ok.
func runEnd(s string, i int, ok func(runeClass) bool) int {
	for i < len(s) {
		c, n := classAt(s, i)
		if !ok(c) {
			break
		}
		i += n
	}
	return i
}

func isLetterC(c runeClass) bool { return c == clsLetter }
func isNumberC(c runeClass) bool { return c == clsNumber }
func isOtherC(c runeClass) bool  { return c == clsOther }

// whitespaceMatch implements `\s+(?!\S)|\s+` at i (s[i] is a space): the
// whole run at the end of input, else the run minus its last rune when that
// leaves at least one, else the single rune.
func whitespaceMatch(s string, i int) int {
	end := runEnd(s, i, isSpaceClass)
	if end == len(s) {
		return end
	}
	_, lastN := utf8.DecodeLastRuneInString(s[i:end])
	if end-lastN > i {
		return end - lastN
	}
	return end
}

// llama3Matcher matches llama3Pattern (maxDigits 3) or qwen2Pattern (1).
type llama3Matcher struct{ maxDigits int }

func (llama3Matcher) cutSafe() bool { return true }

func (m llama3Matcher) appendMatches(dst []span, s string) []span {
	for i := 0; i < len(s); {
		end := m.matchAt(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func (m llama3Matcher) matchAt(s string, i int) int {
	c, n := classAt(s, i)
	// (?i:'s|'t|'re|'ve|'m|'ll|'d)
	if s[i] == '\'' {
		if k := contraction(s, i, true); k > 0 {
			return i + k
		}
	}
	switch c {
	case clsLetter: // \p{L}+
		return runEnd(s, i+n, isLetterC)
	case clsNumber: // \p{N}{1,3}
		j := i + n
		for d := 1; d < m.maxDigits && j < len(s); d++ {
			c2, n2 := classAt(s, j)
			if c2 != clsNumber {
				break
			}
			j += n2
		}
		return j
	case clsOther, clsSpace:
		// [^\r\n\p{L}\p{N}]\p{L}+
		if i+n < len(s) {
			if c2, n2 := classAt(s, i+n); c2 == clsLetter {
				return runEnd(s, i+n+n2, isLetterC)
			}
		}
	}
	if c == clsOther || s[i] == ' ' {
		// ` ?[^\s\p{L}\p{N}]+[\r\n]*`
		j := i
		if s[i] == ' ' {
			j++
		}
		if k := runEnd(s, j, isOtherC); k > j {
			return runEnd(s, k, func(c runeClass) bool { return c == clsNewline })
		}
	}
	// c is a space here.
	end := runEnd(s, i, isSpaceClass)
	// \s*[\r\n]+ : up to the last newline of the run.
	for j := end; j > i; {
		r, rn := utf8.DecodeLastRuneInString(s[i:j])
		if r == '\r' || r == '\n' {
			return j
		}
		j -= rn
	}
	return whitespaceMatch(s, i)
}

// gpt2Matcher matches gpt2Pattern.
type gpt2Matcher struct{}

func (gpt2Matcher) cutSafe() bool { return true }

func (m gpt2Matcher) appendMatches(dst []span, s string) []span {
	for i := 0; i < len(s); {
		end := m.matchAt(s, i)
		dst = append(dst, span{i, end})
		i = end
	}
	return dst
}

func (gpt2Matcher) matchAt(s string, i int) int {
	if s[i] == '\'' {
		if k := contraction(s, i, false); k > 0 {
			return i + k
		}
	}
	j := i
	if s[i] == ' ' && i+1 < len(s) {
		j = i + 1
	}
	c, n := classAt(s, j)
	switch c {
	case clsLetter:
		return runEnd(s, j+n, isLetterC)
	case clsNumber:
		return runEnd(s, j+n, isNumberC)
	case clsOther:
		return runEnd(s, j+n, isOtherC)
	}
	return whitespaceMatch(s, i)
}

// literalMatcher matches a fixed string.
type literalMatcher string

func (literalMatcher) cutSafe() bool { return false }

func (m literalMatcher) appendMatches(dst []span, s string) []span {
	if m == "" { // tokenizers compiles the empty regex: an empty match at every character boundary
		for i := range s {
			dst = append(dst, span{i, i})
		}
		return append(dst, span{len(s), len(s)})
	}
	for i := 0; i <= len(s)-len(m); {
		if s[i:i+len(m)] == string(m) {
			dst = append(dst, span{i, i + len(m)})
			i += len(m)
			continue
		}
		i++
	}
	return dst
}

// regexTimeout bounds one backtracking match of a fallback pattern, so a
// pathological pattern in a tokenizer file cannot stall a request forever;
// on timeout the rest of the word is left unsplit.
const regexTimeout = 2 * time.Second

// regexMatcher is the general fallback: regexp2 has the lookaround that Go's
// regexp lacks. It is slower and allocates; the prefix cache does not cut
// through it because an arbitrary pattern may match across a space.
type regexMatcher struct{ re *regexp2.Regexp }

func (*regexMatcher) cutSafe() bool { return false }

// appendMatches lists the matches as the onig crate's find_iter does
// (tokenizers splits and replaces by it): each search starts where the last
// match ended, and an empty match right where the last match ended is
// skipped, the search moving on one character. Empty matches are listed:
// they split the text too ("x*" cuts "ab" into "a", "b").
func (m *regexMatcher) appendMatches(dst []span, s string) []span {
	runes := []rune(s)
	// offsets[k] is the byte offset of rune k.
	offsets := make([]int, len(runes)+1)
	o := 0
	for k, r := range runes {
		offsets[k] = o
		if r == utf8.RuneError {
			_, n := utf8.DecodeRuneInString(s[o:])
			o += n
		} else {
			o += utf8.RuneLen(r)
		}
	}
	offsets[len(runes)] = len(s)
	for pos, lastEnd := 0, -1; pos <= len(runes); {
		match, err := m.re.FindRunesMatchStartingAt(runes, pos)
		if err != nil || match == nil {
			break
		}
		start, end := match.Index, match.Index+match.Length
		if start == end && end == lastEnd {
			pos++
			continue
		}
		dst = append(dst, span{offsets[start], offsets[end]})
		pos, lastEnd = end, end
	}
	return dst
}

// replacer replaces a literal or regex pattern (Replace normalizer/decoder).
type replacer struct {
	literal string
	re      *regexp2.Regexp
	content string
}

// replaceAll replaces every match. The content is inserted as written:
// tokenizers expands no $1 or $0 in it (regexp2's Replace would).
func (r replacer) replaceAll(s string) string {
	if s == "" { // tokenizers' find_matches has no match in empty text
		return s
	}
	if r.re == nil {
		// An empty literal matches at every character boundary, in both.
		return strings.ReplaceAll(s, r.literal, r.content)
	}
	var ms []span
	ms = (&regexMatcher{re: r.re}).appendMatches(ms, s)
	if len(ms) == 0 {
		return s
	}
	var sb strings.Builder
	last := 0
	for _, m := range ms {
		sb.WriteString(s[last:m.start])
		sb.WriteString(r.content)
		last = m.end
	}
	sb.WriteString(s[last:])
	return sb.String()
}
