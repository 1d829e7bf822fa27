package demo

import (
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/loadtest/report"
)

// TestWriteTableComparison: the comparison line says "higher" when
// kvmesh's TTFT is higher than random's (it said "0.9× lower").
func TestWriteTableComparison(t *testing.T) {
	r := &Result{Report: report.Report{Order: []string{"random", "kvmesh"}, Policies: map[string]report.PolicyResult{
		"random": {TTFTP50: 0.2, TTFTP99: 1.0, ThroughputRPS: 10},
		"kvmesh": {TTFTP50: 0.05, TTFTP99: 1.25, ThroughputRPS: 12},
	}}}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	if want := "kvmesh vs random: TTFT p50 4.0× lower, p99 1.2× higher"; !strings.Contains(b.String(), want) {
		t.Fatalf("table does not say %q:\n%s", want, b.String())
	}
}

// TestWriteTableAligned: the columns line up whatever the policies' names
// ("aggregated" and "kvmesh-pd" overflowed the first column's 8 characters).
func TestWriteTableAligned(t *testing.T) {
	r := &Result{Report: report.Report{Order: []string{"aggregated", "pd", "kvmesh-pd"}, Policies: map[string]report.PolicyResult{
		"aggregated": {ThroughputRPS: 9.53}, "pd": {ThroughputRPS: 7.7}, "kvmesh-pd": {ThroughputRPS: 7.96},
	}}}
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(b.String(), "\n")
	end := strings.Index(lines[0], "req/s") + len("req/s") // the column's right edge
	for _, l := range lines[1:4] {
		if len(l) <= end || l[end] != ' ' || l[end-1] == ' ' {
			t.Fatalf("req/s column not aligned at %d:\n%s", end, b.String())
		}
	}
}
