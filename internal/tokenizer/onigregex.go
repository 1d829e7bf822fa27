package tokenizer

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/dlclark/regexp2"
)

// tokenizers compiles every regex of a tokenizer.json (Split patterns,
// Replace normalizers and decoders) with Oniguruma: Oniguruma's syntax,
// ONIG_OPTION_NONE, UTF-8. regexp2 reads another dialect (.NET's), and a
// pattern handed to it unchanged can load and then match differently: `$` is
// end of line in Oniguruma and end of text in .NET, `\w` and `\b` have other
// word characters, `(?i)` runs to the end of its group across `|`, classes
// nest and intersect (`[a[b]]`, `[X&&[^Y]]`) where .NET reads literal
// brackets, `{,n}` is an interval. translateOnig rewrites a pattern into an
// equivalent regexp2 pattern, construct by construct; what it cannot
// translate exactly it refuses with ErrUnsupported (the ingress then keys that
// model on the engine's /tokenize) rather than guess, and a pattern Oniguruma
// itself rejects (unbalanced brackets, a quantifier with nothing to repeat) is
// ErrInvalid.

// compileOnig compiles an Oniguruma pattern from tokenizer.json for regexp2.
func compileOnig(pattern string) (*regexp2.Regexp, error) {
	tr, err := translateOnig(pattern)
	if err != nil {
		return nil, err
	}
	re, err := regexp2.Compile(tr, regexp2.None)
	if err != nil {
		return nil, fmt.Errorf("regex %q: %w: regexp2 rejects its translation: %v", pattern, ErrUnsupported, err)
	}
	re.MatchTimeout = regexTimeout
	return re, nil
}

var (
	errOnigInvalid     = errors.New("invalid")
	errOnigUnsupported = errors.New("unsupported")
)

// translateOnig returns the regexp2 pattern matching what pattern matches in
// Oniguruma.
func translateOnig(pattern string) (string, error) {
	if !utf8.ValidString(pattern) {
		return "", fmt.Errorf("regex %q: %w: invalid UTF-8", pattern, ErrInvalid)
	}
	t := &onigTranslator{src: []rune(pattern)}
	err := t.alternation(false)
	if err == nil && t.pos < len(t.src) { // a ')' without its '('
		err = t.fail(errOnigInvalid, "unmatched close parenthesis")
	}
	if err != nil {
		var te *onigError
		if errors.As(err, &te) && te.kind == errOnigInvalid {
			return "", fmt.Errorf("regex %q: %w: %s at %d", pattern, ErrInvalid, te.msg, te.pos)
		}
		if errors.As(err, &te) {
			return "", fmt.Errorf("regex %q: %w: %s at %d (not translated to regexp2)", pattern, ErrUnsupported, te.msg, te.pos)
		}
		return "", err
	}
	return string(t.out), nil
}

type onigError struct {
	kind error
	msg  string
	pos  int
}

func (e *onigError) Error() string { return e.msg }

type onigTranslator struct {
	src []rune
	pos int
	out []byte
}

func (t *onigTranslator) fail(kind error, format string, args ...any) error {
	return &onigError{kind: kind, msg: fmt.Sprintf(format, args...), pos: t.pos}
}

func (t *onigTranslator) eof() bool { return t.pos >= len(t.src) }

func (t *onigTranslator) peek(k int) rune {
	if t.pos+k < len(t.src) {
		return t.src[t.pos+k]
	}
	return -1
}

// alternation translates alternatives up to an unconsumed ')' or the end.
func (t *onigTranslator) alternation(fold bool) error {
	for {
		if err := t.sequence(fold); err != nil {
			return err
		}
		if t.eof() || t.peek(0) == ')' {
			return nil
		}
		t.pos++ // '|'
		t.out = append(t.out, '|')
	}
}

// atomKind says what a quantifier may follow.
type atomKind uint8

const (
	atomNone      atomKind = iota // start of a sequence: a quantifier is an error
	atomChar                      // one character (literal, class, escape, '.')
	atomGroup                     // a group
	atomAssertion                 // anchor or look-around: not repeatable here
)

