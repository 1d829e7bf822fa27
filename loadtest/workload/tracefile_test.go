package workload

import (
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestTraceTokenBound: every trace reader refuses a row longer than
// MaxTraceTokens, in its prompt or its output, with an error naming the
// line and the bound (a 2·10^9-token Mooncake row made the DES allocate
// 8 GB); a row at the bound is read.
func TestTraceTokenBound(t *testing.T) {
	bound := strconv.Itoa(MaxTraceTokens)
	moon := func(in, out int) string {
		return fmt.Sprintf("{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\n{\"timestamp\": 5, \"input_length\": %d, \"output_length\": %d}\n", in, out)
	}
	bail := func(in, out int) string {
		return fmt.Sprintf("{\"chat_id\": 1, \"timestamp\": 0, \"input_length\": 10, \"output_length\": 1}\n{\"chat_id\": 2, \"timestamp\": 1, \"input_length\": %d, \"output_length\": %d}\n", in, out)
	}
	azure := func(in, out int) string {
		return fmt.Sprintf("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.68,10,1\n2023-11-16 18:15:47.00,%d,%d\n", in, out)
	}
	read := map[string]func(string) ([]Request, error){
		"mooncake": func(s string) ([]Request, error) { return Mooncake{}.Read(strings.NewReader(s)) },
		"bailian":  func(s string) ([]Request, error) { return Mooncake{Bailian: true}.Read(strings.NewReader(s)) },
		"azure":    func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
	}
	form := map[string]func(int, int) string{"mooncake": moon, "bailian": bail, "azure": azure}
	for name, rd := range read {
		f, line := form[name], "line 2"
		if name == "azure" {
			line = "line 3" // after the header
		}
		for _, c := range []struct{ in, out int }{{2_000_000_000, 1}, {MaxTraceTokens + 1, 1}, {10, 2_000_000_000}, {10, MaxTraceTokens + 1}} {
			_, err := rd(f(c.in, c.out))
			if !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), line) || !strings.Contains(err.Error(), bound) {
				t.Errorf("%s: input %d, output %d: %v, want an error naming %s and the bound %s", name, c.in, c.out, err, line, bound)
			}
		}
		reqs, err := rd(f(MaxTraceTokens, MaxTraceTokens))
		if err != nil || len(reqs) != 2 || reqs[0].PromptTokens+reqs[1].PromptTokens != 10+MaxTraceTokens {
			t.Errorf("%s: a row at the bound: %v", name, err)
		}
	}
	// A default output length past the bound is a configuration error.
	if _, err := (Mooncake{Output: MaxTraceTokens + 1}).Read(strings.NewReader(trace)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), bound) {
		t.Errorf("mooncake default output past the bound: %v", err)
	}
	// ShareGPT's lengths are bounded by MaxContext (prompt + answer),
	// which may not exceed the bound.
	if _, err := (ShareGPT{MaxContext: MaxTraceTokens + 1}).ReadFile("testdata/sharegpt_sample.json"); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), bound) {
		t.Errorf("sharegpt max context past the bound: %v", err)
	}
	if _, err := (ShareGPT{MaxContext: MaxTraceTokens}).ReadFile("testdata/sharegpt_sample.json"); err != nil {
		t.Errorf("sharegpt max context at the bound: %v", err)
	}
}

// traceReaders read the same trace three ways, each from its own bytes.
type traceCase struct {
	name string
	text []byte
	read func([]byte) ([]Request, error)
}

func traceCases(t *testing.T) []traceCase {
	t.Helper()
	sg, err := os.ReadFile("testdata/sharegpt_sample.json")
	if err != nil {
		t.Fatal(err)
	}
	return []traceCase{
		{"mooncake", []byte(trace), func(b []byte) ([]Request, error) { return Mooncake{Seed: 2}.Read(bytes.NewReader(b)) }},
		{"azure", []byte(azureCSV), func(b []byte) ([]Request, error) { return Azure{Seed: 2}.Read(bytes.NewReader(b)) }},
		{"azure headerless", []byte(strings.SplitN(azureCSV, "\n", 2)[1]), func(b []byte) ([]Request, error) { return Azure{Seed: 2}.Read(bytes.NewReader(b)) }},
		{"sharegpt", sg, func(b []byte) ([]Request, error) { return ShareGPT{Seed: 2}.Read(bytes.NewReader(b)) }},
	}
}

