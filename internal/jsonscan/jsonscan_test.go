package jsonscan

import (
	"encoding/json"
	"errors"
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
