package fair

import "github.com/prometheus/client_golang/prometheus"

// otherTenants labels tenants not named in Config.Tenants, which bounds the
// metrics' cardinality to the configured tenants + 1.
const otherTenants = "other"

type metrics struct {
	known    map[string]bool
	admitted *prometheus.CounterVec
	rejected *prometheus.CounterVec
	waiting  *prometheus.GaugeVec
	wait     *prometheus.HistogramVec
	overflow prometheus.Counter // requests charged to the overflow tenant
	tracked  prometheus.Gauge   // tenants with state
}

func newMetrics(cfg Config) *metrics {
	m := &metrics{known: map[string]bool{},
		admitted: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tenant_admitted_total",
			Help: "Requests admitted by the fair queue, per tenant (unlisted tenants: other)."}, []string{"tenant"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tenant_rejected_total",
			Help: "Requests the fair queue refused, per tenant and reason (full, timeout; canceled: the client left while waiting)."}, []string{"tenant", "reason"}),
		waiting: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "kvmesh_ingress_tenant_queued_requests",
			Help: "Requests waiting in the fair queue, per tenant."}, []string{"tenant"}),
		wait: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "kvmesh_ingress_tenant_queue_wait_seconds",
			Help:    "Time admitted requests waited in the fair queue, per tenant.",
			Buckets: []float64{0, .001, .005, .025, .1, .25, .5, 1, 2.5, 5, 10, 30}}, []string{"tenant"}),
		overflow: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_tenant_overflow_total",
			Help: "Requests of unlisted tenants the fair queue folded into one shared overflow tenant because maxTenants busy tenants were tracked."}),
		tracked: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_ingress_tenants",
			Help: "Tenants the fair queue keeps state for (at most maxTenants, plus the listed ones)."}),
	}
	for name := range cfg.Tenants {
		m.known[name] = true
	}
	// Every series of every label the queue can use starts at zero (bounded:
	// the configured tenants and "other"), so dashboards show idle tenants.
	for _, l := range append(mapKeys(cfg.Tenants), otherTenants) {
		m.admitted.WithLabelValues(l)
		m.waiting.WithLabelValues(l)
		m.wait.WithLabelValues(l)
		for _, reason := range []string{"full", "timeout", "canceled"} {
			m.rejected.WithLabelValues(l, reason)
		}
	}
	return m
}

func (m *metrics) label(tenant string) string {
	if m.known[tenant] {
		return tenant
	}
	return otherTenants
}

func (m *metrics) admit(tenant string, waited float64) {
	l := m.label(tenant)
	m.admitted.WithLabelValues(l).Inc()
	m.wait.WithLabelValues(l).Observe(waited)
}

func (m *metrics) reject(tenant, reason string) {
	m.rejected.WithLabelValues(m.label(tenant), reason).Inc()
}

func (m *metrics) queued(tenant string, d float64) { m.waiting.WithLabelValues(m.label(tenant)).Add(d) }

// Collectors returns the queue's metrics for registration.
func (q *Queue) Collectors() []prometheus.Collector {
	return []prometheus.Collector{q.metrics.admitted, q.metrics.rejected, q.metrics.waiting, q.metrics.wait, q.metrics.overflow, q.metrics.tracked}
}

func mapKeys(m map[string]Tenant) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