// TestTraceBOM: a leading UTF-8 byte-order mark (as editors and
// spreadsheet exports write) is skipped by every trace reader; it gave
// "invalid character 'ï'" and an unrecognised "\ufeffTIMESTAMP" header.
func TestTraceBOM(t *testing.T) {
	for _, c := range traceCases(t) {
		want, err := c.read(c.text)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		got, err := c.read(append([]byte("\ufeff"), c.text...))
		if err != nil {
			t.Errorf("%s with a BOM: %v", c.name, err)
			continue
		}
		sameRequests(t, c.name+" with a BOM", want, got)
	}
}

// TestTraceGzip: a gzipped trace (magic 1f 8b; it gave "invalid character
// '\x1f'") reads as the plain one, a BOM inside it too; a truncated one is
// an error that says it was decompressing, and another compression format
// is an error naming it.
func TestTraceGzip(t *testing.T) {
	gz := func(b []byte) []byte {
		var buf bytes.Buffer
		w := gzip.NewWriter(&buf)
		if _, err := w.Write(b); err != nil {
			t.Fatal(err)
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
		return buf.Bytes()
	}
	for _, c := range traceCases(t) {
		want, err := c.read(c.text)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		for _, z := range [][]byte{gz(c.text), gz(append([]byte("\ufeff"), c.text...))} {
			got, err := c.read(z)
			if err != nil {
				t.Errorf("%s gzipped: %v", c.name, err)
				continue
			}
			sameRequests(t, c.name+" gzipped", want, got)
		}
		z := gz(c.text)
		if _, err := c.read(z[:len(z)/2]); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "gzip") {
			t.Errorf("%s gzipped, truncated: %v, want an error naming gzip", c.name, err)
		}
		if _, err := c.read(append([]byte{0x28, 0xB5, 0x2F, 0xFD}, c.text...)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "zstd") {
			t.Errorf("%s zstd: %v, want an error naming zstd", c.name, err)
		}
	}
}

// TestMooncakeLongLine: a line past the reader's limit is an error naming
// the line and the limit, not a bare "bufio.Scanner: token too long".
func TestMooncakeLongLine(t *testing.T) {
	long := `{"timestamp": 0, "input_length": 1000, "output_length": 6, "text_input": "` + strings.Repeat("x", 300) + `"}`
	_, err := Mooncake{MaxLineBytes: 200}.Read(strings.NewReader(trace + long + "\n"))
	if !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "line 5") || !strings.Contains(err.Error(), "200 bytes") {
		t.Errorf("a 350-byte line at a 200-byte limit: %v", err)
	}
	if reqs, err := (Mooncake{}).Read(strings.NewReader(trace + long + "\n")); err != nil || len(reqs) != 4 {
		t.Errorf("the same line at the default limit: %v", err)
	}
}

