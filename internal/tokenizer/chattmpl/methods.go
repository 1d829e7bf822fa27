package chattmpl

import (
	"fmt"
	"strings"
	"unicode"
	"unicode/utf8"

	"golang.org/x/text/cases"
	"golang.org/x/text/language"
)

// Methods of strings, dicts and lists that templates call, with Python's
// semantics; a method Python has but this file lacks is undefined, so
// calling it fails the render.

// dictMethod returns the bound dict method name of d (nil when there is
// none, or when the sandbox hides it).
func dictMethod(d *Dict, name string) builtin {
	switch name {
	case "get":
		return func(c *caller, args []any, kw *Dict) (any, error) {
			if len(args) == 0 || len(args) > 2 {
				return nil, fmt.Errorf("%w: get expected 1 or 2 arguments", ErrRender)
			}
			if k, ok := args[0].(string); ok {
				if v, ok := d.m[k]; ok {
					return v, nil
				}
			}
			if len(args) > 1 {
				return args[1], nil
			}
			return nil, nil
		}
	case "items", "keys", "values":
		return func(c *caller, args []any, kw *Dict) (any, error) {
			out := make([]any, len(d.keys))
			for i, k := range d.keys {
				switch name {
				case "items":
					out[i] = tuple{k, d.m[k]}
				case "keys":
					out[i] = k
				default:
					out[i] = d.m[k]
				}
			}
			return dictView{kind: name, items: out}, c.r.build(out)
		}
	case "copy":
		return func(c *caller, args []any, kw *Dict) (any, error) {
			out := NewDict()
			for _, k := range d.keys {
				out.Set(k, d.m[k])
			}
			return out, c.r.build(out)
		}
	}
	return nil
}

// listMethod returns the bound list (or tuple) method name of l.
func listMethod(l []any, name string) builtin {
	switch name {
	case "index":
		return func(c *caller, args []any, _ *Dict) (any, error) {
			if err := c.r.scan(size(l)); err != nil {
				return nil, err
			}
			work := 0
			for i, x := range l {
				if len(args) > 0 && equalN(x, args[0], &work) {
					return int64(i), nil
				}
			}
			return nil, fmt.Errorf("%w: value is not in list", ErrRender)
		}
	case "count":
		return func(c *caller, args []any, _ *Dict) (any, error) {
			if err := c.r.scan(size(l)); err != nil {
				return nil, err
			}
			n, work := int64(0), 0
			for _, x := range l {
				if len(args) > 0 && equalN(x, args[0], &work) {
					n++
				}
			}
			return n, nil
		}
	case "copy":
		return func(c *caller, args []any, _ *Dict) (any, error) {
			out := append([]any{}, l...)
			return out, c.r.build(out)
		}
	}
	return nil
}

// strArg is the string argument i (def when absent or None).
func strArg(args []any, i int, def string) string {
	if i < len(args) && args[i] != nil && !isUndefined(args[i]) {
		return toStr(args[i])
	}
	return def
}

// optStr is argument i (or keyword name) as a string, ok=false when
// absent or None; a non-string is an error, as in Python.
func optStr(args []any, kw *Dict, i int, name string) (string, bool, error) {
	v, ok := kwArg(kw, args, i, name)
	if !ok || v == nil {
		return "", false, nil
	}
	s, isStr := v.(string)
	if !isStr {
		return "", false, fmt.Errorf("%w: %s argument must be str or None, not %s", ErrRender, name, typeName(v))
	}
	return s, true, nil
}

// optInt is argument i (or keyword name) as an int (def when absent).
func optInt(args []any, kw *Dict, i int, name string, def int64) (int64, error) {
	v, ok := kwArg(kw, args, i, name)
	if !ok {
		return def, nil
	}
	n, isInt := intValue(v)
	if !isInt {
		return 0, fmt.Errorf("%w: '%s' object cannot be interpreted as an integer", ErrRender, typeName(v))
	}
	return n, nil
}

