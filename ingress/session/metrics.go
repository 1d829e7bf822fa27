package session

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// admissionMetrics are the Admitter's Prometheus series; labelled children are resolved
// once so the request path only increments.
type admissionMetrics struct {
	admittedVec     *prometheus.CounterVec
	admittedBy      [2][2]prometheus.Counter // [boosted][queued]
	rejectedVec     *prometheus.CounterVec
	rejectedFull    prometheus.Counter
	rejectedTimeout prometheus.Counter
	rejectedCancel  prometheus.Counter
	queued          prometheus.Gauge
	wait            prometheus.Histogram
}

func newAdmissionMetrics() *admissionMetrics {
	m := &admissionMetrics{
		admittedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_admission_admitted_total", Help: "Requests admitted, by session boost and whether they queued first.",
		}, []string{"boosted", "queued"}),
		rejectedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_admission_rejected_total", Help: "Requests that left the admission queue unadmitted: queue_full (429 with Retry-After), timeout (504), canceled (the client left while waiting).",
		}, []string{"reason"}),
		queued: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_admission_queued", Help: "Requests waiting for an admission slot.",
		}),
		wait: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name: "kvmesh_admission_queue_wait_seconds", Help: "Time admitted requests waited in the queue.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
		}),
	}
	for i, b := range [2]string{"false", "true"} {
		for j, q := range [2]string{"false", "true"} {
			m.admittedBy[i][j] = m.admittedVec.WithLabelValues(b, q)
		}
	}
	m.rejectedFull = m.rejectedVec.WithLabelValues("queue_full")
	m.rejectedTimeout = m.rejectedVec.WithLabelValues("timeout")
	m.rejectedCancel = m.rejectedVec.WithLabelValues("canceled")
	return m
}

// gaveUp counts a waiter that left the queue without a slot: its wait
// expired (ErrQueueTimeout), or its context ended (the client left, as the
// fair queue's canceled; it was counted nowhere).
func (m *admissionMetrics) gaveUp(err error) {
	if errors.Is(err, ErrQueueTimeout) {
		m.rejectedTimeout.Inc()
	} else {
		m.rejectedCancel.Inc()
	}
}

func (m *admissionMetrics) admitted(boosted, queued bool) {
	i, j := 0, 0
	if boosted {
		i = 1
	}
	if queued {
		j = 1
	}
	m.admittedBy[i][j].Inc()
}

// Collectors returns the Admitter's metrics for the ingress to register.
func (a *Admitter) Collectors() []prometheus.Collector {
	m := a.metrics
	return []prometheus.Collector{m.admittedVec, m.rejectedVec, m.queued, m.wait}
}
