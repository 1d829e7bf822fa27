package tokenizer

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"
)

// property translates \p{…}, \P{…} and \p{^…} (pos after p or P).
func (t *onigTranslator) property(neg, inClass bool) (*onigSet, rune, error) {
	if t.peek(0) != '{' {
		return nil, 0, t.fail(errOnigInvalid, "invalid character property name")
	}
	end := t.pos + 1
	for end < len(t.src) && t.src[end] != '}' {
		end++
	}
	if end >= len(t.src) {
		return nil, 0, t.fail(errOnigInvalid, "invalid character property name")
	}
	name := string(t.src[t.pos+1 : end])
	if strings.HasPrefix(name, "^") {
		neg = !neg
		name = name[1:]
	}
	items := propertyItems(name, inClass)
	if items == nil {
		return nil, 0, t.fail(errOnigUnsupported, "character property %q", name)
	}
	t.pos = end + 1
	return &onigSet{items: items, neg: neg}, 0, nil
}

// generalCategories maps Oniguruma's names (compared lower-case without
// spaces, '-' and '_') to Go's. C and Cn are left out: Oniguruma's include
// unassigned code points, which Go's tables cannot name.
var generalCategories = map[string]string{
	"l": "L", "letter": "L", "lu": "Lu", "uppercaseletter": "Lu", "ll": "Ll", "lowercaseletter": "Ll",
	"lt": "Lt", "titlecaseletter": "Lt", "lm": "Lm", "modifierletter": "Lm", "lo": "Lo", "otherletter": "Lo",
	"m": "M", "mark": "M", "combiningmark": "M", "mn": "Mn", "nonspacingmark": "Mn", "mc": "Mc",
	"spacingmark": "Mc", "me": "Me", "enclosingmark": "Me",
	"n": "N", "number": "N", "nd": "Nd", "decimalnumber": "Nd", "nl": "Nl", "letternumber": "Nl",
	"no": "No", "othernumber": "No",
	"p": "P", "punctuation": "P", "pc": "Pc", "connectorpunctuation": "Pc", "pd": "Pd", "dashpunctuation": "Pd",
	"ps": "Ps", "openpunctuation": "Ps", "pe": "Pe", "closepunctuation": "Pe", "pi": "Pi",
	"initialpunctuation": "Pi", "pf": "Pf", "finalpunctuation": "Pf", "po": "Po", "otherpunctuation": "Po",
	"s": "S", "symbol": "S", "sm": "Sm", "mathsymbol": "Sm", "sc": "Sc", "currencysymbol": "Sc",
	"sk": "Sk", "modifiersymbol": "Sk", "so": "So", "othersymbol": "So",
	"z": "Z", "separator": "Z", "zs": "Zs", "spaceseparator": "Zs", "zl": "Zl", "lineseparator": "Zl",
	"zp": "Zp", "paragraphseparator": "Zp",
	"cc": "Cc", "control": "Cc", "cf": "Cf", "format": "Cf", "co": "Co", "privateuse": "Co",
}

var scriptNames = func() map[string]string {
	m := make(map[string]string, len(unicode.Scripts))
	for name := range unicode.Scripts {
		m[normPropName(name)] = name
	}
	return m
}()

func normPropName(s string) string {
	return strings.Map(func(r rune) rune {
		switch r {
		case ' ', '_', '-':
			return -1
		}
		return unicode.ToLower(r)
	}, s)
}

// alphabeticItems is Unicode's Alphabetic: Lu+Ll+Lt+Lm+Lo+Nl and the Other_
// properties that extend it.
var alphabeticItems = []string{`\p{L}`, `\p{Nl}`, `\p{Other_Alphabetic}`, `\p{Other_Lowercase}`, `\p{Other_Uppercase}`}

// propertyItems returns the regexp2 class items of an Oniguruma property, or
// nil for one not translated (binary properties such as Emoji, script
// aliases, C/Cn).
func propertyItems(name string, inClass bool) []string {
	n := normPropName(name)
	if gc, ok := generalCategories[n]; ok {
		return []string{`\p{` + gc + `}`}
	}
	if sc, ok := scriptNames[n]; ok {
		return []string{`\p{` + sc + `}`}
	}
	switch n {
	case "alphabetic", "alpha":
		return alphabeticItems
	case "whitespace", "space":
		return []string{`\s`}
	case "word":
		return wordSet(inClass).items
	}
	return nil
}