// stringMethod returns the bound Python str method name of s (nil when
// there is none).
func stringMethod(s, name string) builtin {
	f := strMethods[name]
	if f == nil {
		return nil
	}
	return func(c *caller, args []any, kw *Dict) (any, error) {
		if err := c.r.scan(len(s)); err != nil {
			return nil, err
		}
		if name == "join" && len(args) == 1 {
			// Python joins any iterable: a generator (map, select,
			// reverse), a dict (its keys), a dict view, a string.
			items, err := c.r.iterate(args[0])
			if err != nil {
				return nil, fmt.Errorf("%w: can only join an iterable", ErrRender)
			}
			args = []any{items}
		}
		return f(s, args, kw)
	}
}

type strMethod func(s string, args []any, kw *Dict) (any, error)

var strMethods map[string]strMethod

func init() {
	strip := func(name string) strMethod {
		return func(s string, args []any, kw *Dict) (any, error) {
			cut, ok, err := optStr(args, kw, 0, "chars")
			if err != nil {
				return nil, err
			}
			return strStrip(s, name, cut, ok), nil
		}
	}
	affix := func(name string) strMethod {
		return func(s string, args []any, kw *Dict) (any, error) {
			return strAffix(s, name, firstArg(args))
		}
	}
	split := func(name string) strMethod {
		return func(s string, args []any, kw *Dict) (any, error) { return strSplit(s, name, args, kw) }
	}
	find := func(name string) strMethod {
		return func(s string, args []any, kw *Dict) (any, error) {
			sub, ok, err := optStr(args, kw, 0, "sub")
			if err != nil || !ok {
				return nil, fmt.Errorf("%w: %s() needs a string argument", ErrRender, name)
			}
			if len(args) > 1 {
				return nil, fmt.Errorf("%w: %s() with start or end is not supported", ErrRender, name)
			}
			i := strings.Index(s, sub)
			if name == "rfind" || name == "rindex" {
				i = strings.LastIndex(s, sub)
			}
			if i < 0 && (name == "index" || name == "rindex") {
				return nil, fmt.Errorf("%w: substring not found", ErrRender)
			}
			if i < 0 {
				return int64(-1), nil
			}
			return int64(utf8.RuneCountInString(s[:i])), nil // Python counts characters
		}
	}
	pred := func(name string) strMethod {
		return func(s string, _ []any, _ *Dict) (any, error) { return strPredicate(s, name), nil }
	}
	strMethods = map[string]strMethod{
		"strip": strip("strip"), "lstrip": strip("lstrip"), "rstrip": strip("rstrip"),
		"upper":      func(s string, _ []any, _ *Dict) (any, error) { return pyUpper(s), nil },
		"lower":      func(s string, _ []any, _ *Dict) (any, error) { return pyLower(s), nil },
		"title":      func(s string, _ []any, _ *Dict) (any, error) { return pyTitle(s), nil },
		"capitalize": func(s string, _ []any, _ *Dict) (any, error) { return capitalize(s), nil },
		"startswith": affix("startswith"), "endswith": affix("endswith"),
		"split": split("split"), "rsplit": split("rsplit"),
		"splitlines": func(s string, args []any, kw *Dict) (any, error) {
			keep, _ := kwArg(kw, args, 0, "keepends")
			lines := splitLines(s, truthy(keep))
			out := make([]any, len(lines))
			for i, l := range lines {
				out[i] = l
			}
			return out, nil
		},
		"replace": func(s string, args []any, kw *Dict) (any, error) {
			n, err := optInt(args, kw, 2, "count", -1)
			if err != nil {
				return nil, err
			}
			return strReplace(s, strArg(args, 0, ""), strArg(args, 1, ""), n)
		},
		"find": find("find"), "rfind": find("rfind"), "index": find("index"), "rindex": find("rindex"),
		"count": func(s string, args []any, _ *Dict) (any, error) {
			return int64(strings.Count(s, strArg(args, 0, ""))), nil
		},
		"join": func(s string, args []any, _ *Dict) (any, error) {
			items, ok := seqItems(firstArg(args))
			if !ok {
				return nil, fmt.Errorf("%w: can only join an iterable", ErrRender)
			}
			parts := make([]string, len(items))
			n := 0
			for i, x := range items {
				p, ok := x.(string)
				if !ok {
					return nil, fmt.Errorf("%w: sequence item %d: expected str instance, %s found", ErrRender, i, typeName(x))
				}
				parts[i], n = p, n+len(p)+len(s)
			}
			if err := checkLen(n); err != nil {
				return nil, err
			}
			return strings.Join(parts, s), nil
		},
		"zfill": func(s string, args []any, _ *Dict) (any, error) {
			w, err := optInt(args, nil, 0, "width", 0)
			if err != nil {
				return nil, err
			}
			n := int64(utf8.RuneCountInString(s))
			if w <= n {
				return s, nil
			}
			if err := checkLen(int(min(w, maxValue+1))); err != nil {
				return nil, err
			}
			sign := ""
			if s != "" && (s[0] == '+' || s[0] == '-') {
				sign, s = s[:1], s[1:]
			}
			return sign + strings.Repeat("0", int(w-n)) + s, nil
		},
		"center": func(s string, args []any, _ *Dict) (any, error) { return pad(s, args, "center") },
		"ljust":  func(s string, args []any, _ *Dict) (any, error) { return pad(s, args, "ljust") },
		"rjust":  func(s string, args []any, _ *Dict) (any, error) { return pad(s, args, "rjust") },
		"removeprefix": func(s string, args []any, _ *Dict) (any, error) {
			return strings.TrimPrefix(s, strArg(args, 0, "")), nil
		},
		"removesuffix": func(s string, args []any, _ *Dict) (any, error) {
			return strings.TrimSuffix(s, strArg(args, 0, "")), nil
		},
		"format":  func(s string, args []any, kw *Dict) (any, error) { return strFormat(s, args, kw) },
		"isdigit": pred("isdigit"), "isalpha": pred("isalpha"), "isspace": pred("isspace"),
		"isupper": pred("isupper"), "islower": pred("islower"), "isalnum": pred("isalnum"),
	}
}

