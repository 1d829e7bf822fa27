package sim

import (
	"strconv"

	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Histogram buckets as vLLM defines them (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets    = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80, 160, 640, 2560}
	itlBuckets     = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}
	latencyBuckets = []float64{0.3, 0.5, 0.8, 1, 1.5, 2, 2.5, 5, 10, 15, 20, 30, 40, 50, 60, 120, 240, 480, 960, 1920, 7680}
	tokenBuckets   = []float64{1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000}
)

// metrics is one instance's registry: vLLM's metric names and types with
// labels model_name and engine (the DP rank), plus kvmesh_sim_* for the
// simulator's own counters. Gauges and counters that mirror engine state are
// read from the engine at scrape time, so they are exact.
type metrics struct {
	reg *prometheus.Registry

	ttft, itl, e2e, queue, prefill, decode *prometheus.HistogramVec
	promptLen, genLen                      *prometheus.HistogramVec
	success                                *prometheus.CounterVec
	rejected                               *prometheus.CounterVec
}

func newMetrics(s *Server) *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	// The Go runtime's and the process's series, as every kvmesh process
	// exports (vLLM exports python_* and process_*): a soak reads the
	// simulator's goroutines and memory there.
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	labels := []string{"model_name", "engine"}
	hist := func(name, help string, b []float64) *prometheus.HistogramVec {
		h := prometheus.NewHistogramVec(prometheus.HistogramOpts{Name: name, Help: help, Buckets: b}, labels)
		m.reg.MustRegister(h)
		return h
	}
	m.ttft = hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	m.itl = hist("vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", itlBuckets)
	m.e2e = hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", latencyBuckets)
	m.queue = hist("vllm:request_queue_time_seconds", "Histogram of time spent in WAITING phase for request.", latencyBuckets)
	m.prefill = hist("vllm:request_prefill_time_seconds", "Histogram of time spent in PREFILL phase for request.", latencyBuckets)
	m.decode = hist("vllm:request_decode_time_seconds", "Histogram of time spent in DECODE phase for request.", latencyBuckets)
	m.promptLen = hist("vllm:request_prompt_tokens", "Number of prefill tokens processed.", tokenBuckets)
	m.genLen = hist("vllm:request_generation_tokens", "Number of generation tokens processed.", tokenBuckets)
	m.success = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "vllm:request_success_total",
		Help: "Count of successfully processed requests."}, append(labels, "finished_reason"))
	m.rejected = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_sim_requests_rejected_total",
		Help: "Requests refused before reaching an engine, by reason."}, []string{"reason"})
	m.reg.MustRegister(m.success, m.rejected)

	for _, rk := range s.ranks {
		rk := rk
		rk.itl = m.itl.WithLabelValues(s.cfg.Model, strconv.Itoa(rk.idx)) // before the ranks run
		cl := prometheus.Labels{"model_name": s.cfg.Model, "engine": strconv.Itoa(rk.idx)}
		load := func() engine.Load { return rk.load() }
		gauge := func(name, help string, f func(engine.Load) float64) {
			m.reg.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: cl},
				func() float64 { return f(load()) }))
		}
		counter := func(name, help string, f func(engine.Load) float64) {
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: cl},
				func() float64 { return f(load()) }))
		}
		gauge("vllm:num_requests_running", "Number of requests in model execution batches.", func(l engine.Load) float64 { return float64(l.Running) })
		gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.", func(l engine.Load) float64 {
			return float64(l.Waiting + int(rk.transferring.Load())) // + decode legs reading their KV, as vLLM counts them
		})
		gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.", func(l engine.Load) float64 { return l.KVUsage })
		gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (older name). 1 means 100 percent usage.", func(l engine.Load) float64 { return l.KVUsage })
		gauge("kvmesh_sim_queued_prefill_tokens", "Prompt tokens not yet computed (waiting and partial prefills).", func(l engine.Load) float64 { return float64(l.QueuedPrefillTokens) })
		gauge("kvmesh_sim_cached_blocks", "GPU blocks holding a prefix-cache hash.", func(l engine.Load) float64 { return float64(l.CachedBlocks) })
		gauge("kvmesh_sim_cpu_cached_blocks", "Blocks in the CPU tier.", func(l engine.Load) float64 { return float64(l.CPUBlocks) })
		counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens.", func(l engine.Load) float64 { return float64(l.PrefixQueries) })
		counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens.", func(l engine.Load) float64 { return float64(l.PrefixHits) })
		counter("vllm:external_prefix_cache_hits_total", "External prefix cache hits (CPU tier and KV read from a prefill engine), in tokens.", func(l engine.Load) float64 { return float64(l.CPUPrefixHits + l.RemoteTokens) })
		counter("vllm:prompt_tokens_total", "Number of prefill tokens processed.", func(l engine.Load) float64 { return float64(l.PromptTokens) })
		for src, f := range map[string]func(engine.Load) uint64{
			"local_compute":        func(l engine.Load) uint64 { return l.PromptTokens - l.PrefixHits - l.CPUPrefixHits - l.RemoteTokens },
			"local_cache_hit":      func(l engine.Load) uint64 { return l.PrefixHits },
			"external_kv_transfer": func(l engine.Load) uint64 { return l.CPUPrefixHits + l.RemoteTokens }, // connector loads: CPU tier and P/D reads
		} {
			sl := prometheus.Labels{"model_name": s.cfg.Model, "engine": strconv.Itoa(rk.idx), "source": src}
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "vllm:prompt_tokens_by_source_total",
				Help: "Number of prompt tokens by source.", ConstLabels: sl}, func() float64 { return float64(f(load())) }))
		}
		counter("vllm:generation_tokens_total", "Number of generation tokens processed.", func(l engine.Load) float64 { return float64(l.GenerationTokens) })
		counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine.", func(l engine.Load) float64 { return float64(l.Preemptions) })
		counter("kvmesh_sim_engine_steps_total", "Engine steps executed.", func(l engine.Load) float64 { return float64(l.Steps) })
		if rk.pub != nil {
			pub := rk.pub
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_sim_kv_event_batches_total",
				Help: "KV-event batches published (sequence numbers used).", ConstLabels: cl},
				func() float64 { return float64(pub.Stats().Published) }))
			m.reg.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvmesh_sim_kv_event_batches_dropped_total",
				Help: "KV-event batches withheld from the live socket by the drop switch.", ConstLabels: cl},
				func() float64 { return float64(pub.Stats().Dropped) }))
		}
		// vLLM's API server sums its data-parallel engines' blocks into
		// the one cache config every engine's series shows.
		ec, n := s.cfg.Engine, len(s.ranks)
		info := prometheus.NewGauge(prometheus.GaugeOpts{Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig",
			ConstLabels: prometheus.Labels{"model_name": s.cfg.Model, "engine": strconv.Itoa(rk.idx),
				"block_size": strconv.Itoa(ec.BlockSize), "num_gpu_blocks": strconv.Itoa(n * ec.GPUBlocks),
				"num_cpu_blocks": strconv.Itoa(n * ec.CPUBlocks), "enable_prefix_caching": "True",
				"prefix_caching_hash_algo": "xxhash", "cache_dtype": "auto"}})
		info.Set(1)
		m.reg.MustRegister(info)
	}
	return m
}

// observe records a finished request.
func (m *metrics) observe(model string, rank int, res engine.Result, reason string) {
	lv := []string{model, strconv.Itoa(rank)}
	m.success.WithLabelValues(model, lv[1], reason).Inc()
	m.promptLen.WithLabelValues(lv...).Observe(float64(res.PromptTokens))
	m.genLen.WithLabelValues(lv...).Observe(float64(res.OutputTokens))
	if res.OutputTokens == 0 {
		return
	}
	m.ttft.WithLabelValues(lv...).Observe(res.TTFT.Seconds())
	m.e2e.WithLabelValues(lv...).Observe(res.E2E.Seconds())
	m.queue.WithLabelValues(lv...).Observe(res.QueueTime.Seconds())
	m.prefill.WithLabelValues(lv...).Observe(res.PrefillTime.Seconds())
	m.decode.WithLabelValues(lv...).Observe((res.Finished - res.FirstToken).Seconds())
}