// wordSet is Oniguruma's \w: Alphabetic, marks, decimal digits and
// connector punctuation (no Join_Control). Outside a class (and for \b),
// Oniguruma tests characters below 256 with its Latin-1 table, where ², ³,
// ¹, ¼, ½ and ¾ are word characters too; inside a class it does not.
// Measured on every code point against the reference.
func wordSet(inClass bool) *onigSet {
	items := append(append([]string(nil), alphabeticItems...), `\p{M}`, `\p{Nd}`, `\p{Pc}`)
	if !inClass {
		items = append(items, `\u00B2\u00B3\u00B9\u00BC-\u00BE`)
	}
	return &onigSet{items: items}
}

// onigSet is a set of single characters: a flat class (items, negated by
// neg), or a union, intersection or complement of sets.
type onigSet struct {
	items []string
	neg   bool
	op    byte // 0: flat; '|': union of subs; '&': intersection of subs
	subs  []*onigSet
}

func (s *onigSet) flat() bool { return s.op == 0 }

// emit returns a regexp2 fragment matching one character of s.
func (s *onigSet) emit() string {
	switch s.op {
	case 0:
		if len(s.items) == 1 && s.neg && (s.items[0] == `\s` || s.items[0] == `\d`) {
			return strings.ToUpper(s.items[0])
		}
		if len(s.items) == 1 && !s.neg && strings.HasPrefix(s.items[0], `\`) && !strings.Contains(s.items[0][1:], `\`) && !strings.Contains(s.items[0], "-") {
			return s.items[0]
		}
		if s.neg {
			return "[^" + strings.Join(s.items, "") + "]"
		}
		return "[" + strings.Join(s.items, "") + "]"
	case '&':
		var body string
		if len(s.subs) == 2 && s.subs[0].flat() && s.subs[1].flat() {
			// [A-[B̄]] is A∩B in regexp2 (class subtraction).
			a, b := s.subs[0], s.subs[1]
			body = "[" + neg(a.neg) + strings.Join(a.items, "") + "-[" + neg(!b.neg) + strings.Join(b.items, "") + "]]"
		} else {
			var sb strings.Builder
			sb.WriteString("(?:")
			for _, sub := range s.subs[:len(s.subs)-1] {
				sb.WriteString("(?=" + sub.emit() + ")")
			}
			sb.WriteString(s.subs[len(s.subs)-1].emit() + ")")
			body = sb.String()
		}
		if s.neg {
			return `(?:(?!` + body + `)[\s\S])`
		}
		return body
	}
	parts := make([]string, len(s.subs))
	for i, sub := range s.subs {
		parts[i] = sub.emit()
	}
	body := "(?:" + strings.Join(parts, "|") + ")"
	if s.neg {
		return `(?:(?!` + body + `)[\s\S])`
	}
	return body
}

func neg(b bool) string {
	if b {
		return "^"
	}
	return ""
}

// class translates a bracket expression (pos after '['): items, ranges,
// nested classes (union) and && (intersection), as Oniguruma reads them.
func (t *onigTranslator) class(fold bool) (*onigSet, error) {
	negated := false
	if t.peek(0) == '^' {
		negated = true
		t.pos++
	}
	var operands []*onigSet // intersection operands, each a union
	cur := &onigSet{op: '|'}
	flat := &onigSet{}
	first := true
	closeOperand := func() error {
		if len(flat.items) > 0 {
			cur.subs = append(cur.subs, flat)
		}
		if len(cur.subs) == 0 {
			return t.fail(errOnigUnsupported, "empty operand of && in class")
		}
		operands = append(operands, simplifyUnion(cur))
		cur, flat = &onigSet{op: '|'}, &onigSet{}
		return nil
	}
	for {
		if t.eof() {
			return nil, t.fail(errOnigInvalid, "premature end of char-class")
		}
		c := t.src[t.pos]
		t.pos++
		switch {
		case c == ']' && !first:
			if err := closeOperand(); err != nil {
				return nil, err
			}
			var set *onigSet
			if len(operands) == 1 {
				set = operands[0]
			} else {
				set = &onigSet{op: '&', subs: operands}
			}
			if negated {
				if set.flat() {
					set.neg = !set.neg
				} else {
					set = &onigSet{op: set.op, subs: set.subs, neg: !set.neg}
				}
			}
			return set, nil
		case c == '[':
			if t.peek(0) == ':' {
				return nil, t.fail(errOnigUnsupported, "POSIX bracket in class")
			}
			sub, err := t.class(fold)
			if err != nil {
				return nil, err
			}
			if sub.flat() && !sub.neg {
				flat.items = append(flat.items, sub.items...)
			} else {
				cur.subs = append(cur.subs, sub)
			}
		case c == '&' && t.peek(0) == '&':
			t.pos++
			if err := closeOperand(); err != nil {
				return nil, err
			}
		default:
			var lo rune
			if c == '\\' {
				if t.eof() {
					return nil, t.fail(errOnigInvalid, "premature end of char-class")
				}
				if t.peek(0) == 'b' {
					return nil, t.fail(errOnigUnsupported, `\b in class`)
				}
				set, r, err := t.escapeItem(fold, true)
				if err != nil {
					return nil, err
				}
				if set != nil {
					if t.peek(0) == '-' && t.peek(1) != ']' && t.peek(1) != -1 {
						return nil, t.fail(errOnigInvalid, "unmatched range specifier in char-class")
					}
					if set.flat() && !set.neg {
						flat.items = append(flat.items, set.items...)
					} else {
						cur.subs = append(cur.subs, set)
					}
					first = false
					continue
				}
				lo = r
			} else {
				lo = c
			}
			hi := lo
			if t.peek(0) == '-' && t.peek(1) != ']' && t.peek(1) != -1 {
				t.pos++
				h := t.src[t.pos]
				t.pos++
				switch h {
				case '\\':
					if t.eof() {
						return nil, t.fail(errOnigInvalid, "premature end of char-class")
					}
					set, r, err := t.escapeItem(fold, true)
					if err != nil {
						return nil, err
					}
					if set != nil {
						return nil, t.fail(errOnigInvalid, "unmatched range specifier in char-class")
					}
					h = r
				case '[':
					return nil, t.fail(errOnigUnsupported, "range to a nested class")
				}
				hi = h
				if hi < lo {
					return nil, t.fail(errOnigInvalid, "empty range in char class")
				}
				if t.peek(0) == '-' && t.peek(1) != ']' {
					return nil, t.fail(errOnigUnsupported, "range followed by '-'")
				}
			}
			items, err := rangeItems(lo, hi, fold)
			if err != nil {
				return nil, t.fail(errOnigUnsupported, "%v", err)
			}
			flat.items = append(flat.items, items...)
		}
		first = false
	}
}

// simplifyUnion merges a union's flat positive members into one.
func simplifyUnion(u *onigSet) *onigSet {
	merged := &onigSet{}
	var rest []*onigSet
	for _, s := range u.subs {
		if s.flat() && !s.neg {
			merged.items = append(merged.items, s.items...)
		} else {
			rest = append(rest, s)
		}
	}
	if len(rest) == 0 {
		return merged
	}
	if len(merged.items) > 0 {
		rest = append([]*onigSet{merged}, rest...)
	}
	if len(rest) == 1 {
		return rest[0]
	}
	return &onigSet{op: '|', subs: rest}
}

// rangeItems is the class items of lo-hi, case-insensitively under fold
// (ASCII only: other ranges may hold letters with full case folds).
func rangeItems(lo, hi rune, fold bool) ([]string, error) {
	if fold {
		if hi >= utf8.RuneSelf {
			return nil, fmt.Errorf("case-insensitive non-ASCII class range")
		}
		var items []string
		for r := lo; r <= hi; r++ {
			set, _, _ := foldedRune(r)
			if set == nil {
				items = append(items, classLiteral(r))
			} else {
				items = append(items, set.items...)
			}
		}
		return items, nil
	}
	if lo == hi {
		return []string{classLiteral(lo)}, nil
	}
	return []string{classLiteral(lo) + "-" + classLiteral(hi)}, nil
}
