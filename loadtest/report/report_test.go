package report

import (
	"slices"
	"strings"
	"testing"
)

func TestQuantile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0: 1, 0.5: 5, 0.9: 9, 0.99: 10, 1: 10} {
		if got := Quantile(v, q); got != want {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("empty input")
	}
}

func TestImbalance(t *testing.T) {
	for _, tc := range []struct {
		per  []int
		want float64
	}{{[]int{5, 5}, 1}, {[]int{8, 0}, 2}, {[]int{0, 0}, 0}, {[]int{3, 1, 2}, 1.5}} {
		if got := Imbalance(slices.Values(tc.per)); got != tc.want {
			t.Errorf("Imbalance(%v) = %v, want %v", tc.per, got, tc.want)
		}
	}
}

func TestWriteTable(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{"a": {ThroughputRPS: 1.5, Completed: 3}, "b": {Completed: 4}},
		Order: []string{"b", "a", "missing"}, OracleHitRate: 0.25}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	if strings.Index(out, "\n  b") > strings.Index(out, "\n  a") || strings.Contains(out, "missing") ||
		!strings.Contains(out, "oracle (infinite shared cache) hit rate: 0.250") {
		t.Fatalf("table:\n%s", out)
	}
}

// TestOfferedLine: the text table and the HTML page name each policy's
// offered hit rate and the part it took, in the report's order, and say
// nothing of it when no policy measured one (live runs).
func TestOfferedLine(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{"a": {PrefixHitRate: 0.3, OfferedHitRate: 0.4}, "b": {PrefixHitRate: 0.2, OfferedHitRate: 0.25}, "c": {PrefixHitRate: 0.1}},
		Order: []string{"b", "a", "c"}}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	const want = "and the part taken: b 0.250 (80%) a 0.400 (75%)\n"
	if !strings.Contains(sb.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, sb.String())
	}
	var hb strings.Builder
	if err := WriteHTML(&hb, r, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hb.String(), "and the part taken: b 0.250 (80%) a 0.400 (75%)</p>") {
		t.Errorf("HTML lacks the offered line")
	}
	r.Policies = map[string]PolicyResult{"a": {PrefixHitRate: 0.3}}
	sb.Reset()
	hb.Reset()
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(&hb, r, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String()+hb.String(), "offered") {
		t.Errorf("an offered line without offered hit rates:\n%s", sb.String())
	}
}