// sequence translates atoms and their quantifiers up to '|', ')' or the end.
func (t *onigTranslator) sequence(fold bool) error {
	var prevFold rune // the folded ASCII letter just emitted, for multi-char folds
	for !t.eof() {
		c := t.peek(0)
		if c == '|' || c == ')' {
			return nil
		}
		if t.quantifierAt() {
			// Oniguruma: "target of repeat operator is not specified" (a
			// quantified atom consumed its quantifiers below).
			return t.fail(errOnigInvalid, "target of repeat operator is not specified")
		}
		start := len(t.out)
		kind, letter, optRest, err := t.atom(fold)
		if err != nil {
			return err
		}
		if optRest != nil { // (?i) etc.: the rest of the group under new options
			t.out = append(t.out, "(?:"...)
			if err := t.alternation(*optRest); err != nil {
				return err
			}
			t.out = append(t.out, ')')
			return nil
		}
		// Oniguruma matches a folded string against multi-character case
		// folds ("ss" ~ ß, "st" ~ ﬆ, "ff"/"fi"/"fl" ~ ligatures); regexp2
		// has no such folds.
		if fold && prevFold != 0 && letter != 0 && multiFoldPair(prevFold, letter) {
			return t.fail(errOnigUnsupported, "case-insensitive %c%c (multi-character case fold)", prevFold, letter)
		}
		if fold && prevFold != 0 && kind == atomGroup && (prevFold == 's' || prevFold == 'f') {
			return t.fail(errOnigUnsupported, "case-insensitive %c before a group (multi-character case fold)", prevFold)
		}
		prevFold = letter
		// quantifiers of this atom
		q, ok, err := t.quantifier()
		if err != nil {
			return err
		}
		if ok {
			if kind == atomAssertion {
				return t.fail(errOnigUnsupported, "repeated assertion")
			}
			if q.possessive {
				t.out = append(t.out[:start], append([]byte("(?>"), t.out[start:]...)...)
				t.out = append(t.out, q.text...)
				t.out = append(t.out, ')')
			} else {
				t.out = append(t.out, q.text...)
			}
			// Oniguruma repeats a repetition (a**, a{2}{3}); regexp2 refuses it.
			if t.quantifierAt() {
				return t.fail(errOnigUnsupported, "nested repeat operator")
			}
			prevFold = 0
		}
	}
	return nil
}

type onigQuant struct {
	text       string
	possessive bool
}

// quantifierAt reports whether a quantifier starts at pos.
func (t *onigTranslator) quantifierAt() bool {
	switch t.peek(0) {
	case '*', '+', '?':
		return true
	case '{':
		_, _, _, _, ok := parseInterval(t.src[t.pos:])
		return ok
	}
	return false
}

// quantifier consumes a quantifier at pos, if there is one.
func (t *onigTranslator) quantifier() (onigQuant, bool, error) {
	save := t.pos
	var q onigQuant
	switch t.peek(0) {
	case '*', '+', '?':
		q.text = string(t.peek(0))
		t.pos++
		switch t.peek(0) {
		case '?':
			q.text += "?"
			t.pos++
		case '+':
			q.possessive = true
			t.pos++
		}
		return q, true, nil
	case '{':
		lo, hi, fixed, n, ok := parseInterval(t.src[t.pos:])
		if !ok {
			return q, false, nil // a literal '{'
		}
		if hi >= 0 && lo > hi {
			return q, false, t.fail(errOnigInvalid, "upper bound smaller than lower bound in repeat range")
		}
		if lo > 100000 || hi > 100000 {
			return q, false, t.fail(errOnigInvalid, "too big number for repeat range")
		}
		t.pos += n
		switch {
		case hi < 0:
			q.text = "{" + strconv.Itoa(lo) + ",}"
		case fixed:
			q.text = "{" + strconv.Itoa(lo) + "}"
		default:
			q.text = "{" + strconv.Itoa(lo) + "," + strconv.Itoa(hi) + "}"
		}
		switch t.peek(0) {
		case '?':
			if fixed { // Oniguruma: {n}? is ({n})?, not a lazy {n}
				t.pos = save
				return q, false, t.fail(errOnigUnsupported, "{n}? (optional fixed repeat)")
			}
			q.text += "?"
			t.pos++
		case '+': // Oniguruma: {n,m}+ is a repeat of the repeat, not possessive
			t.pos = save
			return q, false, t.fail(errOnigUnsupported, "{n,m}+ (nested repeat)")
		}
		return q, true, nil
	}
	return q, false, nil
}

