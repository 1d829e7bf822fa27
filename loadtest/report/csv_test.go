package report

import (
	"bytes"
	"encoding/csv"
	"slices"
	"strconv"
	"testing"
)

// TestWriteCSV: one row per finished request, policies in the report's
// order, engines by name, the prefill engine only where another engine
// prefilled, TPOT only for answers of two tokens or more; the numbers read
// back as written; the failed requests follow each policy's completed
// ones with their error kind (before, they were left out: a CSV of 2
// rows for a run of 8 requests, 6 failed).
func TestWriteCSV(t *testing.T) {
	r := Report{Order: []string{"b", "a"}, Policies: map[string]PolicyResult{"a": {}, "b": {}}, Runs: map[string]Run{
		"a": {EngineIDs: []string{"e0", "e1"}, Records: []Record{
			{Start: 0.5, TTFT: 0.25, E2E: 1.25, PromptTokens: 100, CachedTokens: 40, OutputTokens: 5, Engine: 1},
		}, Failures: []Failure{{Start: 0.75, E2E: 2, Engine: 0, Kind: "http_500"}, {Start: 1, Engine: -1, Kind: "timeout"}}},
		"b": {EngineIDs: []string{"p0", "d0"}, Prefill: []int{0, -1}, Records: []Record{
			{Start: 1, TTFT: 0.5, E2E: 0.5, PromptTokens: 10, OutputTokens: 1, Engine: 1},
			{Start: 2, TTFT: 0.125, E2E: 2.125, PromptTokens: 20, CachedTokens: 16, OutputTokens: 3, Engine: 1},
		}},
	}}
	var buf bytes.Buffer
	if err := WriteCSV(&buf, r); err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(&buf).ReadAll()
	if err != nil {
		t.Fatal(err)
	}
	want := [][]string{
		{"policy", "engine", "prefill_engine", "start_s", "ttft_s", "e2e_s", "tpot_s", "prompt_tokens", "cached_tokens", "output_tokens", "error"},
		{"b", "d0", "p0", "1", "0.5", "0.5", "", "10", "0", "1", ""},
		{"b", "d0", "", "2", "0.125", "2.125", "1", "20", "16", "3", ""},
		{"a", "e1", "", "0.5", "0.25", "1.25", "0.25", "100", "40", "5", ""},
		{"a", "e0", "", "0.75", "", "2", "", "", "", "", "http_500"},
		{"a", "", "", "1", "", "0", "", "", "", "", "timeout"},
	}
	if len(rows) != len(want) {
		t.Fatalf("%d rows, want %d: %q", len(rows), len(want), rows)
	}
	for i := range want {
		if !slices.Equal(rows[i], want[i]) {
			t.Errorf("row %d: %q, want %q", i, rows[i], want[i])
		}
	}
	// A value that is not short in decimal keeps its precision.
	r.Runs["a"].Records[0].TTFT = 1.0 / 3
	buf.Reset()
	if err := WriteCSV(&buf, r); err != nil {
		t.Fatal(err)
	}
	rows, _ = csv.NewReader(&buf).ReadAll()
	if v, err := strconv.ParseFloat(rows[3][4], 64); err != nil || v < 0.33333333 || v > 0.33333334 {
		t.Errorf("ttft %q, want 1/3 to 9 digits", rows[3][4])
	}
}
