package chattmpl

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// Number filters (int, float, abs, round) and Python's number parsing they
// follow.

// filterInt is Jinja2's int(value, default=0, base=10): int(value, base)
// for strings, int(value) for numbers, else int(float(value)), else the
// default.
func filterInt(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, ok := kwArg(kw, args, 0, "default")
	if !ok {
		def = int64(0)
	}
	base, err := optInt(args, kw, 1, "base", 10)
	if err != nil {
		return nil, err
	}
	switch x := v.(type) {
	case int64:
		return x, nil
	case bool:
		n, _ := intValue(x)
		return n, nil
	case float64:
		return truncFloat(x, def)
	case string:
		if n, ok, err := pyParseInt(x, base); ok || err != nil {
			return n, err
		}
		if f, ok := pyParseFloat(x); ok {
			return truncFloat(f, def)
		}
		return def, nil
	case *undefinedT:
		return nil, errUndefined("int()")
	}
	return def, nil
}

func truncFloat(f float64, def any) (any, error) {
	if math.IsNaN(f) || math.IsInf(f, 0) {
		return def, nil
	}
	if math.Abs(f) >= 1<<63 {
		return nil, errOverflow
	}
	return int64(f), nil
}

// pyParseInt is Python's int(s, base) (base 0: from the prefix); ok is
// false where Python raises ValueError.
func pyParseInt(s string, base int64) (int64, bool, error) {
	s = strings.TrimFunc(pyDecimalToASCII(s), pyIsSpace)
	if base != 0 && (base < 2 || base > 36) {
		return 0, false, fmt.Errorf("%w: int() base must be >= 2 and <= 36, or 0", ErrRender)
	}
	neg := false
	if s != "" && (s[0] == '+' || s[0] == '-') {
		neg, s = s[0] == '-', s[1:]
	}
	if len(s) >= 2 && s[0] == '0' {
		p := map[byte]int64{'x': 16, 'X': 16, 'o': 8, 'O': 8, 'b': 2, 'B': 2}[s[1]]
		if p != 0 && (base == 0 || base == p) {
			s, base = strings.TrimPrefix(s[2:], "_"), p
		}
	}
	if base == 0 {
		if len(s) > 1 && s[0] == '0' && strings.Trim(s, "0_") != "" {
			return 0, false, nil // base 0 refuses leading zeros
		}
		base = 10
	}
	if s == "" || s[0] == '_' || s[len(s)-1] == '_' || strings.Contains(s, "__") {
		return 0, false, nil
	}
	u, err := strconv.ParseUint(strings.ReplaceAll(s, "_", ""), int(base), 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return 0, false, errOverflow
		}
		return 0, false, nil
	}
	if neg {
		if u > 1<<63 {
			return 0, false, errOverflow
		}
		return -int64(u), true, nil
	}
	if u > math.MaxInt64 {
		return 0, false, errOverflow
	}
	return int64(u), true, nil
}

// pyDecimalToASCII is CPython's first step in int(s) and float(s)
// (_PyUnicode_TransformDecimalAndSpaceToASCII): every decimal digit (Nd:
// '٣', '𝟙') becomes its ASCII digit, every other whitespace a space, and
// any other non-ASCII character '?', which no parse accepts.
func pyDecimalToASCII(s string) string {
	ascii := true
	for i := 0; i < len(s); i++ {
		ascii = ascii && s[i] < utf8.RuneSelf
	}
	if ascii {
		return s
	}
	b := make([]byte, 0, len(s))
	for _, r := range s {
		switch {
		case r < utf8.RuneSelf:
			b = append(b, byte(r))
		case pyIsSpace(r):
			b = append(b, ' ')
		case unicode.IsDigit(r):
			b = append(b, '0'+byte(decimalValue(r)))
		default:
			b = append(b, '?')
		}
	}
	return string(b)
}

// decimalValue is the value of a decimal digit (Nd): Unicode assigns them
// in runs of ten from 0 to 9, so it is the distance from the start of the
// table range holding r, modulo 10 (a range may hold several runs, as the
// mathematical digits do).
func decimalValue(r rune) int {
	for _, rg := range unicode.Nd.R16 {
		if r >= rune(rg.Lo) && r <= rune(rg.Hi) {
			return int(r-rune(rg.Lo)) % 10
		}
	}
	for _, rg := range unicode.Nd.R32 {
		if r >= rune(rg.Lo) && r <= rune(rg.Hi) {
			return int(r-rune(rg.Lo)) % 10
		}
	}
	return 0
}