// parseInterval reads {n}, {n,}, {n,m} or {,m} (Oniguruma's abbreviated
// lower bound) at s[0] == '{'; anything else is a literal brace.
func parseInterval(s []rune) (lo, hi int, fixed bool, n int, ok bool) {
	i := 1
	num := func() (int, bool) {
		start, v := i, 0
		for i < len(s) && s[i] >= '0' && s[i] <= '9' {
			if v < 1e7 {
				v = v*10 + int(s[i]-'0')
			}
			i++
		}
		return v, i > start
	}
	lo, hasLo := num()
	if i < len(s) && s[i] == '}' {
		if !hasLo {
			return 0, 0, false, 0, false
		}
		return lo, lo, true, i + 1, true
	}
	if i >= len(s) || s[i] != ',' {
		return 0, 0, false, 0, false
	}
	i++
	hi, hasHi := num()
	if i >= len(s) || s[i] != '}' || !hasLo && !hasHi {
		return 0, 0, false, 0, false
	}
	if !hasHi {
		hi = -1
	}
	return lo, hi, false, i + 1, true
}

func multiFoldPair(a, b rune) bool {
	switch string([]rune{a, b}) {
	case "ss", "st", "ff", "fi", "fl":
		return true
	}
	return false
}

// atom translates one atom. letter is the lower-case ASCII letter of a
// case-folded literal (for multi-character folds); optRest is set by an
// option switch such as (?i) that applies to the rest of the group.
func (t *onigTranslator) atom(fold bool) (kind atomKind, letter rune, optRest *bool, err error) {
	c := t.src[t.pos]
	t.pos++
	switch c {
	case '(':
		return t.group(fold)
	case '[':
		set, err := t.class(fold)
		if err != nil {
			return 0, 0, nil, err
		}
		t.out = append(t.out, set.emit()...)
		return atomChar, 0, nil, nil
	case '.':
		t.out = append(t.out, '.') // both: any character but '\n'
		return atomChar, 0, nil, nil
	case '^': // Oniguruma: beginning of line, but not after a final '\n'
		t.out = append(t.out, `(?:\A|(?<=\n)(?!\z))`...)
		return atomAssertion, 0, nil, nil
	case '$': // Oniguruma: end of line, (?=\n|\z)
		t.out = append(t.out, "(?m:$)"...)
		return atomAssertion, 0, nil, nil
	case '\\':
		return t.escape(fold)
	}
	letter, err = t.literal(c, fold)
	return atomChar, letter, nil, err
}

// literal emits the character r (case-insensitively under fold).
func (t *onigTranslator) literal(r rune, fold bool) (rune, error) {
	if fold {
		set, letter, err := foldedRune(r)
		if err != nil {
			return 0, t.fail(errOnigUnsupported, "%v", err)
		}
		if set != nil {
			t.out = append(t.out, set.emit()...)
			return letter, nil
		}
	}
	t.out = appendLiteral(t.out, r)
	return 0, nil
}

// foldedRune is the set a case-insensitive r matches: nil when r has no case
// (it matches itself). Only ASCII is translated: other letters' full case
// folds (ligatures, final sigma, combining sequences) are refused.
func foldedRune(r rune) (*onigSet, rune, error) {
	if r >= utf8.RuneSelf {
		return nil, 0, fmt.Errorf("case-insensitive non-ASCII %q", r)
	}
	if !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z') {
		return nil, 0, nil
	}
	set := &onigSet{}
	for f := r; ; {
		set.items = append(set.items, classLiteral(f))
		if f = unicode.SimpleFold(f); f == r {
			break
		}
	}
	return set, unicode.ToLower(r), nil
}

