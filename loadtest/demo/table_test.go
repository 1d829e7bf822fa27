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