// pyIsSpace is Python's str.isspace for one character.
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }

// strStrip is str.strip/lstrip/rstrip(cut): whitespace when !hasCut.
func strStrip(s, name, cut string, hasCut bool) string {
	trim := pyIsSpace
	if hasCut {
		trim = func(r rune) bool { return strings.ContainsRune(cut, r) }
	}
	switch name {
	case "lstrip":
		return strings.TrimLeftFunc(s, trim)
	case "rstrip":
		return strings.TrimRightFunc(s, trim)
	}
	return strings.TrimFunc(s, trim)
}

// strAffix is str.startswith/endswith(arg), arg a string or a tuple of them.
func strAffix(s, name string, arg any) (bool, error) {
	cands, ok := arg.(tuple)
	if !ok {
		cands = tuple{arg}
	}
	for _, c := range cands {
		p, ok := c.(string)
		if !ok {
			return false, fmt.Errorf("%w: %s first arg must be str or a tuple of str, not %s", ErrRender, name, typeName(c))
		}
		if name == "startswith" && strings.HasPrefix(s, p) || name == "endswith" && strings.HasSuffix(s, p) {
			return true, nil
		}
	}
	return false, nil
}

// strSplit is str.split/rsplit(sep=None, maxsplit=-1).
func strSplit(s, name string, args []any, kw *Dict) (any, error) {
	sep, hasSep, err := optStr(args, kw, 0, "sep")
	if err != nil {
		return nil, err
	}
	limit, err := optInt(args, kw, 1, "maxsplit", -1)
	if err != nil {
		return nil, err
	}
	var parts []string
	switch {
	case hasSep && sep == "":
		return nil, fmt.Errorf("%w: empty separator", ErrRender)
	case !hasSep:
		parts = splitSpace(s, name == "rsplit", limit)
	case limit < 0:
		parts = strings.Split(s, sep)
	case name == "rsplit":
		parts = rsplitN(s, sep, int(limit)+1)
	default:
		parts = strings.SplitN(s, sep, int(limit)+1)
	}
	out := make([]any, len(parts))
	for i, p := range parts {
		out[i] = p
	}
	return out, nil
}

