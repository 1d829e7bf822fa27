package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"
)

// TestLenientSSEReader: spec-valid framings the strict reader refuses are
// read (and marked non-canonical); what vLLM writes is read as the strict
// reader reads it (and is canonical); truncations and non-JSON data are
// still errors.
func TestLenientSSEReader(t *testing.T) {
	const a, b = `{"a":1}`, `{"b":2}`
	for _, c := range []struct {
		name     string
		in       string
		named    bool
		want     []string // nil with err: refused
		err      bool
		nonCanon bool
	}{
		{"vLLM's form", "data: " + a + "\n\n: ping\ndata: " + b + "\r\n\r\ndata: [DONE]\n\n", false, []string{a, b}, false, false},
		{"named form", "event: x\ndata: " + a + "\n\n", true, []string{a}, false, false},
		{"no space after the colon", "data:" + a + "\n\ndata:[DONE]\n\n", false, []string{a}, false, true},
		{"id, event and retry fields", "id: 0\nevent: message\nretry: 100\ndata: " + a + "\n\nid: 1\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"unknown field, field without a colon", "foo: bar\nnocolon\ndata: " + a + "\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"multi-line data", "data: {\"a\":\ndata: 1}\n\ndata: [DONE]\n\n", false, []string{"{\"a\":\n1}"}, false, true},
		{"comment inside an event", "data: " + a + "\n: c\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"lone CR line ends", "data: " + a + "\r\rdata: [DONE]\r\r", false, []string{a}, false, true},
		{"byte order mark", "\uFEFFdata: " + a + "\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"blank lines between events", "\n\ndata: " + a + "\n\n\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"event without data", "event: ping\n\ndata: " + a + "\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"keep-alive data", "data:\n\ndata:  \n\ndata: " + a + "\n\ndata: [DONE]\n\n", false, []string{a}, false, true},
		{"[DONE] with spaces", "data: " + a + "\n\ndata:  [DONE] \n\n", false, []string{a}, false, true},
		{"[DONE] without its blank line", "data: " + a + "\n\ndata: [DONE]\n", false, []string{a}, false, true},
		{"[DONE] cut before its line end", "data: " + a + "\n\ndata: [DONE]", false, []string{a}, false, true},
		{"comments after [DONE]", "data: [DONE]\n\n: bye\n\n", false, nil, false, true},
		{"two spaces: the second is data", "data:  " + a + "\n\ndata: [DONE]\n\n", false, []string{" " + a}, false, false},
		{"named, cut between events", "data: " + a + "\n\nevent: x\n", true, []string{a}, false, true},
		// Still errors.
		{"no [DONE]", "data: " + a + "\n\n", false, nil, true, false},
		{"empty", "", false, nil, true, false},
		{"named, no event", ": c\n\n", true, nil, true, false},
		{"cut inside an event", "data: " + a + "\n\ndata: {\"b\"", false, nil, true, false},
		{"cut before the blank line", "data: " + a + "\n\ndata: " + b + "\n", true, nil, true, false},
		{"not JSON", "data: hello\n\ndata: [DONE]\n\n", false, nil, true, false},
		{"event after [DONE]", "data: [DONE]\n\ndata: " + a + "\n\n", false, nil, true, false},
		{"Data is not data", "Data: " + a + "\n\n", false, nil, true, false},
	} {
		var got []string
		nc, err := ReadAllLenient(strings.NewReader(c.in), c.named, func(p []byte) error { got = append(got, string(p)); return nil })
		if c.err {
			if !errors.Is(err, ErrBadStream) {
				t.Errorf("%s: err %v, want ErrBadStream", c.name, err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) || nc != c.nonCanon {
			t.Errorf("%s: payloads %q, non-canonical %v, err %v; want %q, %v", c.name, got, nc, err, c.want, c.nonCanon)
		}
	}
}

// A lenient reader returns each event as soon as its blank line is read,
// whatever the line ends: a server that waits for the client after an event
// does not stall it (with lone CRs too, where the next byte decides whether
// the CR was a CRLF's).
func TestLenientSSEReaderDoesNotReadAhead(t *testing.T) {
	for _, end := range []string{"\n", "\r\n", "\r"} {
		pr, pw := io.Pipe()
		s := NewLenientSSEReader(pr, false)
		go pw.Write([]byte("data: {}" + end + end))
		p, err := s.Next()
		if err != nil || string(p) != "{}" {
			t.Fatalf("line end %q: %q %v", end, p, err)
		}
		go func() { pw.Write([]byte("data: [DONE]" + end + end)); pw.Close() }()
		if _, err := s.Next(); err != io.EOF {
			t.Fatalf("line end %q: end: %v", end, err)
		}
		if s.NonCanonical() != (end == "\r") {
			t.Errorf("line end %q: non-canonical %v", end, s.NonCanonical())
		}
	}
}

// A read error is returned wrapped, not as a framing error: the caller tells
// a cut connection from a malformed stream.
func TestLenientSSEReaderReadError(t *testing.T) {
	r := io.MultiReader(strings.NewReader("data: {}\n\ndata: {"), iotestErr{io.ErrUnexpectedEOF})
	_, err := ReadAllLenient(r, false, func([]byte) error { return nil })
	if !errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, ErrBadStream) {
		t.Fatalf("err %v, want io.ErrUnexpectedEOF and not ErrBadStream", err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// specExpect is what a lenient read of in must give, computed separately
// from the reader: the WHATWG algorithm applied literally (lines split on
// CRLF, LF or CR; a leading BOM dropped; comments skipped; field and value
// split at the first colon, one space dropped; data lines joined; events
// dispatched by blank lines), then the reader's OpenAI rules (blank data
// skipped; [DONE] ends the stream, nothing but blank data after it; each
// other event's data JSON; the end of input with data not dispatched an
// error unless it is [DONE]; the plain form ends with [DONE], the named one
// with at least one event).
func specExpect(in []byte, named bool) (payloads []string, ok bool) {
	s := strings.TrimPrefix(string(in), "\uFEFF")
	var lines []string
	for len(s) > 0 {
		i := strings.IndexAny(s, "\r\n")
		if i < 0 {
			lines = append(lines, s) // the last line, cut: its data is pending
			break
		}
		lines = append(lines, s[:i])
		if s[i] == '\r' && i+1 < len(s) && s[i+1] == '\n' {
			i++
		}
		s = s[i+1:]
	}
	var events []string
	data, has := "", false
	for _, l := range lines {
		if l == "" {
			if has {
				events = append(events, strings.TrimSuffix(data, "\n"))
			}
			data, has = "", false
			continue
		}
		if l[0] == ':' {
			continue
		}
		field, value, found := strings.Cut(l, ":")
		if found {
			value = strings.TrimPrefix(value, " ")
		}
		if field == "data" {
			data += value + "\n"
			has = true
		}
	}
	done, n := false, 0
	for _, e := range events {
		t := strings.Trim(e, " \t\r\n")
		switch {
		case t == "":
		case done:
			return nil, false
		case t == "[DONE]":
			done = true
			n++
		case !json.Valid([]byte(e)):
			return nil, false
		default:
			payloads = append(payloads, e)
			n++
		}
	}
	if has {
		if done || strings.Trim(data, " \t\r\n") != "[DONE]" {
			return nil, false
		}
		done = true
	}
	return payloads, done || (named && n > 0)
}

// checkLenient reads in leniently and checks it against specExpect and the
// strict reader: the same payloads as the spec's events; a stream the strict
// reader accepts is read the same and is canonical, and a canonical stream
// is one the strict reader accepts.
func checkLenient(t *testing.T, in []byte, named bool) {
	var got []string
	nc, err := ReadAllLenient(bytes.NewReader(in), named, func(p []byte) error { got = append(got, string(p)); return nil })
	if err != nil && !errors.Is(err, ErrBadStream) {
		t.Fatalf("error %v does not wrap ErrBadStream", err)
	}
	want, ok := specExpect(in, named)
	if (err == nil) != ok || (ok && !reflect.DeepEqual(got, want)) {
		t.Fatalf("%q (named %v): read %q, err %v; the spec gives %q, ok %v", in, named, got, err, want, ok)
	}
	strict := ReadAll
	if named {
		strict = ReadAllResponses
	}
	var sgot []string
	serr := strict(bytes.NewReader(in), func(p []byte) error { sgot = append(sgot, string(p)); return nil })
	if serr == nil && (err != nil || nc || !reflect.DeepEqual(got, sgot)) {
		t.Fatalf("%q (named %v): the strict reader reads %q; lenient %q, non-canonical %v, err %v", in, named, sgot, got, nc, err)
	}
	if err == nil && !nc && serr != nil {
		t.Fatalf("%q (named %v): read as canonical, but the strict reader refuses it: %v", in, named, serr)
	}
}

func TestLenientSSEReaderMatchesSpec(t *testing.T) {
	for _, s := range lenientSeeds {
		for _, named := range []bool{false, true} {
			checkLenient(t, []byte(s), named)
		}
	}
}

var lenientSeeds = []string{
	"data: {}\n\ndata: [DONE]\n\n",
	"data:{}\n\ndata:[DONE]\n\n",
	"id: 0\ndata: {}\n\ndata: [DONE]\n\n",
	"event: x\r\ndata: [1]\r\n\r\n",
	"data: [1,\ndata: 2]\r\rdata: [DONE]\r",
	"\uFEFF: hi\n\ndata: \"x\"\n\n",
	"data\n\ndata: {}\n\ndata: [DONE]",
	"data: [DONE]\n\n: c\n",
	"data: {}\n\ndata: [DONE]\n\ndata: {}\n\n",
	"retry: 10\nevent: e\nfoo\n\n",
	"data: {\n\n",
	"data: {}\x00\n\ndata: [DONE]\n\n",
	"data: {}\r\n\r",
}
