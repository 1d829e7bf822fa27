package chattmpl

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"testing"
)

// fromJSONStd is the encoding/json token-stream decoder FromJSON replaced:
// the reference FromJSON is held to.
func fromJSONStd(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	v, err := stdValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("trailing data after JSON value")
	}
	return v, nil
}

func stdValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch t := tok.(type) {
	case json.Delim:
		switch t {
		case '{':
			d := NewDict()
			for dec.More() {
				kt, err := dec.Token()
				if err != nil {
					return nil, err
				}
				k, _ := kt.(string)
				v, err := stdValue(dec)
				if err != nil {
					return nil, err
				}
				d.Set(k, v)
			}
			_, err := dec.Token()
			return d, err
		case '[':
			l := []any{}
			for dec.More() {
				v, err := stdValue(dec)
				if err != nil {
					return nil, err
				}
				l = append(l, v)
			}
			_, err := dec.Token()
			return l, err
		}
		return nil, fmt.Errorf("unexpected %v", t)
	case json.Number:
		if i, err := t.Int64(); err == nil {
			return i, nil
		}
		return t.Float64()
	default:
		return t, nil
	}
}

// sameValue is deep equality of decoded values, Dict key order included.
func sameValue(a, b any) bool {
	switch x := a.(type) {
	case *Dict:
		y, ok := b.(*Dict)
		if !ok || len(x.keys) != len(y.keys) || len(x.m) != len(y.m) {
			return false
		}
		for i, k := range x.keys {
			if y.keys[i] != k || !sameValue(x.m[k], y.m[k]) {
				return false
			}
		}
		return true
	case []any:
		y, ok := b.([]any)
		if !ok || len(x) != len(y) || (x == nil) != (y == nil) {
			return false
		}
		for i := range x {
			if !sameValue(x[i], y[i]) {
				return false
			}
		}
		return true
	case float64:
		y, ok := b.(float64)
		return ok && (x == y && math.Signbit(x) == math.Signbit(y))
	}
	return a == b
}

var jsonCases = []string{
	`{"a":1,"b":[true,false,null],"c":{"d":"e"},"a":2}`,
	`[]`, `{}`, ` [ 1 , -0 , -0.0 , 1e3 , 1E-2 , 9223372036854775807 , 9223372036854775808 , -9223372036854775809 ] `,
	`"plain"`, `"esc \" \\ \/ \b \f \n \r \t \u00e9 \u20AC \ud83d\ude00"`,
	`"lone \ud83d x \ude00 \ud83d\u0041 \udc00\ud800"`, "\"bad utf8 \xff\xfe \xc3\x28 ok é\"",
	`[{"role":"system","content":"You are helpful."},{"role":"user","content":[{"type":"text","text":"hi"}]}]`,
	``, ` `, `[`, `[1,]`, `{"a"}`, `{"a":}`, `{"a":1,}`, `01`, `1.`, `.5`, `-`, `1e`, `1e+`, `+1`, `tru`, `nul`, `falsey`,
	`[1] [2]`, `[1] x`, `"a` + "\x01" + `"`, `"\x"`, `"\u12"`, `"\u12g4"`, `1e400`, `-1e400`, `[1e400]`, `{"a":1e999}`,
	`"unterminated`, `{"a":1 "b":2}`, `[1 2]`, `"\`, `"\u`, "\"tab\there\"", `{1:2}`, `NaN`, `[-]`, `[--1]`, `0x10`,
}

func TestFromJSONMatchesEncodingJSON(t *testing.T) {
	for _, c := range append([]string{strings.Repeat("[", 10000) + strings.Repeat("]", 10000)}, jsonCases...) {
		checkFromJSON(t, []byte(c))
	}
	// Every special byte at every offset of the 8-byte scan.
	for _, sp := range []string{`\"`, `\n`, `\u00e9`, "\x7f", "\x80", "é", "\x1f", "\x00", "\xff", " ", "~", "!", "#", "[", "\\"} {
		for n := range 20 {
			for at := 0; at <= n; at++ {
				a := strings.Repeat("a", n)
				checkFromJSON(t, []byte(`["`+a[:at]+sp+a[at:]+`"]`))
			}
		}
	}
	// The one difference: encoding/json's token stream has no depth limit.
	if _, err := FromJSON([]byte(strings.Repeat("[", 10001) + strings.Repeat("]", 10001))); err == nil {
		t.Fatal("FromJSON took 10,001 nested arrays")
	}
}

func checkFromJSON(t *testing.T, b []byte) {
	t.Helper()
	got, err := FromJSON(b)
	want, werr := fromJSONStd(b)
	if (err != nil) != (werr != nil) {
		t.Fatalf("FromJSON(%.80q): err %v, encoding/json err %v", b, err, werr)
	}
	if err == nil && !sameValue(got, want) {
		t.Fatalf("FromJSON(%.80q) = %#v, encoding/json %#v", b, got, want)
	}
}

func FuzzFromJSON(f *testing.F) {
	for _, c := range jsonCases {
		f.Add([]byte(c))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		if bytes.Count(b, []byte("["))+bytes.Count(b, []byte("{")) > maxJSONDepth {
			t.Skip("beyond the depth limit encoding/json's token stream does not have")
		}
		checkFromJSON(t, b)
	})
}

// BenchmarkFromJSON decodes a chat request's messages (a ~600-word system
// message and a question) with FromJSON and with the encoding/json token
// stream it replaced.
func BenchmarkFromJSON(b *testing.B) {
	var sb strings.Builder
	for i := range 600 {
		fmt.Fprintf(&sb, "word%d ", i%97)
	}
	msgs, _ := json.Marshal([]map[string]string{{"role": "system", "content": sb.String()}, {"role": "user", "content": "what now?"}})
	for _, d := range []struct {
		name string
		fn   func([]byte) (any, error)
	}{{"scan", FromJSON}, {"encoding-json", fromJSONStd}} {
		b.Run(d.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				if _, err := d.fn(msgs); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
