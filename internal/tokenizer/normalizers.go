package tokenizer

import (
	"slices"
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

// rustLower lowercases like tokenizers' NormalizedString::lowercase: each
// character on its own with Rust's char::to_lowercase, which differs from
// Go's only for U+0130 (İ → "i̇"). Being per character, it has no final-sigma
// rule (str::to_lowercase has one): "ΣΑΣ" → "σασ", as the reference gives.
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
	for _, r := range s {
		if r == 'İ' {
			sb.WriteString("i\u0307")
		} else {
			sb.WriteRune(unicode.ToLower(r))
		}
	}
	return sb.String()
}

// stripAccents is StripAccents: it drops combining marks (Mn, Mc and Me:
// unicode-normalization's is_combining_mark, Unicode 9 tables) and does not
// decompose first (a precomposed "é" stays; tokenizer files put NFD or NFKD
// before it).
type stripAccents struct{}

func (stripAccents) normalize(s string) string {
	if isASCII(s) {
		return s
	}
	return removeRunes(s, combiningMarks)
}
func (stripAccents) cutSafe() bool { return true }

func removeRunes(s string, t *unicode.RangeTable) string {
	var sb strings.Builder
	sb.Grow(len(s))
	for _, r := range s {
		if !unicode.Is(t, r) {
			sb.WriteRune(r)
		}
	}
	return sb.String()
}

// tokenizers classifies characters in several places with crates whose
// Unicode tables are older than Go's; measured on every code point against
// the reference (tokenizers 0.23.2):
//   - StripAccents' combining marks (unicode-normalization-alignments): M as
//     of Unicode 9, where U+1CF2/U+1CF3 were still marks and U+111C9
//     punctuation;
//   - BertNormalizer's nonspacing marks, control characters and the
//     BertPreTokenizer/Punctuation punctuation (unicode_categories): Mn, Cc,
//     Cf, Co and P as of Unicode 8, with the categories of that version
//     (U+1734 was Mn, U+1885/U+1886 letters, U+A9BD Mc, U+166D and U+111C9
//     punctuation).
//
// Characters assigned since then are not marks, controls or punctuation
// there, so Native must not treat them as such either.
var (
	combiningMarks = versionTable(unicode.M, "9.0.0", []rune{0x1CF2, 0x1CF3}, []rune{0x111C9})
	oldMn          = versionTable(unicode.Mn, "8.0.0", []rune{0x1734}, []rune{0x1885, 0x1886, 0xA9BD, 0x111C9})
	oldControl     = versionTable(rangetable.Merge(unicode.Cc, unicode.Cf, unicode.Co), "8.0.0", nil, nil)
	oldPunct       = versionTable(unicode.P, "8.0.0", []rune{0x166D, 0x111C9}, nil)
)

// versionTable is the runes of t assigned in Unicode version, plus add, less
// del (category changes since). It works on ranges: a per-rune walk of the
// private-use planes costs 20 ms at start-up.
func versionTable(t *unicode.RangeTable, version string, add, del []rune) *unicode.RangeTable {
	a, b := runeRanges(t), runeRanges(rangetable.Assigned(version))
	var rs [][2]rune
	for i, j := 0, 0; i < len(a) && j < len(b); {
		if lo, hi := max(a[i][0], b[j][0]), min(a[i][1], b[j][1]); lo <= hi {
			rs = append(rs, [2]rune{lo, hi})
		}
		if a[i][1] < b[j][1] {
			i++
		} else {
			j++
		}
	}
	for _, d := range del {
		for k, r := range rs {
			if r[0] <= d && d <= r[1] {
				rs = slices.Replace(rs, k, k+1, [2]rune{r[0], d - 1}, [2]rune{d + 1, r[1]})
				break
			}
		}
	}
	for _, r := range add {
		rs = append(rs, [2]rune{r, r})
	}
	slices.SortFunc(rs, func(x, y [2]rune) int { return int(x[0] - y[0]) })
	out := &unicode.RangeTable{}
	for _, r := range rs {
		if r[0] > r[1] {
			continue // emptied by del
		}
		if r[0] <= 0xFFFF {
			out.R16 = append(out.R16, unicode.Range16{Lo: uint16(r[0]), Hi: uint16(min(r[1], 0xFFFF)), Stride: 1})
			if r[1] <= unicode.MaxLatin1 {
				out.LatinOffset++
			}
		}
		if r[1] > 0xFFFF {
			out.R32 = append(out.R32, unicode.Range32{Lo: uint32(max(r[0], 0x10000)), Hi: uint32(r[1]), Stride: 1})
		}
	}
	return out
}

// runeRanges lists t's runes as sorted, disjoint [lo, hi] ranges.
func runeRanges(t *unicode.RangeTable) [][2]rune {
	var rs [][2]rune
	push := func(lo, hi, stride rune) {
		if stride == 1 {
			rs = append(rs, [2]rune{lo, hi})
			return
		}
		for r := lo; r <= hi; r += stride {
			rs = append(rs, [2]rune{r, r})
		}
	}
	for _, r := range t.R16 {
		push(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
	for _, r := range t.R32 {
		push(rune(r.Lo), rune(r.Hi), rune(r.Stride))
	}
	return rs
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
		out = removeRunes(norm.NFD.String(out), oldMn)
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
	// Cc, Cf and Co as of Unicode 8 (see oldControl); unassigned runes (Cn)
	// are kept.
	return unicode.Is(oldControl, r)
}

// isCJK is BertNormalizer's is_chinese_char, ranges as tokenizers spells them
// (its Extension E range starts at U+2B920, not U+2B820).
func isCJK(r rune) bool {
	return (r >= 0x4E00 && r <= 0x9FFF) || (r >= 0x3400 && r <= 0x4DBF) || (r >= 0x20000 && r <= 0x2A6DF) ||
		(r >= 0x2A700 && r <= 0x2B73F) || (r >= 0x2B740 && r <= 0x2B81F) || (r >= 0x2B920 && r <= 0x2CEAF) ||
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
