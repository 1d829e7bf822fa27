package workload

import (
	"errors"
	"slices"
	"strings"
	"testing"
)

func TestSharedPrefix(t *testing.T) {
	c := SharedPrefix{Groups: 4, Prompts: 3, Shared: 64, Question: 8, Output: 5, Rate: 100, Seed: 1}
	reqs, err := c.Generate()
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 12 {
		t.Fatalf("%d requests", len(reqs))
	}
	byGroup := map[int][]uint32{}
	groups := map[int]int{}
	for i := range reqs {
		r := &reqs[i]
		if i > 0 && r.Arrival < reqs[i-1].Arrival {
			t.Fatal("arrivals not ordered")
		}
		p := r.Prompt()
		if len(p) != 72 || r.PromptTokens != 72 || r.OutputTokens != 5 {
			t.Fatalf("request %d: %d tokens", i, len(p))
		}
		groups[r.Group]++
		if prev, ok := byGroup[r.Group]; ok {
			if !slices.Equal(prev[:64], p[:64]) {
				t.Fatal("shared prefix differs within a group")
			}
			if slices.Equal(prev[64:], p[64:]) {
				t.Fatal("questions identical within a group")
			}
		}
		byGroup[r.Group] = p
	}
	if len(groups) != 4 || slices.Equal(byGroup[0][:64], byGroup[1][:64]) {
		t.Fatal("groups not distinct")
	}
	again, _ := c.Generate()
	if again[5].Arrival != reqs[5].Arrival || !slices.Equal(again[5].Prompt(), reqs[5].Prompt()) {
		t.Fatal("not deterministic")
	}
	// Oracle: every prompt but the first of each group hits its 64 shared tokens.
	want := float64(4*2*64) / float64(12*72)
	if got := OracleHitRate(reqs, 16); got != want {
		t.Fatalf("oracle %v want %v", got, want)
	}
}

func TestSharedPrefixValidate(t *testing.T) {
	err := SharedPrefix{Groups: 0, Prompts: -1, Output: 0, Rate: -1}.Validate()
	for _, w := range []string{"groups", "prompts", "output", "shared", "rate"} {
		if err == nil || !strings.Contains(err.Error(), w) {
			t.Errorf("missing %s in %v", w, err)
		}
	}
}

const trace = `{"timestamp": 0, "input_length": 1000, "output_length": 6, "hash_ids": [0, 1]}
{"timestamp": 10, "input_length": 600, "output_length": 0, "hash_ids": [0, 2]}

{"timestamp": 2000, "input_length": 512, "output_length": 3, "hash_ids": [7]}
`

func TestMooncake(t *testing.T) {
	reqs, err := Mooncake{RateScale: 2}.Read(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3 || reqs[2].Arrival.Milliseconds() != 1000 || reqs[1].OutputTokens != 1 {
		t.Fatalf("%+v", reqs)
	}
	a, b := reqs[0].Prompt(), reqs[1].Prompt()
	if len(a) != 1000 || len(b) != 600 || !slices.Equal(a[:512], b[:512]) || slices.Equal(a[512:600], b[512:600]) {
		t.Fatal("hash_ids not mapped to shared token blocks")
	}
	// Request 1 hits block 0 (512 tokens) of 2,112 prompt tokens.
	if got := OracleHitRate(reqs, 16); got != 512.0/2112 {
		t.Fatalf("oracle %v", got)
	}
}

func TestMooncakeErrors(t *testing.T) {
	for _, bad := range []string{
		`{"timestamp": 0}`,
		`{"timestamp": 0, "input_length": 2000, "output_length": 1, "hash_ids": [1]}`,
		`{"timestamp": -1, "input_length": 10, "output_length": 1, "hash_ids": [1]}`,
		`not json`,
		`{"delay": 5, "session_id": "a", "input_length": 10, "output_length": 1}`,
		`{"timestamp": 0, "input_length": 10, "output_length": 1}` + "\n" + `{"delay": 5, "input_length": 10, "output_length": 1}`,
		`{"timestamp": 0, "session_id": "a", "input_length": 10, "output_length": 1}` + "\n" + `{"delay": -5, "session_id": "a", "input_length": 10, "output_length": 1}`,
		`{"timestamp": 0, "session_id": {"x": 1}, "input_length": 10, "output_length": 1}`,
		`{"timestamp": 0, "input_length": 10}`,
		`{"timestamp": 0, "text_input": "hello", "output_length": 1}`,
		`{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1, 2, 3]}`,
		`{"timestamp": 0, "input_length": 1024, "output_length": 1, "hash_ids": [1]}`,
	} {
		if _, err := (Mooncake{}).Read(strings.NewReader(bad)); !errors.Is(err, ErrBadWorkload) || !strings.Contains(err.Error(), "line") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestMooncakeRealTrace(t *testing.T) {
	reqs, err := Mooncake{}.ReadFile("../../testdata/traces/mooncake_synthetic_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 3993 {
		t.Fatalf("%d requests", len(reqs))
	}
	st := Summarize(reqs)
	if st.Duration.Seconds() < 1000 || st.Duration.Seconds() > 1100 {
		t.Fatalf("duration %v", st.Duration)
	}
}

func FuzzMooncake(f *testing.F) {
	f.Add([]byte(trace))
	f.Add([]byte(`{"timestamp": 1e300, "input_length": 1, "output_length": 1, "hash_ids": [1]}`))
	f.Add([]byte("{\"timestamp\": 1.7e12, \"session_id\": \"s\", \"input_length\": 700, \"hash_ids\": [3]}\n{\"session_id\": \"s\", \"delay\": 5, \"input_length\": 90, \"output_length\": 2}"))
	f.Add([]byte(`{"chat_id": 2, "parent_chat_id": 1, "timestamp": 61.5, "input_length": 20, "output_length": 5, "hash_ids": [-5, 99]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, c := range []Mooncake{{MaxLineBytes: 1 << 16, Output: 8}, {MaxLineBytes: 1 << 16, Output: 8, Bailian: true}} {
			reqs, err := c.Read(strings.NewReader(string(b)))
			if err != nil {
				continue
			}
			for i := range reqs {
				if reqs[i].PromptTokens > 1<<16*MooncakeBlockTokens {
					continue
				}
				if p := reqs[i].Prompt(); len(p) != reqs[i].PromptTokens {
					t.Fatalf("bailian %v: prompt %d tokens, want %d", c.Bailian, len(p), reqs[i].PromptTokens)
				}
				if i > 0 && reqs[i].Arrival < reqs[i-1].Arrival || reqs[i].Arrival < 0 || reqs[i].ID != i {
					t.Fatalf("bailian %v: request %d: id %d, arrival %v after %v", c.Bailian, i, reqs[i].ID, reqs[i].Arrival, reqs[max(i-1, 0)].Arrival)
				}
			}
		}
	})
}
