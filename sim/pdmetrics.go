package sim

import (
	"strconv"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// pdMetrics are the P/D series: vLLM's NIXL connector metrics
// (vllm/distributed/kv_transfer/kv_connector/v1/metrics.py, same names and
// buckets; transfer times in modelled seconds) and the simulator's own.
type pdMetrics struct {
	xferTime, bytes, descriptors *prometheus.HistogramVec
	failed, expired, invalid     *prometheus.CounterVec
	ackMissing                   *prometheus.CounterVec
	transfers                    *prometheus.CounterVec
	protoErrors                  prometheus.Counter
	inflight                     atomic.Int64 // decode requests reading KV now
}

func newPDMetrics(s *Server, p *pdState) *pdMetrics {
	reg := s.metrics.reg
	labels := []string{"model_name", "engine"}
	m := &pdMetrics{
		xferTime: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:nixl_xfer_time_seconds",
			Help:    "Histogram of transfer duration for NIXL KV Cache transfers.",
			Buckets: []float64{0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1, 5}}, labels),
		bytes: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:nixl_bytes_transferred",
			Help: "Histogram of bytes transferred per NIXL KV Cache transfers.", Buckets: prometheus.ExponentialBuckets(2048, 4, 12)}, labels),
		descriptors: prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: "vllm:nixl_num_descriptors",
			Help:    "Histogram of number of descriptors per NIXL KV Cache transfers.",
			Buckets: []float64{10, 20, 30, 50, 75, 100, 200, 400, 1000, 2000, 4000, 10000, 20000, 50000}}, labels),
		failed: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:nixl_num_failed_transfers_total",
			Help: "Number of failed NIXL KV Cache transfers."}, labels),
		expired: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:nixl_num_kv_expired_reqs_total",
			Help: "Number of requests that had their KV expire. NOTE: This metric is tracked on the P instance."}, labels),
		ackMissing: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_sim_pd_ack_missing_total",
			Help: "Decode reads whose prefill engine did not acknowledge DONE within 30 s (the KV had arrived; the request did not wait)."}, labels),
		invalid: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_sim_pd_invalid_params_total",
			Help: "Decode requests whose kv_transfer_params were incomplete (prefilled locally)."}, labels),
		transfers: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_sim_pd_transfers_total",
			Help: "KV transfers completed over the side channel, by side (send = held blocks read and freed here, recv = read from a prefill engine)."}, []string{"side"}),
		protoErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_sim_side_channel_errors_total",
			Help: "Side-channel connections refused or closed for a protocol error."}),
	}
	reg.MustRegister(m.xferTime, m.bytes, m.descriptors, m.failed, m.expired, m.invalid, m.ackMissing, m.transfers, m.protoErrors)
	inflight := func() float64 { return float64(m.inflight.Load()) }
	reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_sim_pd_transfers_in_flight",
		Help: "Decode requests currently reading (or waiting for) KV from a prefill engine: the transfer queue."}, inflight))
	// SGLang's own names for its P/D queues, in SGLang mode.
	ml := prometheus.Labels{"model_name": s.cfg.Model}
	switch s.cfg.PD.DisaggregationMode {
	case "prefill":
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sglang:num_prefill_inflight_queue_reqs",
			Help: "Prefilled requests whose KV waits for (or is in) transfer to a decode engine.", ConstLabels: ml},
			func() float64 { return float64(p.heldCount(-1)) }))
	case "decode":
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sglang:num_decode_transfer_queue_reqs",
			Help: "Decode requests waiting for their KV from a prefill engine.", ConstLabels: ml}, inflight))
	}
	for _, rk := range s.ranks {
		rk := rk
		// vLLM exports its counters at zero from the start; so do we, so a
		// dashboard shows "no failures" rather than "no data".
		for _, c := range []*prometheus.CounterVec{m.failed, m.expired, m.invalid, m.ackMissing} {
			c.WithLabelValues(s.cfg.Model, strconv.Itoa(rk.idx))
		}
		cl := prometheus.Labels{"model_name": s.cfg.Model, "engine": strconv.Itoa(rk.idx)}
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_sim_pd_held_requests",
			Help: "Finished prefill legs whose blocks wait for a decode engine's read.", ConstLabels: cl},
			func() float64 { return float64(rk.load().HeldRequests) }))
		reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_sim_pd_held_blocks",
			Help: "Blocks held for decode engines' reads.", ConstLabels: cl},
			func() float64 { return float64(rk.load().HeldBlocks) }))
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "kvmesh_sim_pd_info",
		Help: "The engine's P/D configuration (role: prefill, decode, both or mixed).",
		ConstLabels: prometheus.Labels{"model_name": s.cfg.Model, "role": s.pdRole(),
			"kv_connector": kvConnector(s), "disaggregation_mode": s.cfg.PD.DisaggregationMode}})
	info.Set(1)
	reg.MustRegister(info)
	return m
}

func kvConnector(s *Server) string {
	if s.cfg.PD.KVTransfer == nil {
		return ""
	}
	return s.cfg.PD.KVTransfer.KVConnector
}
