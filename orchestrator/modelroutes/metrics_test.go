package modelroutes

import (
	"testing"

	promtest "github.com/prometheus/client_golang/prometheus/testutil"
)

// A namespace whose last ModelRoute is deleted loses its route-state
// series; another namespace keeps its own.
func TestObserveForgetsEmptyNamespace(t *testing.T) {
	one := plan{entries: []entry{{}}}
	observe("metrics-gone", one, true)
	observe("metrics-kept", one, true)
	before := promtest.CollectAndCount(routeStates)
	observe("metrics-gone", plan{}, true)
	if got := promtest.CollectAndCount(routeStates); got != before-3 {
		t.Fatalf("series after the namespace emptied: %d, want %d", got, before-3)
	}
	if v := promtest.ToFloat64(routeStates.WithLabelValues("metrics-kept", "programmed")); v != 1 {
		t.Fatalf("the other namespace's programmed routes: %v, want 1", v)
	}
}