// splitSpace is str.split() / rsplit() without a separator: runs of
// whitespace separate, at most limit splits (limit < 0: all).
func splitSpace(s string, fromRight bool, limit int64) []string {
	if limit < 0 {
		return strings.FieldsFunc(s, pyIsSpace)
	}
	var out []string
	if !fromRight {
		for len(out) < int(limit) {
			s = strings.TrimLeftFunc(s, pyIsSpace)
			i := strings.IndexFunc(s, pyIsSpace)
			if s == "" || i < 0 {
				break
			}
			out, s = append(out, s[:i]), s[i:]
		}
		if s = strings.TrimLeftFunc(s, pyIsSpace); s != "" {
			out = append(out, s)
		}
		return out
	}
	for len(out) < int(limit) {
		s = strings.TrimRightFunc(s, pyIsSpace)
		i := strings.LastIndexFunc(s, pyIsSpace)
		if s == "" || i < 0 {
			break
		}
		_, w := utf8.DecodeRuneInString(s[i:])
		out, s = append([]string{s[i+w:]}, out...), s[:i]
	}
	if s = strings.TrimRightFunc(s, pyIsSpace); s != "" {
		out = append([]string{s}, out...)
	}
	return out
}

func rsplitN(s, sep string, n int) []string {
	var out []string
	for len(out) < n-1 {
		i := strings.LastIndex(s, sep)
		if i < 0 {
			break
		}
		out = append([]string{s[i+len(sep):]}, out...)
		s = s[:i]
	}
	return append([]string{s}, out...)
}

// splitLines is str.splitlines(keepends).
func splitLines(s string, keep bool) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); {
		r, w := utf8.DecodeRuneInString(s[i:])
		switch r {
		case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			end := i + w
			if r == '\r' && end < len(s) && s[end] == '\n' {
				end++
			}
			if keep {
				out = append(out, s[start:end])
			} else {
				out = append(out, s[start:i])
			}
			start, i = end, end
			continue
		}
		i += w
	}
	if start < len(s) {
		out = append(out, s[start:])
	}
	return out
}

// countLines counts the line boundaries splitLines would cut at (at most
// one more than maxValue, to check a size before splitting).
func countLines(s string) int {
	n := 0
	for _, r := range s {
		switch r {
		case '\n', '\r', '\v', '\f', 0x1c, 0x1d, 0x1e, 0x85, 0x2028, 0x2029:
			n++
		}
	}
	return n
}

// strReplace is str.replace(old, new, count), refusing a result beyond
// maxValue before building it.
func strReplace(s, old, repl string, n int64) (string, error) {
	if len(repl) > len(old) {
		k := int64(strings.Count(s, old))
		if n >= 0 {
			k = min(k, n)
		}
		if err := checkLen(int(min(int64(len(s))+k*int64(len(repl)-len(old)), maxValue+1))); err != nil {
			return "", err
		}
	}
	return strings.Replace(s, old, repl, int(max(n, -1))), nil
}

// pad is str.center/ljust/rjust(width, fillchar=' ').
func pad(s string, args []any, how string) (any, error) {
	w, err := optInt(args, nil, 0, "width", 0)
	if err != nil {
		return nil, err
	}
	fill := " "
	if len(args) > 1 {
		f, ok := args[1].(string)
		if !ok || utf8.RuneCountInString(f) != 1 {
			return nil, fmt.Errorf("%w: the fill character must be exactly one character long", ErrRender)
		}
		fill = f
	}
	n := int64(utf8.RuneCountInString(s))
	if w <= n {
		return s, nil
	}
	if err := checkLen(int(min(w*int64(len(fill)), maxValue+1))); err != nil {
		return nil, err
	}
	total := w - n
	left := int64(0)
	switch how {
	case "center":
		left = total/2 + (total & w & 1) // CPython's rounding
	case "rjust":
		left = total
	}
	return strings.Repeat(fill, int(left)) + s + strings.Repeat(fill, int(total-left)), nil
}

// pyDigitNo are the characters that Python's str.isdigit takes beyond the
// decimal digits (Nd): those of Numeric_Type Digit, all of category No
// (superscripts, subscripts, circled and parenthesized digits, Ethiopic
// digits, …). Unicode 14 (Python 3.11's unicodedata), generated with
// unicodedata.digit(c) is not None and category(c) != 'Nd'.
var pyDigitNo = &unicode.RangeTable{
	R16: []unicode.Range16{
		{0x00b2, 0x00b3, 1}, {0x00b9, 0x00b9, 1}, {0x1369, 0x1371, 1}, {0x19da, 0x19da, 1}, {0x2070, 0x2070, 1},
		{0x2074, 0x2079, 1}, {0x2080, 0x2089, 1}, {0x2460, 0x2468, 1}, {0x2474, 0x247c, 1}, {0x2488, 0x2490, 1},
		{0x24ea, 0x24ea, 1}, {0x24f5, 0x24fd, 1}, {0x24ff, 0x24ff, 1}, {0x2776, 0x277e, 1}, {0x2780, 0x2788, 1},
		{0x278a, 0x2792, 1},
	},
	R32: []unicode.Range32{
		{0x10a40, 0x10a43, 1}, {0x10e60, 0x10e68, 1}, {0x11052, 0x1105a, 1}, {0x1f100, 0x1f10a, 1},
	},
	LatinOffset: 2,
}

