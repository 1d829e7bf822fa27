package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"testing"
)

func FuzzSSEReader(f *testing.F) {
	for _, s := range []string{"data: {}\n\ndata: [DONE]\n\n", ": c\ndata: [1]\r\n\r\ndata: [DONE]\n\n", "data: {\n\n", "event: x\n\n", "data: [DONE]\n\nx"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkSSERoundTrip(t, ReadAll, in) })
}

// FuzzResponsesSSEReader: the Responses form (event lines, no [DONE]) holds
// to the same rules, and its payloads read back the same from the plain
// form.
func FuzzResponsesSSEReader(f *testing.F) {
	for _, s := range []string{"event: response.created\ndata: {}\n\n", "data: {}\n\nevent: x\ndata: [1]\r\n\r\n", "event: x\n\n", "event: x\nevent: y\ndata: {}\n\n", "", "data: [DONE]\n\n"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) { checkSSERoundTrip(t, ReadAllResponses, in) })
}

// checkSSERoundTrip reads in with read: no panic, errors wrap ErrBadStream,
// payloads are JSON, and an accepted stream re-encoded in the plain form
// reads back the same payloads.
func checkSSERoundTrip(t *testing.T, read func(io.Reader, func([]byte) error) error, in []byte) {
	var payloads [][]byte
	err := read(bytes.NewReader(in), func(p []byte) error {
		payloads = append(payloads, bytes.Clone(p))
		return nil
	})
	if err != nil {
		if !errors.Is(err, ErrBadStream) {
			t.Fatalf("error %v does not wrap ErrBadStream", err)
		}
		return
	}
	var out []byte
	for _, p := range payloads {
		if !json.Valid(p) {
			t.Fatalf("accepted non-JSON payload %q", p)
		}
		out = AppendEvent(out, p)
	}
	var again [][]byte
	if err := ReadAll(bytes.NewReader(AppendDone(out)), func(p []byte) error { again = append(again, bytes.Clone(p)); return nil }); err != nil {
		t.Fatalf("re-encoded stream rejected: %v", err)
	}
	if !reflect.DeepEqual(payloads, again) {
		t.Fatal("round trip changed the payloads")
	}
}

func FuzzPrompt(f *testing.F) {
	for _, s := range []string{`"x"`, `["a","b"]`, `[1,2]`, `[[1],[2,3]]`, `[]`, `[1,"a"]`, `null`, `[[1],"x"]`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		var p Prompt
		if err := json.Unmarshal(in, &p); err != nil {
			return
		}
		if p.Len() == 0 || (len(p.Texts) > 0) == (len(p.Tokens) > 0) {
			t.Fatalf("accepted %q as %+v", in, p)
		}
		out, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		var q Prompt
		if err := json.Unmarshal(out, &q); err != nil || !reflect.DeepEqual(p, q) {
			t.Fatalf("round trip %q → %s → %+v (%v)", in, out, q, err)
		}
	})
}

func FuzzDecodeRequests(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"x","max_tokens":3}`,
		`{"model":"m","prompt":[[1,2]],"stream":true,"stream_options":{"include_usage":true}}`,
		`{"model":"m","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"stop":"\n"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if _, err := DecodeCompletionRequest(in); err != nil && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("completion error %v does not wrap ErrBadRequest", err)
		}
		if _, err := DecodeChatRequest(in); err != nil && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("chat error %v does not wrap ErrBadRequest", err)
		}
		if _, err := DecodeTokenizeRequest(in); err != nil && !errors.Is(err, ErrBadRequest) {
			t.Fatalf("tokenize error %v does not wrap ErrBadRequest", err)
		}
		DecodeError(in)
	})
}

func FuzzAppendString(f *testing.F) {
	for _, s := range []string{"", "a\"b", "\x00\xff", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		out := AppendString(nil, s)
		var back string
		if err := json.Unmarshal(out, &back); err != nil {
			t.Fatalf("%q → %s: %v", s, out, err)
		}
		want, _ := json.Marshal(s) // encoding/json also maps invalid UTF-8 to U+FFFD
		var w string
		_ = json.Unmarshal(want, &w)
		if back != w {
			t.Fatalf("%q: got %q want %q", s, back, w)
		}
	})
}

// FuzzParseTokenList checks the hand-written token-list scanner against
// encoding/json: both accept exactly the same lists with the same values.
func FuzzParseTokenList(f *testing.F) {
	for _, s := range []string{`[1,2,3]`, `[ 0 , 4294967295 ]`, `[]`, `[4294967296]`, `[01]`, `[1,]`, `[-1]`, `[1e2]`, "[\t1\n]"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		ids, err := parseTokenList(in)
		var ref []uint32
		refErr := json.Unmarshal(in, &ref)
		if refErr == nil && bytes.HasPrefix(bytes.TrimSpace(in), []byte("[")) {
			if err != nil || !reflect.DeepEqual(ids, ref) && !(len(ids) == 0 && len(ref) == 0) {
				t.Fatalf("%q: got %v %v, encoding/json %v", in, ids, err, ref)
			}
		}
		if err == nil && refErr != nil {
			t.Fatalf("%q: accepted %v, encoding/json rejects: %v", in, ids, refErr)
		}
	})
}

// FuzzLenientSSEReader checks the lenient reader against the WHATWG
// algorithm applied literally (specExpect) and against the strict reader
// (checkLenient), in both forms.
func FuzzLenientSSEReader(f *testing.F) {
	for _, s := range lenientSeeds {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(checkLenient)
}
