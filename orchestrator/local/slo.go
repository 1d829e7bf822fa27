package local

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"sort"
	"strings"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/kvmesh/kvmesh/orchestrator"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// sloScraper feeds the SLO mode. The mesh's gossip carries queues and KV
// usage, not prompt tokens/s or latency percentiles; the local backend owns
// its engines, so it reads their vLLM counters and histograms between
// steps: prompt tokens/s and TTFT p90 on the SLO's prefill role (with
// aggregateBelow, the decode role's requests served whole too: observe),
// inter-token latency p90 (TPOT) on its decode role. Running streams come
// from gossip. Used by the loop goroutine only.
type sloScraper struct {
	client *http.Client
	prev   map[string]engineSample // by engine id
}

type engineSample struct {
	at           time.Time
	promptTokens float64
	// remoteTokens are the prompt tokens whose KV the engine loaded
	// through its connector (a decode leg's KV read from a prefill engine).
	remoteTokens float64
	ttft, itl    histogram
}

// histogram is cumulative counts by upper bound, sorted by bound.
type histogram struct {
	bounds []float64
	counts []float64
}

func newSLOScraper() *sloScraper {
	return &sloScraper{client: &http.Client{Timeout: time.Second}, prev: map[string]engineSample{}}
}

// observe returns the interval's SLO observation, nil before the first
// interval has two samples.
func (s *sloScraper) observe(ctx context.Context, now time.Time, md *v1alpha1.ModelDeployment, ap *v1alpha1.AutoscalingPolicy, b Backend, load LoadSource) *autoscale.SLOObservation {
	slo := ap.Spec.SLO
	var o autoscale.SLOObservation
	var ttft, decTTFT, itl histogram
	seen := false
	cur := map[string]engineSample{}
	// With aggregateBelow, the requests served whole on a decode engine are
	// prefill load too, as the controller counts them over gossip whether
	// or not a prefill engine runs (tester h-reg7 F5). A decode engine's
	// vllm:prompt_tokens_total also holds the prompt of every disaggregated
	// request it decoded, whose KV it read from the prefill engine that
	// counted that prompt already: those tokens, external_kv_transfer, are
	// left out, so a disaggregated request counts on its prefill engine
	// only (but for the tokens its decode leg had itself: the last one,
	// and a prefix the decode engine had cached; and a CPU tier's loads,
	// external_kv_transfer too, go uncounted). Its TTFT histogram cannot be split so: it is read only while
	// the prefill engines record none (the prefill role at zero, or every
	// request served whole), lest each disaggregated request count twice.
	aggregate := slo.AggregateBelow > 0
	for _, role := range []string{slo.PrefillRole, slo.DecodeRole} {
		for _, id := range b.Replicas(md.Name, role) {
			url := s.urlOf(b, id)
			if url == "" {
				continue
			}
			smp, err := s.scrape(ctx, url)
			if err != nil {
				continue
			}
			smp.at = now
			cur[id] = smp
			p, ok := s.prev[id]
			if !ok || !smp.at.After(p.at) {
				continue
			}
			seen = true
			dt := smp.at.Sub(p.at).Seconds()
			prompt := max(smp.promptTokens-p.promptTokens, 0)
			switch {
			case role == slo.PrefillRole:
				o.PromptTokensPerSecond += prompt / dt
				ttft = ttft.add(smp.ttft.sub(p.ttft))
			case aggregate:
				o.PromptTokensPerSecond += max(prompt-max(smp.remoteTokens-p.remoteTokens, 0), 0) / dt
				decTTFT = decTTFT.add(smp.ttft.sub(p.ttft))
			}
			if role == slo.DecodeRole {
				itl = itl.add(smp.itl.sub(p.itl))
			}
		}
	}
	if ttft.total() == 0 {
		ttft = decTTFT
	}
	s.prev = cur
	decode := map[string]bool{}
	for _, id := range b.Replicas(md.Name, slo.DecodeRole) {
		decode[id] = true
	}
	for _, e := range load.Engines() {
		if decode[e.ID] {
			o.RunningStreams += float64(e.Running)
		}
	}
	if !seen {
		return nil
	}
	o.MeasuredTTFT, o.MeasuredTPOT = ttft.quantile(0.9), itl.quantile(0.9)
	if src, ok := load.(orchestrator.SLOSource); ok && slo.PrefillTokensPerSecond <= 0 {
		// No profiled throughput: the prefill rate the ingresses learned,
		// as the controller reads it (0 until one shares: prefill then
		// follows its metric targets). *gossip.Node is an SLOSource.
		o.PrefillTokensPerReplica, _ = orchestrator.LearnedPrefillRate(src, b.Replicas(md.Name, slo.PrefillRole))
	}
	return &o
}