// isPyDigit is Python's str.isdigit for one character: Numeric_Type
// Decimal (Nd) or Digit.
func isPyDigit(r rune) bool {
	return unicode.IsDigit(r) || unicode.Is(pyDigitNo, r)
}

func strPredicate(s, name string) bool {
	if s == "" {
		return false
	}
	cased := false
	for _, r := range s {
		switch name {
		case "isdigit":
			if !isPyDigit(r) {
				return false
			}
		case "isalpha":
			if !unicode.IsLetter(r) {
				return false
			}
		case "isalnum":
			if !unicode.IsLetter(r) && !unicode.IsNumber(r) {
				return false
			}
		case "isspace":
			if !pyIsSpace(r) {
				return false
			}
		case "isupper":
			if isLowerCased(r) || unicode.IsTitle(r) {
				return false
			}
			cased = cased || isUpperCased(r)
		case "islower":
			if isUpperCased(r) || unicode.IsTitle(r) {
				return false
			}
			cased = cased || isLowerCased(r)
		}
	}
	if name == "isupper" || name == "islower" {
		return cased
	}
	return true
}

func isLowerCased(r rune) bool { return unicode.IsLower(r) || unicode.Is(unicode.Other_Lowercase, r) }
func isUpperCased(r rune) bool { return unicode.IsUpper(r) || unicode.Is(unicode.Other_Uppercase, r) }

// isCased is Unicode's Cased property, which Python's title() uses.
func isCased(r rune) bool { return isLowerCased(r) || isUpperCased(r) || unicode.IsTitle(r) }

func firstArg(args []any) any {
	if len(args) == 0 {
		return undefined
	}
	return args[0]
}

// pyUpper and pyLower are Python's str.upper and str.lower: full Unicode
// case mappings ('ß' → 'SS', 'İ' → 'i̇', a final 'Σ' → 'ς'), which
// golang.org/x/text/cases implements (strings.ToUpper maps one rune to
// one rune).
func pyUpper(s string) string {
	if isASCII(s) {
		return strings.ToUpper(s)
	}
	return cases.Upper(language.Und).String(s)
}

func pyLower(s string) string {
	if isASCII(s) {
		return strings.ToLower(s)
	}
	return cases.Lower(language.Und).String(s)
}

// pyTitleRune is the full titlecase mapping of one character.
func pyTitleRune(r rune) string {
	if r < utf8.RuneSelf {
		return strings.ToUpper(string(r))
	}
	return cases.Title(language.Und, cases.NoLower).String(string(r))
}

// pyTitle is Python's str.title: each run of cased characters starts with
// its titlecase and continues in lowercase.
func pyTitle(s string) string {
	var sb strings.Builder
	for s != "" {
		i := strings.IndexFunc(s, isCased)
		if i < 0 {
			sb.WriteString(s)
			break
		}
		sb.WriteString(s[:i])
		s = s[i:]
		j := strings.IndexFunc(s, func(r rune) bool { return !isCased(r) })
		if j < 0 {
			j = len(s)
		}
		sb.WriteString(capitalize(s[:j]))
		s = s[j:]
	}
	return sb.String()
}

// capitalize is Python's str.capitalize: the first character in titlecase,
// the rest in lowercase.
func capitalize(s string) string {
	r, w := utf8.DecodeRuneInString(s)
	if s == "" {
		return s
	}
	low := pyLower(s)
	first := pyLower(s[:w])
	if !strings.HasPrefix(low, first) { // lowering is per character but for a final sigma
		return pyTitleRune(r) + pyLower(s[w:])
	}
	return pyTitleRune(r) + low[len(first):]
}
