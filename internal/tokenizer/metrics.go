package tokenizer

import "github.com/prometheus/client_golang/prometheus"

// Collectors returns the cache's Prometheus metrics; register them once
// per cache. The label model tells caches of different models apart.
func (c *CachingTokenizer) Collectors(model string) []prometheus.Collector {
	labels := prometheus.Labels{"model": model}
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvmesh_tokenizer_cache_hits_total", ConstLabels: labels,
			Help: "Text chunks whose ids came from the prefix tokenization cache.",
		}, func() float64 { return float64(c.hits.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "kvmesh_tokenizer_cache_misses_total", ConstLabels: labels,
			Help: "Text chunks tokenized cold and stored in the prefix tokenization cache.",
		}, func() float64 { return float64(c.misses.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvmesh_tokenizer_cache_tokens", ConstLabels: labels,
			Help: "Token ids held by the prefix tokenization cache.",
		}, func() float64 { return float64(c.Stats().Tokens) }),
	}
}