func appendLiteral(b []byte, r rune) []byte {
	switch {
	case r < 0x20 || r == 0x7f:
		return fmt.Appendf(b, `\x%02X`, r)
	case r < utf8.RuneSelf && !('a' <= r && r <= 'z' || 'A' <= r && r <= 'Z' || '0' <= r && r <= '9' || r == '_'):
		return append(b, '\\', byte(r))
	}
	return utf8.AppendRune(b, r)
}

func classLiteral(r rune) string { return string(appendLiteral(nil, r)) }

// group translates what follows '('.
func (t *onigTranslator) group(fold bool) (atomKind, rune, *bool, error) {
	kind := atomGroup
	if t.peek(0) == '?' {
		t.pos++
		switch c := t.peek(0); {
		case c == ':' || c == '>' || c == '=' || c == '!':
			t.pos++
			t.out = append(t.out, '(', '?', byte(c))
			if c == '=' || c == '!' {
				kind = atomAssertion
			}
		case c == '<' && (t.peek(1) == '=' || t.peek(1) == '!'):
			t.out = append(t.out, '(', '?', '<', byte(t.peek(1)))
			t.pos += 2
			kind = atomAssertion
		case c == '<' || c == '\'': // named group: captures matter to nothing we support
			end := '>'
			if c == '\'' {
				end = '\''
			}
			t.pos++
			for !t.eof() && t.peek(0) != end {
				if r := t.peek(0); !(r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r)) {
					return 0, 0, nil, t.fail(errOnigInvalid, "invalid group name")
				}
				t.pos++
			}
			if t.eof() {
				return 0, 0, nil, t.fail(errOnigInvalid, "invalid group name")
			}
			t.pos++
			t.out = append(t.out, "(?:"...)
		case c == 'i' || c == '-':
			newFold, whole, err := t.options(fold)
			if err != nil {
				return 0, 0, nil, err
			}
			if whole {
				return atomNone, 0, &newFold, nil
			}
			t.out = append(t.out, "(?:"...)
			fold = newFold
		default:
			return 0, 0, nil, t.fail(errOnigUnsupported, "group (?%c", c)
		}
	} else {
		t.out = append(t.out, "(?:"...) // captures matter to nothing we support
	}
	if err := t.alternation(fold); err != nil {
		return 0, 0, nil, err
	}
	if t.eof() {
		return 0, 0, nil, t.fail(errOnigInvalid, "end pattern with unmatched parenthesis")
	}
	t.pos++
	t.out = append(t.out, ')')
	return kind, 0, nil, nil
}

// options reads "i)", "-i)", "i:" … after "(?"; only the i flag is
// translated (as explicit classes, so regexp2 never folds). whole reports
// "(?i)", which applies to the rest of the enclosing group.
func (t *onigTranslator) options(fold bool) (newFold, whole bool, err error) {
	on := true
	for !t.eof() {
		switch c := t.peek(0); c {
		case 'i':
			fold = on
		case '-':
			on = false
		case ')':
			t.pos++
			return fold, true, nil
		case ':':
			t.pos++
			return fold, false, nil
		default:
			return false, false, t.fail(errOnigUnsupported, "option %q", c)
		}
		t.pos++
	}
	return false, false, t.fail(errOnigInvalid, "end pattern in group")
}

// escape translates what follows a backslash outside a class.
func (t *onigTranslator) escape(fold bool) (atomKind, rune, *bool, error) {
	if t.eof() {
		return 0, 0, nil, t.fail(errOnigInvalid, "end pattern at escape")
	}
	c := t.src[t.pos]
	switch c {
	case 'b':
		t.pos++
		w := wordSet(false).emit()
		t.out = append(t.out, "(?:(?<="+w+")(?!"+w+")|(?<!"+w+")(?="+w+"))"...)
		return atomAssertion, 0, nil, nil
	case 'B':
		t.pos++
		w := wordSet(false).emit()
		t.out = append(t.out, "(?:(?<="+w+")(?="+w+")|(?<!"+w+")(?!"+w+"))"...)
		return atomAssertion, 0, nil, nil
	case 'A', 'z', 'Z': // same in both
		t.pos++
		t.out = append(t.out, '\\', byte(c))
		return atomAssertion, 0, nil, nil
	}
	set, r, err := t.escapeItem(fold, false)
	if err != nil {
		return 0, 0, nil, err
	}
	if set != nil {
		t.out = append(t.out, set.emit()...)
		return atomChar, 0, nil, nil
	}
	letter, err := t.literal(r, fold)
	return atomChar, letter, nil, err
}

