package ratelimit

import "github.com/prometheus/client_golang/prometheus"

// metrics are the limiter's Prometheus series. Labelled children are resolved once
// here so the request path only increments.
type metrics struct {
	allowed     prometheus.Counter
	limitedVec  *prometheus.CounterVec
	limitedBy   [2][2]prometheus.Counter // [scope][dim]
	untracked   prometheus.Counter
	mergeErrors prometheus.Counter
	skewed      prometheus.Counter
	origins     prometheus.Gauge
}

func newMetrics() *metrics {
	m := &metrics{
		allowed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_ratelimit_allowed_total", Help: "Requests admitted by the token rate limiter.",
		}),
		limitedVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvmesh_ratelimit_limited_total", Help: "Requests refused by the token rate limiter, by scope (key, model) and token dimension (input, output).",
		}, []string{"scope", "dim"}),
		untracked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_ratelimit_untracked_total", Help: "Requests admitted untracked because max_scopes was reached.",
		}),
		mergeErrors: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_ratelimit_state_merge_errors_total", Help: "Gossiped rate-limit states skipped as malformed or incompatible.",
		}),
		skewed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "kvmesh_ratelimit_state_skewed_total", Help: "Gossiped rate-limit states from a replica whose clock is more than a window from this one's, or stepped back by more than a window: counted as if the clocks agreed (and logged, once a minute per replica).",
		}),
		origins: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "kvmesh_ratelimit_origins", Help: "Other replicas whose rate-limit usage is known.",
		}),
	}
	for i, s := range [2]string{"key", "model"} {
		for j, d := range [2]string{"input", "output"} {
			m.limitedBy[i][j] = m.limitedVec.WithLabelValues(s, d)
		}
	}
	return m
}

func (m *metrics) limited(scope, dim string) prometheus.Counter {
	i, j := 0, 0
	if scope == "model" {
		i = 1
	}
	if dim == "output" {
		j = 1
	}
	return m.limitedBy[i][j]
}

// Collectors returns the limiter's metrics for the ingress to register.
func (l *Limiter) Collectors() []prometheus.Collector {
	m := l.metrics
	return []prometheus.Collector{m.allowed, m.limitedVec, m.untracked, m.mergeErrors, m.skewed, m.origins}
}
