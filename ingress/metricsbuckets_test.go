package ingress

import (
	"context"
	"io"
	"log/slog"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/ingress/fair"
)

// The request latency histograms reach 30 min (streams last minutes), the
// stage histogram 1 s (the engine /tokenize fallback), and the fair queue's
// kvmesh_ingress_tenant_* series carry the replica's ingress label as the
// other kvmesh_ingress_* series do.
func TestMetricBucketsAndLabels(t *testing.T) {
	o := DefaultOptions()
	o.Config.Engines = []StaticEngine{{ID: "e", Model: "m", URL: "http://127.0.0.1:1"}}
	fc := fair.DefaultConfig()
	o.Config.FairQueue = &fc
	s, err := o.NewServer(context.Background(), slog.New(slog.NewTextHandler(io.Discard, nil)))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	s.m.stageParse.Observe(0.001)
	mfs, err := s.deps.Registry.Gather()
	if err != nil {
		t.Fatal(err)
	}
	top := map[string]float64{}
	tenantLabel := ""
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			if h := m.GetHistogram(); h != nil && len(h.GetBucket()) > 0 {
				b := h.GetBucket()
				top[mf.GetName()] = b[len(b)-1].GetUpperBound()
			}
			if mf.GetName() == "kvmesh_ingress_tenant_admitted_total" {
				for _, l := range m.GetLabel() {
					if l.GetName() == "ingress" {
						tenantLabel = l.GetValue()
					}
				}
			}
		}
	}
	for name, want := range map[string]float64{"kvmesh_ingress_request_duration_seconds": 1800, "kvmesh_ingress_ttft_seconds": 1800, "kvmesh_ingress_stage_seconds": 1} {
		if top[name] != want {
			t.Errorf("%s: top bucket %v, want %v", name, top[name], want)
		}
	}
	if !slices.Contains(latencyBuckets, 300) || tenantLabel == "" || tenantLabel != s.cfg.ID {
		t.Errorf("tenant series' ingress label %q, replica %q", tenantLabel, s.cfg.ID)
	}
}
