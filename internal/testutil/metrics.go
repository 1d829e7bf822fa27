package testutil

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// MetricSum is the sum over every series of metric name in g (gauges,
// counters and untyped alike); the test fails when g has no such metric.
func MetricSum(t testing.TB, g prometheus.Gatherer, name string) float64 {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		var v float64
		for _, m := range mf.GetMetric() {
			v += m.GetGauge().GetValue() + m.GetCounter().GetValue() + m.GetUntyped().GetValue()
		}
		return v
	}
	t.Fatalf("no metric %s", name)
	return 0
}
