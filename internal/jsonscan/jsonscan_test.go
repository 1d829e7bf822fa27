package jsonscan

import (
	"encoding/json"
	"errors"
	"math"
	"reflect"
	"strings"
	"testing"
)

// FuzzScanner: the scanner accepts exactly the JSON objects encoding/json
// accepts (short ones, where the fuzzer covers them), and every error wraps
// ErrMalformed.
func FuzzScanner(f *testing.F) {
	for _, s := range []string{`{}`, `{"a":1}`, `{"a":[1,2,{"b":"c\n"}],"d":-0.5e+3}`, `{"a":tru}`, `{"a":"\u12"}`, `{"a":01}`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		err := ForEachMember(b, func(k, v []byte, _, _ int) error {
			if len(v) > 0 && v[0] == '"' {
				_ = AppendUnquote(nil, v)
			}
			return nil
		})
		if err != nil && !errors.Is(err, ErrMalformed) {
			t.Fatalf("error %v does not wrap ErrMalformed", err)
		}
		valid := json.Valid(b)
		if err == nil && !valid {
			t.Fatalf("scanner accepted invalid %q", b)
		}
		if err != nil && valid && len(b) < 100 {
			i := SkipWS(b, 0)
			if i < len(b) && b[i] == '{' {
				t.Fatalf("scanner rejected valid %q: %v", b, err)
			}
		}
	})
}

// skipStringRef is SkipString as it was before the eight-byte scan (one byte
// at a time): the reference FuzzSkipString compares it with.
func skipStringRef(b []byte, i int) (int, bool, error) {
	start := i
	i++
	esc := false
	for i < len(b) {
		c := b[i]
		switch {
		case c == '"':
			return i + 1, esc, nil
		case c == '\\':
			esc = true
			if i+1 >= len(b) {
				return 0, false, jerr("unterminated string", start)
			}
			switch b[i+1] {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				i += 2
			case 'u':
				if i+6 > len(b) || !isHex4(b[i+2:i+6]) {
					return 0, false, jerr("invalid \\u escape in string", i)
				}
				i += 6
			default:
				return 0, false, jerr("invalid escape in string", i)
			}
		case c < 0x20:
			return 0, false, jerr("control character in string", i)
		default:
			i++
		}
	}
	return 0, false, jerr("unterminated string", start)
}

// sameSkip checks that SkipString and the byte-at-a-time reference agree on
// the string starting at b[i] (end, escapes and error, offset included).
func sameSkip(t *testing.T, b []byte, i int) {
	t.Helper()
	end, esc, err := SkipString(b, i)
	rend, resc, rerr := skipStringRef(b, i)
	if end != rend || esc != resc || !reflect.DeepEqual(err, rerr) {
		t.Fatalf("SkipString(%q, %d) = %d, %v, %v; the byte scan gives %d, %v, %v", b, i, end, esc, err, rend, resc, rerr)
	}
}

// TestSkipStringWords puts each kind of byte that stops the eight-byte scan
// (and a few that do not) at every position of strings around the word size.
func TestSkipStringWords(t *testing.T) {
	for _, sp := range []string{`"`, `\n`, `\u00e9`, `\x`, `\u12`, "\x00", "\x1f", "\n", "\x7f", "é", "\xff", " ", `\`} {
		for n := 0; n <= 20; n++ {
			for at := 0; at <= n; at++ {
				s := []byte(`"` + strings.Repeat("a", at) + sp + strings.Repeat("b", n-at))
				sameSkip(t, s, 0)
				sameSkip(t, append(s, '"'), 0)
				sameSkip(t, append([]byte(`xx`), append(s, `"tail`...)...), 2)
			}
		}
	}
}

// FuzzSkipString: the eight-byte scan agrees with the byte-at-a-time one.
func FuzzSkipString(f *testing.F) {
	for _, s := range []string{`""`, `"abc"`, `"abcdefghijklmnop"`, `"abcdefg\"hij"`, `"a\u00e9bcdefghijk"`, "\"abcdefgh\x01ij\"", `"abcdefghij`, `"é€😀 plain text"`} {
		f.Add([]byte(s), uint8(0))
	}
	f.Fuzz(func(t *testing.T, b []byte, at uint8) {
		i := int(at)
		if i >= len(b) {
			return
		}
		sameSkip(t, b, i)
	})
}

// ParseUint reads integers and whole numbers written as floats (pydantic's
// lax int); fractions, negatives and values above max are refused.
func TestParseUint(t *testing.T) {
	for _, c := range []struct {
		in   string
		max  uint64
		want uint64
		ok   bool
	}{
		{"0", 10, 0, true}, {"7", 10, 7, true}, {"10", 10, 10, true}, {"11", 10, 0, false},
		{"2.0", 10, 2, true}, {"2.00", 10, 2, true}, {"1e1", 10, 10, true}, {"25e-1", 10, 0, false},
		{"2.5", 10, 0, false}, {"-0", 10, 0, true}, {"-0.0", 10, 0, true}, {"-1", 10, 0, false},
		{"1e2", 10, 0, false}, {"18446744073709551615", math.MaxUint64, math.MaxUint64, true},
		{"18446744073709551616", math.MaxUint64, 0, false}, {"1e300", math.MaxUint64, 0, false},
		{"", 10, 0, false}, {"x", 10, 0, false}, {"1.5e1", 100, 15, true},
	} {
		got, ok := ParseUint([]byte(c.in), c.max)
		if got != c.want || ok != c.ok {
			t.Errorf("ParseUint(%q, %d) = %d, %v; want %d, %v", c.in, c.max, got, ok, c.want, c.ok)
		}
	}
}