// engineURLs is the optional Backend capability the SLO mode needs: an
// engine's HTTP base URL by id ("" when unknown).
type engineURLs interface {
	EngineURL(id string) string
}

func (s *sloScraper) urlOf(b Backend, id string) string {
	if u, ok := b.(engineURLs); ok {
		return u.EngineURL(id)
	}
	return ""
}

func (s *sloScraper) scrape(ctx context.Context, url string) (engineSample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(url, "/")+"/metrics", nil)
	if err != nil {
		return engineSample{}, err
	}
	resp, err := s.client.Do(req)
	if err != nil {
		return engineSample{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return engineSample{}, fmt.Errorf("metrics: %s", resp.Status)
	}
	return parseEngineSample(io.LimitReader(resp.Body, 8<<20))
}

// parseEngineSample reads the counters and histograms the SLO mode needs
// from a Prometheus text exposition (series of several ranks are summed).
func parseEngineSample(r io.Reader) (engineSample, error) {
	p := expfmt.NewTextParser(model.LegacyValidation)
	fams, err := p.TextToMetricFamilies(r)
	if err != nil {
		return engineSample{}, fmt.Errorf("parse metrics: %w", err)
	}
	var s engineSample
	sum := func(name, label, value string) (float64, bool) {
		f, ok := fams[name]
		if !ok {
			return 0, false
		}
		var v float64
		for _, m := range f.GetMetric() {
			if label != "" && !slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == label && l.GetValue() == value }) {
				continue
			}
			if c := m.GetCounter(); c != nil {
				v += c.GetValue()
			}
		}
		return v, true
	}
	s.promptTokens, _ = sum("vllm:prompt_tokens_total", "", "")
	// KV loaded through the connector: vllm:prompt_tokens_by_source's
	// external_kv_transfer, or on a vLLM without it
	// vllm:external_prefix_cache_hits_total (the same tokens).
	var ok bool
	if s.remoteTokens, ok = sum("vllm:prompt_tokens_by_source_total", "source", "external_kv_transfer"); !ok {
		s.remoteTokens, _ = sum("vllm:external_prefix_cache_hits_total", "", "")
	}
	hist := func(name string) histogram {
		var h histogram
		f, ok := fams[name]
		if !ok {
			return h
		}
		for _, m := range f.GetMetric() {
			ph := m.GetHistogram()
			if ph == nil {
				continue
			}
			var one histogram
			for _, b := range ph.GetBucket() {
				one.bounds = append(one.bounds, b.GetUpperBound())
				one.counts = append(one.counts, float64(b.GetCumulativeCount()))
			}
			h = h.add(one)
		}
		return h
	}
	s.ttft, s.itl = hist("vllm:time_to_first_token_seconds"), hist("vllm:inter_token_latency_seconds")
	return s, nil
}

// add merges two histograms with the same buckets (an empty one is the
// identity; different buckets keep h).
func (h histogram) add(o histogram) histogram {
	if len(h.bounds) == 0 {
		return histogram{bounds: append([]float64(nil), o.bounds...), counts: append([]float64(nil), o.counts...)}
	}
	if len(o.bounds) != len(h.bounds) {
		return h
	}
	out := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
	for i := range h.counts {
		out.counts[i] = h.counts[i] + o.counts[i]
	}
	return out
}

// total is the number of observations (0 when empty).
func (h histogram) total() float64 {
	if len(h.counts) == 0 {
		return 0
	}
	return h.counts[len(h.counts)-1]
}

// sub is h minus an earlier sample of the same series (a restarted engine,
// whose counts went down, gives h itself).
func (h histogram) sub(o histogram) histogram {
	if len(o.bounds) != len(h.bounds) {
		return h
	}
	out := histogram{bounds: h.bounds, counts: make([]float64, len(h.counts))}
	for i := range h.counts {
		out.counts[i] = h.counts[i] - o.counts[i]
		if out.counts[i] < 0 {
			return h
		}
	}
	return out
}

// quantile interpolates linearly within the bucket holding q (Prometheus's
// histogram_quantile); 0 when empty. Above the last finite bound it is
// that bound.
func (h histogram) quantile(q float64) float64 {
	n := len(h.counts)
	if n == 0 || h.counts[n-1] <= 0 {
		return 0
	}
	rank := q * h.counts[n-1]
	i := sort.Search(n, func(i int) bool { return h.counts[i] >= rank })
	if i >= n {
		i = n - 1
	}
	if math.IsInf(h.bounds[i], 1) {
		if i == 0 {
			return 0
		}
		return h.bounds[i-1]
	}
	lo, below := 0.0, 0.0
	if i > 0 {
		lo, below = h.bounds[i-1], h.counts[i-1]
	}
	in := h.counts[i] - below
	if in <= 0 {
		return h.bounds[i]
	}
	return lo + (h.bounds[i]-lo)*(rank-below)/in
}