// escapeItem translates an escape (pos after the backslash) that stands for
// a set of characters or for one character, in or outside a class.
func (t *onigTranslator) escapeItem(fold, inClass bool) (*onigSet, rune, error) {
	c := t.src[t.pos]
	t.pos++
	switch c {
	case 'd', 'D', 's', 'S':
		// \d is Nd and \s White_Space in both (Go's unicode.IsSpace is
		// White_Space).
		return &onigSet{items: []string{`\` + strings.ToLower(string(c))}, neg: unicode.IsUpper(c)}, 0, nil
	case 'w', 'W':
		if fold {
			return nil, 0, t.fail(errOnigUnsupported, "case-insensitive \\%c", c)
		}
		s := wordSet(inClass)
		s.neg = c == 'W'
		return s, 0, nil
	case 'h', 'H': // hexadecimal digit
		if fold {
			return nil, 0, t.fail(errOnigUnsupported, "case-insensitive \\%c", c)
		}
		return &onigSet{items: []string{"0-9A-Fa-f"}, neg: c == 'H'}, 0, nil
	case 'p', 'P':
		if fold {
			return nil, 0, t.fail(errOnigUnsupported, "case-insensitive \\%c", c)
		}
		return t.property(c == 'P', inClass)
	case 't':
		return nil, '\t', nil
	case 'n':
		return nil, '\n', nil
	case 'r':
		return nil, '\r', nil
	case 'f':
		return nil, '\f', nil
	case 'v':
		return nil, '\v', nil
	case 'a':
		return nil, '\a', nil
	case 'e':
		return nil, 0x1b, nil
	case 'x':
		if t.peek(0) == '{' {
			end := t.pos + 1
			for end < len(t.src) && t.src[end] != '}' {
				end++
			}
			if end >= len(t.src) {
				return nil, 0, t.fail(errOnigInvalid, "invalid code point value")
			}
			v, err := strconv.ParseUint(string(t.src[t.pos+1:end]), 16, 32)
			if err != nil || v > unicode.MaxRune || 0xD800 <= v && v <= 0xDFFF {
				return nil, 0, t.fail(errOnigUnsupported, "code point \\x{%s}", string(t.src[t.pos+1:end]))
			}
			t.pos = end + 1
			return nil, rune(v), nil
		}
		return t.hexRune(2, 1)
	case 'u':
		return t.hexRune(4, 4)
	case '0':
		v, n := 0, 0
		for n < 2 && t.peek(0) >= '0' && t.peek(0) <= '7' {
			v = v*8 + int(t.peek(0)-'0')
			t.pos++
			n++
		}
		return nil, rune(v), nil
	}
	if c < utf8.RuneSelf && (unicode.IsLetter(c) || unicode.IsDigit(c)) {
		// backreferences, \k \g \K \G \R \X \N \O \c \o \y …
		return nil, 0, t.fail(errOnigUnsupported, "escape \\%c", c)
	}
	return nil, c, nil // an escaped symbol or non-ASCII character is itself
}

// hexRune reads min to max hex digits.
func (t *onigTranslator) hexRune(max, min int) (*onigSet, rune, error) {
	v, n := 0, 0
	for n < max {
		d := t.peek(0)
		var x int
		switch {
		case '0' <= d && d <= '9':
			x = int(d - '0')
		case 'a' <= d && d <= 'f':
			x = int(d-'a') + 10
		case 'A' <= d && d <= 'F':
			x = int(d-'A') + 10
		default:
			if n < min {
				return nil, 0, t.fail(errOnigUnsupported, "short hex escape")
			}
			return nil, rune(v), nil
		}
		v = v*16 + x
		t.pos++
		n++
	}
	if 0xD800 <= v && v <= 0xDFFF {
		return nil, 0, t.fail(errOnigUnsupported, "surrogate code point")
	}
	return nil, rune(v), nil
}
