package workload

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestMooncakeRateScale pins RateScale's contract: 0 is the documented
// default (1), any other non-positive or non-finite scale is an error.
func TestMooncakeRateScale(t *testing.T) {
	for _, rs := range []float64{0, 1} {
		reqs, err := Mooncake{RateScale: rs}.Read(strings.NewReader(trace))
		if err != nil {
			t.Fatalf("rate scale %v: %v", rs, err)
		}
		if got := reqs[2].Arrival; got != 2*time.Second {
			t.Fatalf("rate scale %v: last arrival %v, want 2s as recorded", rs, got)
		}
	}
	reqs, err := Mooncake{RateScale: 4}.Read(strings.NewReader(trace))
	if err != nil || reqs[1].Arrival != 2500*time.Microsecond || reqs[2].Arrival != 500*time.Millisecond {
		t.Fatalf("rate scale 4: %v %+v", err, reqs)
	}
	for _, rs := range []float64{-1, math.NaN(), math.Inf(1), math.Inf(-1)} {
		if _, err := (Mooncake{RateScale: rs}).Read(strings.NewReader(trace)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "rate scale") {
			t.Errorf("rate scale %v: %v", rs, err)
		}
	}
}

// TestMooncakeArrivalOverflow: a valid timestamp divided by a tiny rate
// scale must not wrap around time.Duration.
func TestMooncakeArrivalOverflow(t *testing.T) {
	lines := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}
{"timestamp": 1e12, "input_length": 10, "output_length": 1, "hash_ids": [1]}`
	if _, err := (Mooncake{RateScale: 1e-3}).Read(strings.NewReader(lines)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "overflows") {
		t.Fatalf("1e12 ms at scale 1e-3 (1e24 ns): %v", err)
	}
	reqs, err := Mooncake{RateScale: 1}.Read(strings.NewReader(lines))
	if err != nil || reqs[1].Arrival != time.Duration(1e12)*time.Millisecond {
		t.Fatalf("1e12 ms: %v %+v", err, reqs)
	}
}

func TestMooncakeLimit(t *testing.T) {
	reqs, err := Mooncake{Limit: 2}.Read(strings.NewReader(trace))
	if err != nil || len(reqs) != 2 {
		t.Fatalf("limit 2: %v, %d requests", err, len(reqs))
	}
	if _, err := (Mooncake{Limit: -1}).Read(strings.NewReader(trace)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "limit") {
		t.Fatalf("limit -1: %v", err)
	}
}

// TestMooncakeEcosystemForms reads the forms aiperf's and Dynamo's tools
// write besides Mooncake's own: absolute timestamps, rows out of order,
// multi-turn rows (session_id + delay), hash_ids rounded down, none at all,
// another block size, no output_length.
func TestMooncakeEcosystemForms(t *testing.T) {
	const epoch = 1_700_000_000_000
	rows := fmt.Sprintf(`{"timestamp": %d, "session_id": "a", "input_length": 1000, "output_length": 4, "hash_ids": [1]}
{"session_id": "a", "delay": 500, "input_length": 1600, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": %d, "session_id": 7, "input_length": 300, "hash_ids": [1]}
{"session_id": "a", "delay": 100, "input_length": 2000, "output_length": 6}
{"timestamp": %d, "input_length": 1000, "output_length": 2, "hash_ids": [1]}
`, epoch+1000, epoch+1200, epoch+1200)
	reqs, err := Mooncake{Output: 33}.Read(strings.NewReader(rows))
	if err != nil {
		t.Fatal(err)
	}
	// Arrivals from the earliest row (ms): a1 0, session 7 200, the
	// untagged row 200 (a tie: file order), a2 500, a3 600.
	want := []struct {
		at      time.Duration
		session string
		out     int
	}{{0, "a", 4}, {200 * time.Millisecond, "7", 33}, {200 * time.Millisecond, "h1", 2}, {500 * time.Millisecond, "a", 5}, {600 * time.Millisecond, "a", 6}}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests, want %d", len(reqs), len(want))
	}
	for i, w := range want {
		if r := reqs[i]; r.ID != i || r.Arrival != w.at || r.Session != w.session || r.OutputTokens != w.out {
			t.Errorf("request %d: id %d at %v session %q output %d; want at %v session %q output %d", i, r.ID, r.Arrival, r.Session, r.OutputTokens, w.at, w.session, w.out)
		}
	}
	a1, s7, h1, a2, a3 := reqs[0].Prompt(), reqs[1].Prompt(), reqs[2].Prompt(), reqs[3].Prompt(), reqs[4].Prompt()
	for i, p := range [][]uint32{a1, s7, h1, a2, a3} {
		if len(p) != reqs[i].PromptTokens {
			t.Fatalf("request %d: %d prompt tokens, want %d", i, len(p), reqs[i].PromptTokens)
		}
	}
	// hash_ids rounded down ([1] for 1,000 tokens): block 1 is shared,
	// the 488 tokens past it are each row's own.
	if !slices.Equal(a1[:512], h1[:512]) || !slices.Equal(a1[:300], s7) || !slices.Equal(a1[:512], a2[:512]) {
		t.Error("block 1 not shared")
	}
	if slices.Equal(a1[512:600], h1[512:600]) || slices.Equal(a1[512:600], a2[512:600]) {
		t.Error("tokens past the hash_ids are not the row's own")
	}
	// No hash_ids: the whole prompt is the row's own.
	if slices.Equal(a3[:16], a1[:16]) {
		t.Error("a row without hash_ids shares its first block")
	}

	// Another block size: 64-token blocks.
	b64 := `{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [5, 6]}
{"timestamp": 0, "input_length": 100, "output_length": 1, "hash_ids": [5, 7]}`
	if _, err := (Mooncake{}).Read(strings.NewReader(b64)); err == nil || !strings.Contains(err.Error(), "--trace-block-size 64") {
		t.Fatalf("64-token blocks read as 512: %v, want a hint at 64", err)
	}
	reqs, err = Mooncake{BlockTokens: 64}.Read(strings.NewReader(b64))
	if err != nil {
		t.Fatal(err)
	}
	p, q := reqs[0].Prompt(), reqs[1].Prompt()
	if !slices.Equal(p[:64], q[:64]) || slices.Equal(p[64:], q[64:]) {
		t.Error("64-token blocks not mapped")
	}

	// Limit keeps the earliest arrivals, whatever the file order.
	reqs, err = Mooncake{Limit: 1}.Read(strings.NewReader(`{"timestamp": 9, "input_length": 1, "output_length": 1}
{"timestamp": 3, "input_length": 2, "output_length": 1}`))
	if err != nil || len(reqs) != 1 || reqs[0].PromptTokens != 2 {
		t.Fatalf("limit 1: %v %+v", err, reqs)
	}
}

// TestMooncakeEmpty: a trace without a request is an error, not a run of
// nothing.
func TestMooncakeEmpty(t *testing.T) {
	for _, in := range []string{"", "\n  \n"} {
		if _, err := (Mooncake{}).Read(strings.NewReader(in)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "no requests") {
			t.Errorf("%q: %v", in, err)
		}
	}
}

// TestBailian reads Alibaba's Bailian form: timestamps in seconds, 16-token
// blocks, sessions by chat_id and parent_chat_id.
func TestBailian(t *testing.T) {
	rows := `{"chat_id": 159, "parent_chat_id": -1, "timestamp": 61.114, "input_length": 40, "output_length": 132, "type": "text", "turn": 1, "hash_ids": [11, 12, 13]}
{"chat_id": 160, "parent_chat_id": 159, "timestamp": 62.5, "input_length": 70, "output_length": 80, "type": "text", "turn": 2, "hash_ids": [11, 12, 13, 14, 15]}
{"chat_id": 161, "parent_chat_id": 160, "timestamp": 63.0, "input_length": 90, "output_length": 3, "turn": 3, "hash_ids": [11, 12, 13, 14, 15, 16]}
{"chat_id": 170, "parent_chat_id": -1, "timestamp": 61.0, "input_length": 20, "output_length": 5, "hash_ids": [-5, 99]}
{"chat_id": "x", "parent_chat_id": 999, "timestamp": 64, "input_length": 16, "output_length": 1, "hash_ids": [7]}
`
	reqs, err := Mooncake{Bailian: true}.Read(strings.NewReader(rows))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		at      time.Duration
		session string
		in      int
	}{{0, "b170", 20}, {114 * time.Millisecond, "b159", 40}, {1500 * time.Millisecond, "b159", 70}, {2 * time.Second, "b159", 90}, {3 * time.Second, "b999", 16}}
	if len(reqs) != len(want) {
		t.Fatalf("%d requests, want %d", len(reqs), len(want))
	}
	for i, w := range want {
		if r := reqs[i]; r.Arrival != w.at || r.Session != w.session || r.PromptTokens != w.in {
			t.Errorf("request %d: at %v session %q prompt %d; want %v %q %d", i, r.Arrival, r.Session, r.PromptTokens, w.at, w.session, w.in)
		}
	}
	t1, t2, t3 := reqs[1].Prompt(), reqs[2].Prompt(), reqs[3].Prompt()
	if !slices.Equal(t1, t2[:40]) || !slices.Equal(t2, t3[:70]) {
		t.Error("turns do not extend their session's blocks")
	}
	// The same file read as Mooncake's form: 16-token blocks do not fit 512.
	if _, err := (Mooncake{}).Read(strings.NewReader(rows)); err == nil || !strings.Contains(err.Error(), "--trace-block-size 16") {
		t.Errorf("read as Mooncake: %v, want a hint at 16-token blocks", err)
	}
	for _, bad := range []string{
		`{"parent_chat_id": -1, "timestamp": 1, "input_length": 10, "output_length": 1}`,
		`{"chat_id": 1, "parent_chat_id": [1], "timestamp": 1, "input_length": 10, "output_length": 1}`,
		`{"chat_id": 1, "timestamp": 1, "input_length": 10, "output_length": 1, "hash_ids": [1.5]}`,
	} {
		if _, err := (Mooncake{Bailian: true}).Read(strings.NewReader(bad)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "line 1") {
			t.Errorf("%s: %v", bad, err)
		}
	}
}

// TestZeroOutputRows: a trace row asking for 0 output tokens (Azure's and
// BurstGPT's failed requests) is sent as 1 token, as before, and marked so
// the report can say how many (Stats.ZeroOutput).
func TestZeroOutputRows(t *testing.T) {
	moon, err := Mooncake{}.Read(strings.NewReader(`{"timestamp": 0, "input_length": 100, "output_length": 0, "hash_ids": [1]}
{"timestamp": 10, "input_length": 100, "output_length": 3, "hash_ids": [1]}
{"timestamp": 20, "input_length": 100, "output_length": 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	csv, err := Azure{Seed: 1}.Read(strings.NewReader("timestamp,input_length,output_length\n0,100,0\n1,100,2\n"))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		reqs []Request
		zero []bool
	}{{"mooncake", moon, []bool{true, false, true}}, {"csv", csv, []bool{true, false}}} {
		for i, r := range tc.reqs {
			if r.ZeroOutput != tc.zero[i] || (r.ZeroOutput && r.OutputTokens != 1) {
				t.Errorf("%s: request %d: output %d, zero-output row %v", tc.name, i, r.OutputTokens, r.ZeroOutput)
			}
		}
	}
	if n := Summarize(moon).ZeroOutput; n != 2 {
		t.Errorf("Summarize counts %d zero-output rows, want 2", n)
	}
}
