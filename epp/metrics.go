package epp

import "github.com/prometheus/client_golang/prometheus"

// metrics are the picker's own series; routing series (decisions, stage
// timings, index) are the ingress's, which the picker runs through.
type metrics struct {
	streams     prometheus.Gauge
	results     *prometheus.CounterVec // kvmesh_epp_requests_total{result}
	immediate   *prometheus.CounterVec // kvmesh_epp_immediate_responses_total{status}
	pick        prometheus.Histogram
	fellBack    prometheus.Counter
	badMetadata *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	m := &metrics{
		streams: prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_epp_streams",
			Help: "ext_proc streams open (one per HTTP request through the gateway)."}),
		results: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_epp_requests_total",
			Help: "Requests the picker answered, by result: routed, rejected (the ingress refused: 4xx/5xx), no_endpoint (none in the subset or pool), bodyless (routed on load only), models (/v1/models or /v1/models/{id} answered by the picker), not_found (a stored response's GET or cancel whose id no known engine holds: 404), bad_mode (unsupported ext_proc body mode), bad_message (a message with no phase: the stream ends with InvalidArgument), too_large (past the body limit, or cut at the gateway's buffer), overloaded (the body budget, --max-body-in-flight, is spent: 503 with Retry-After), bad_encoding (a content-encoding not decoded, or bytes that do not decode)."},
			[]string{"result"}),
		immediate: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_epp_immediate_responses_total",
			Help: "ImmediateResponses sent, by HTTP status."}, []string{"status"}),
		pick: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "kvmesh_epp_pick_seconds",
			Help:    "What the picker adds to a routed request: from receiving the ext_proc message that completes the request (the last body chunk, the trailers, or the headers of a bodyless one) to handing its routing answer to gRPC.",
			Buckets: []float64{25e-6, 50e-6, 100e-6, 200e-6, 400e-6, 800e-6, 1.6e-3, 3.2e-3, 6.4e-3, 12.8e-3, 0.1}}),
		fellBack: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_epp_served_fallback_total",
			Help: "Responses the data plane served from a fallback endpoint, not the first picked."}),
		badMetadata: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_epp_bad_metadata_total",
			Help: "Malformed protocol metadata entries ignored, by key."}, []string{"key"}),
	}
	if reg != nil {
		reg.MustRegister(m.streams, m.results, m.immediate, m.pick, m.fellBack, m.badMetadata)
	}
	return m
}
