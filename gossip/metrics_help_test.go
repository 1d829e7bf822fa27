package gossip

import (
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// descRecorder is a prometheus.Registerer that keeps the descriptions of
// what is registered, without collecting.
type descRecorder struct{ descs []string }

func (r *descRecorder) Register(c prometheus.Collector) error {
	ch := make(chan *prometheus.Desc, 8)
	go func() { c.Describe(ch); close(ch) }()
	for d := range ch {
		r.descs = append(r.descs, d.String())
	}
	return nil
}
func (r *descRecorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		_ = r.Register(c)
	}
}
func (r *descRecorder) Unregister(prometheus.Collector) bool { return true }

// TestIgnoredEntriesHelpNamesDuplicates: kvmesh_gossip_entries_ignored_total
// counts an entry of a version already known (node.go: old.Version >=
// e.Version), the bulk of it on a healthy mesh; its HELP says so, so that
// "95 % ignored" does not read as a fault.
func TestIgnoredEntriesHelpNamesDuplicates(t *testing.T) {
	var r descRecorder
	if _, err := new(Node).registerMetrics(&r); err != nil {
		t.Fatal(err)
	}
	for _, d := range r.descs {
		if strings.Contains(d, `"kvmesh_gossip_entries_ignored_total"`) {
			if !strings.Contains(d, "already known") {
				t.Errorf("the HELP does not name duplicates (a version already known): %s", d)
			}
			return
		}
	}
	t.Fatalf("kvmesh_gossip_entries_ignored_total not registered: %v", r.descs)
}
