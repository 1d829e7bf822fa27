package index

import (
	"github.com/prometheus/client_golang/prometheus"
)

// RegisterMetrics registers the kvmesh_index_* gauges and the dropped
// writes counter with reg. They read MemStats (cheap: no table walk) when
// scraped. Call once per Index.
func (x *Index) RegisterMetrics(reg prometheus.Registerer) error {
	if reg == nil {
		return nil
	}
	gauge := func(name, help string, f func(m MemStats) float64) prometheus.Collector {
		return prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help}, func() float64 { return f(x.MemStats()) })
	}
	for _, c := range []prometheus.Collector{
		gauge("kvmesh_index_keys", "Distinct block keys in the prefix index.", func(m MemStats) float64 { return float64(m.Keys) }),
		gauge("kvmesh_index_entries", "(key, engine) entries in the prefix index, speculative included.", func(m MemStats) float64 { return float64(m.Entries) }),
		gauge("kvmesh_index_engines", "Engines known to the prefix index.", func(m MemStats) float64 { return float64(m.Engines) }),
		gauge("kvmesh_index_table_bytes", "Bytes of the prefix index's hash table and overflow lists.", func(m MemStats) float64 { return float64(m.TableBytes) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_index_dropped_writes_total", Help: "Index writes refused because the engine limit was reached."},
			func() float64 { return float64(x.MemStats().DroppedWrites) }),
	} {
		if err := reg.Register(c); err != nil {
			return err
		}
	}
	return nil
}