// TestTraceMessagesNameTheRule: a refused row's error names its line, the
// value as the file wrote it and the rule it breaks (before: "trace line
// 3: input_length -100, output_length 10", and a Bailian timestamp of -1
// seconds reported as "timestamp -1000"); a CSV row with more fields than
// the header is refused with its line (it was read silently).
func TestTraceMessagesNameTheRule(t *testing.T) {
	moon := func(row string) string {
		return `{"timestamp": 0, "input_length": 10, "output_length": 1}` + "\n" + row + "\n"
	}
	for _, c := range []struct {
		name string
		read func(string) ([]Request, error)
		in   string
		want string
	}{
		{"input 0", func(s string) ([]Request, error) { return Mooncake{}.Read(strings.NewReader(s)) },
			moon(`{"timestamp": 5, "input_length": 0, "output_length": 10}`), "trace line 2: input_length 0: must be > 0"},
		{"input negative", func(s string) ([]Request, error) { return Mooncake{}.Read(strings.NewReader(s)) },
			moon(`{"timestamp": 5, "input_length": -100, "output_length": 10}`), "trace line 2: input_length -100: must be > 0"},
		{"output negative", func(s string) ([]Request, error) { return Mooncake{}.Read(strings.NewReader(s)) },
			moon(`{"timestamp": 5, "input_length": 10, "output_length": -1}`), "trace line 2: output_length -1: must be ≥ 0"},
		{"timestamp negative", func(s string) ([]Request, error) { return Mooncake{}.Read(strings.NewReader(s)) },
			moon(`{"timestamp": -5, "input_length": 10, "output_length": 1}`), "trace line 2: timestamp -5: want 0..1e+15 milliseconds"},
		{"bailian timestamp in seconds", func(s string) ([]Request, error) { return Mooncake{Bailian: true}.Read(strings.NewReader(s)) },
			`{"chat_id": 1, "timestamp": 0, "input_length": 10, "output_length": 1}` + "\n" + `{"chat_id": 2, "timestamp": -1.0, "input_length": 10, "output_length": 1}` + "\n",
			"trace line 2: timestamp -1: want 0..1e+12 seconds"},
		{"csv prompt tokens", func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
			"timestamp,input_length,output_length\n0,10,1\n1,0,10\n", `azure trace line 3: prompt tokens "0": must be an integer > 0`},
		{"csv output tokens", func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
			"timestamp,input_length,output_length\n0,10,1\n1,10,-2\n", `azure trace line 3: output tokens "-2": must be an integer ≥ 0`},
		{"csv extra field", func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
			"timestamp,input_length,output_length\n0,10,1\n1,200,20,99\n", "azure trace line 3: 4 fields, want 3"},
		{"csv extra field, headerless", func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
			"0,10,1\n1,200,20,99\n", "azure trace line 2: 4 fields, want 3"},
		{"csv short row", func(s string) ([]Request, error) { return Azure{}.Read(strings.NewReader(s)) },
			"Timestamp,Model,Request tokens,Response tokens\n5,m,1,1\n6,m,1\n", "azure trace line 3: 3 fields, want 4"},
	} {
		_, err := c.read(c.in)
		if !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error with %q", c.name, err, c.want)
		}
	}
}

// TestAzureUnsorted: the CSV reader takes rows in any order, as the
// Mooncake reader does: arrivals count from the earliest row, requests
// are sorted by them and Limit keeps the earliest
// (before, a row earlier than the one before it failed: "timestamps go
// backwards"). A sorted file reads as before.
func TestAzureUnsorted(t *testing.T) {
	sorted := "timestamp,input_length,output_length\n10,100,1\n11,200,2\n11,300,3\n12.5,400,4\n"
	shuffled := "timestamp,input_length,output_length\n12.5,400,4\n11,200,2\n10,100,1\n11,300,3\n"
	a, err := Azure{Seed: 3}.Read(strings.NewReader(sorted))
	if err != nil {
		t.Fatal(err)
	}
	b, err := Azure{Seed: 3}.Read(strings.NewReader(shuffled))
	if err != nil {
		t.Fatalf("unsorted rows: %v", err)
	}
	sameRequests(t, "azure unsorted", a, b)
	for i, want := range []int{100, 200, 300, 400} {
		if b[i].PromptTokens != want || b[i].ID != i {
			t.Fatalf("request %d: %d tokens, id %d; want %d tokens", i, b[i].PromptTokens, b[i].ID, want)
		}
	}
	if b[0].Arrival != 0 || b[3].Arrival != 2500*time.Millisecond {
		t.Fatalf("arrivals %v .. %v, want 0 .. 2.5s", b[0].Arrival, b[3].Arrival)
	}
	two, err := Azure{Seed: 3, Limit: 2}.Read(strings.NewReader(shuffled))
	if err != nil || len(two) != 2 {
		t.Fatalf("limit 2: %v, %d requests", err, len(two))
	}
	sameRequests(t, "azure unsorted, limit", a[:2], two)
}