// pyParseFloat is Python's float(s) for a string.
func pyParseFloat(s string) (float64, bool) {
	s = strings.TrimFunc(pyDecimalToASCII(s), pyIsSpace)
	t := strings.ToLower(strings.TrimLeft(s, "+-"))
	switch t {
	case "inf", "infinity", "nan":
		f, err := strconv.ParseFloat(s, 64)
		return f, err == nil
	}
	// digits, '.', exponent and underscores between digits only (no hex, no
	// Go-only forms)
	prevDigit := false
	for i := 0; i < len(t); i++ {
		ch := t[i]
		switch {
		case ch >= '0' && ch <= '9':
			prevDigit = true
			continue
		case ch == '_':
			if !prevDigit || i+1 >= len(t) || t[i+1] < '0' || t[i+1] > '9' {
				return 0, false
			}
		case ch == '.' || ch == 'e' || ch == '+' || ch == '-':
		default:
			return 0, false
		}
		prevDigit = false
	}
	f, err := strconv.ParseFloat(strings.ReplaceAll(s, "_", ""), 64)
	if err != nil {
		if ne, ok := err.(*strconv.NumError); ok && ne.Err == strconv.ErrRange {
			return f, true // Python gives inf (or 0) too
		}
		return 0, false
	}
	return f, true
}

func filterFloat(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	def, ok := kwArg(kw, args, 0, "default")
	if !ok {
		def = 0.0
	}
	switch x := v.(type) {
	case *undefinedT:
		return nil, errUndefined("float()")
	case string:
		if f, ok := pyParseFloat(x); ok {
			return f, nil
		}
		return def, nil
	}
	if f, ok := num(v); ok {
		return f, nil
	}
	return def, nil
}

func filterAbs(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	switch x := v.(type) {
	case int64:
		if x == math.MinInt64 {
			return nil, errOverflow
		}
		if x < 0 {
			return -x, nil
		}
		return x, nil
	case bool:
		n, _ := intValue(x)
		return n, nil
	case float64:
		return math.Abs(x), nil
	}
	return nil, fmt.Errorf("%w: bad operand type for abs(): '%s'", ErrRender, typeName(v))
}

// filterRound is Jinja2's round(value, precision=0, method='common'):
// Python's round() (correctly rounded, ties to even; an int stays an int),
// or math.ceil/floor at the precision.
func filterRound(c *caller, name string, v any, args []any, kw *Dict) (any, error) {
	prec, err := optInt(args, kw, 0, "precision", 0)
	if err != nil {
		return nil, err
	}
	method := "common"
	if x, ok := kwArg(kw, args, 1, "method"); ok {
		method = toStr(x)
	}
	if method != "common" && method != "ceil" && method != "floor" {
		return nil, fmt.Errorf("%w: method must be common, ceil or floor", ErrRender)
	}
	if _, ok := num(v); !ok {
		return nil, fmt.Errorf("%w: type %s doesn't define __round__ method", ErrRender, typeName(v))
	}
	if n, isInt := intValue(v); isInt && method == "common" {
		if prec >= 0 {
			return n, nil
		}
		return nil, fmt.Errorf("%w: round() of an int to negative digits is not supported", ErrRender)
	}
	f, _ := num(v)
	if method != "common" {
		p := math.Pow(10, float64(prec))
		if method == "ceil" {
			return math.Ceil(f*p) / p, nil
		}
		return math.Floor(f*p) / p, nil
	}
	if math.IsInf(f, 0) || math.IsNaN(f) || prec > 300 {
		return f, nil
	}
	if prec < 0 {
		return nil, fmt.Errorf("%w: round() to negative digits is not supported", ErrRender)
	}
	r, err := strconv.ParseFloat(strconv.FormatFloat(f, 'f', int(prec), 64), 64)
	if err != nil {
		return nil, fmt.Errorf("%w: round: %v", ErrRender, err)
	}
	return r, nil
}
