package tokenizer

import (
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/unicode/norm"
	"golang.org/x/text/unicode/rangetable"
)

// normalizer rewrites a piece of input before pre-tokenization.
type normalizer interface {
	normalize(s string) string
	// cutSafe: normalize(a+b) == normalize(a)+normalize(b) whenever b starts
	// with an ASCII space (the prefix cache's cut points).
	cutSafe() bool
}

type unicodeNorm struct{ form norm.Form }

func (n unicodeNorm) normalize(s string) string {
	if isASCII(s) {
		return s
	}
	return n.form.String(s)
}
func (unicodeNorm) cutSafe() bool { return true }

type lowercase struct{}

func (lowercase) normalize(s string) string { return rustLower(s) }
func (lowercase) cutSafe() bool             { return true }

// rustLower lowercases like Rust's str::to_lowercase, which differs from Go's
// for U+0130 (İ → "i̇") and for final sigma.
func rustLower(s string) string {
	if isASCII(s) {
		for i := 0; i < len(s); i++ {
			if c := s[i]; c >= 'A' && c <= 'Z' {
				return strings.ToLower(s)
			}
		}
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s))
	for i, r := range s {
		switch {
		case r == 'İ':
			sb.WriteString("i\u0307")
		case r == 'Σ' && isFinalSigma(s, i):
			sb.WriteRune('ς')
		default:
			sb.WriteRune(unicode.ToLower(r))
		}
	}
	return sb.String()
}

// isFinalSigma follows Rust: preceded by a cased letter (skipping
// case-ignorable runes) and not followed by one.
func isFinalSigma(s string, i int) bool {
	before := false
	for j := i; j > 0; {
		r, n := utf8.DecodeLastRuneInString(s[:j])
		j -= n
		if isCaseIgnorable(r) {
			continue
		}
		before = isCased(r)
		break
	}
	if !before {
		return false
	}
	for j := i + len("Σ"); j < len(s); {
		r, n := utf8.DecodeRuneInString(s[j:])
		j += n
		if isCaseIgnorable(r) {
			continue
		}
		return !isCased(r)
	}
	return true
}

func isCased(r rune) bool {
	return unicode.IsUpper(r) || unicode.IsLower(r) || unicode.IsTitle(r)
}

func isCaseIgnorable(r rune) bool {
	return unicode.In(r, unicode.Mn, unicode.Me, unicode.Cf, unicode.Lm, unicode.Sk) || r == '\'' || r == '.' || r == ':'
}

type stripAccents struct{}

func (stripAccents) normalize(s string) string {
	if isASCII(s) {
		return s
	}
	return removeMarks(norm.NFD.String(s))
}
func (stripAccents) cutSafe() bool { return true }

func removeMarks(s string) string {
	var sb strings.Builder
	sb.Grow(len(s))
	for _, r := range s {
		if !unicode.Is(unicode.Mn, r) {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// oldMn is the nonspacing marks as of Unicode 9: BertNormalizer tests marks
// with the unicode_categories crate's tables, so marks assigned later are
// kept (checked against the golden ids: U+08CA survives).
var oldMn = rangetable.Merge(unicodeIntersect(unicode.Mn, rangetable.Assigned("9.0.0")))

func unicodeIntersect(a, b *unicode.RangeTable) *unicode.RangeTable {
	var rs []rune
	rangetable.Visit(a, func(r rune) {
		if unicode.Is(b, r) {
			rs = append(rs, r)
		}
	})
	return rangetable.New(rs...)
}

func removeOldMarks(s string) string {
	var sb strings.Builder
	sb.Grow(len(s))
	for _, r := range s {
		if !unicode.Is(oldMn, r) {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

type strip struct{ left, right bool }

func (n strip) normalize(s string) string {
	if n.left {
		s = strings.TrimLeftFunc(s, unicode.IsSpace)
	}
	if n.right {
		s = strings.TrimRightFunc(s, unicode.IsSpace)
	}
	return s
}
func (strip) cutSafe() bool { return false }

type prepend struct{ s string }

func (n prepend) normalize(s string) string {
	if s == "" {
		return s
	}
	return n.s + s
}
func (prepend) cutSafe() bool { return false }

type replaceNorm struct{ r replacer }

func (n replaceNorm) normalize(s string) string { return n.r.replaceAll(s) }
func (replaceNorm) cutSafe() bool               { return false }

type normSequence []normalizer

func (q normSequence) normalize(s string) string {
	for _, n := range q {
		s = n.normalize(s)
	}
	return s
}

func (q normSequence) cutSafe() bool {
	for _, n := range q {
		if !n.cutSafe() {
			return false
		}
	}
	return true
}

// bertNormalizer is BertNormalizer: clean text, pad CJK ideographs with
// spaces, strip accents, lowercase — in that order.
type bertNormalizer struct {
	cleanText, chineseChars, stripAccents, lowercase bool
}

func (b bertNormalizer) normalize(s string) string {
	if isASCII(s) && !b.cleanText && !b.lowercase {
		return s
	}
	var sb strings.Builder
	sb.Grow(len(s) + 8)
	for _, r := range s {
		if b.cleanText {
			if r == 0 || r == 0xFFFD || isBertControl(r) {
				continue
			}
			if isBertWhitespace(r) {
				sb.WriteByte(' ')
				continue
			}
		}
		if b.chineseChars && isCJK(r) {
			sb.WriteByte(' ')
			sb.WriteRune(r)
			sb.WriteByte(' ')
			continue
		}
		sb.WriteRune(r)
	}
	out := sb.String()
	if b.stripAccents && !isASCII(out) {
		out = removeOldMarks(norm.NFD.String(out))
	}
	if b.lowercase {
		out = rustLower(out)
	}
	return out
}
func (bertNormalizer) cutSafe() bool { return true }

func isBertWhitespace(r rune) bool {
	return r == ' ' || r == '\t' || r == '\n' || r == '\r' || unicode.IsSpace(r)
}

func isBertControl(r rune) bool {
	if r == '\t' || r == '\n' || r == '\r' {
		return false
	}
	// Unassigned runes (Cn) are kept: tokenizers' tables do not count them
	// (checked against the golden ids).
	return unicode.In(r, unicode.Cc, unicode.Cf, unicode.Co)
}

func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B820 && r <= 0x2CEAF) ||
		(r >= 0xF900 && r <= 0xFAFF) || (r >= 0x2F800 && r <= 0x2FA1F)
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= utf8.RuneSelf {
			return false
		}
	}
	return true
}
