package des

import (
	"iter"
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// runStats accumulates one policy's per-request results.
type runStats struct {
	ttft, e2e     []float64 // seconds, per finished request
	queueSum      float64   // Σ engine queue time (arrival → first scheduled), seconds
	cached        int
	prompt        int
	perEngine     []int
	firstDispatch time.Duration
	lastFinish    time.Duration
	anyDispatch   bool
	failed        int
	badEvents     int
	preemptions   int
	wall          time.Duration
	// Output-length prediction: Σ |predicted − true| and Σ true, over
	// dispatched requests that had a prediction.
	predErr, predTrue float64
}

func (r *runStats) predicted(pred, actual int) {
	if pred > 0 {
		r.predErr += math.Abs(float64(pred - actual))
		r.predTrue += float64(actual)
	}
}

func (r *runStats) init(n, engines int) {
	r.ttft = make([]float64, 0, n)
	r.e2e = make([]float64, 0, n)
	r.perEngine = make([]int, engines)
}

func (r *runStats) dispatched(now time.Duration) {
	if !r.anyDispatch || now < r.firstDispatch {
		r.firstDispatch, r.anyDispatch = now, true
	}
}

func (r *runStats) finished(_ int, e int, res engine.Result) {
	r.ttft = append(r.ttft, res.TTFT.Seconds())
	r.e2e = append(r.e2e, (res.Finished - res.Arrival).Seconds())
	r.queueSum += res.QueueTime.Seconds()
	r.cached += res.CachedTokens + res.CPUCachedTokens
	r.prompt += res.PromptTokens
	r.perEngine[e]++
	r.lastFinish = max(r.lastFinish, res.Finished)
	r.preemptions += res.Preemptions
}

// PolicyResult is one policy's line of the report. JSON names are fixed
// (scripts rely on them); the extra fields are for the table only.
type PolicyResult struct {
	ThroughputRPS float64 `json:"throughput_rps"`
	TTFTMean      float64 `json:"ttft_mean_s"`
	TTFTP50       float64 `json:"ttft_p50_s"`
	TTFTP90       float64 `json:"ttft_p90_s"`
	TTFTP99       float64 `json:"ttft_p99_s"`
	E2EMean       float64 `json:"e2e_mean_s"`
	// PrefixHitRate is Σ cached prompt tokens / Σ prompt tokens.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// LoadImbalance is max / mean of requests completed per engine
	// (1 = perfectly even).
	LoadImbalance float64 `json:"load_imbalance"`

	// QueueMean is the mean time a request waited in the engine's queue
	// before its first scheduling (part of TTFT).
	QueueMean   float64       `json:"-"`
	Completed   int           `json:"-"`
	Failed      int           `json:"-"`
	Preemptions int           `json:"-"`
	BadEvents   int           `json:"-"`
	Makespan    time.Duration `json:"-"`
	Wall        time.Duration `json:"-"`
	// OutputPredError is the router's output-length prediction error,
	// Σ|predicted − true| / Σ true (0 when nothing was predicted).
	OutputPredError float64 `json:"-"`
	// Learned is kvmesh's learned cost model at the end of the run, pooled
	// over engines (zero for other policies).
	Learned learn.Rates `json:"-"`
}

// Report is the benchmark's output: `kvmesh bench --json` prints it.
type Report struct {
	Policies      map[string]PolicyResult `json:"policies"`
	OracleHitRate float64                 `json:"oracle_hit_rate"`
	// Order is the policies in the order run (for the table).
	Order []string `json:"-"`
}

func (r *runStats) result() PolicyResult {
	p := PolicyResult{Completed: len(r.ttft), Failed: r.failed, Preemptions: r.preemptions, BadEvents: r.badEvents, Wall: r.wall}
	if len(r.ttft) == 0 {
		return p
	}
	p.Makespan = r.lastFinish - r.firstDispatch
	if p.Makespan > 0 {
		p.ThroughputRPS = float64(len(r.ttft)) / p.Makespan.Seconds()
	}
	slices.Sort(r.ttft)
	p.TTFTMean = mean(r.ttft)
	p.TTFTP50 = Quantile(r.ttft, 0.50)
	p.TTFTP90 = Quantile(r.ttft, 0.90)
	p.TTFTP99 = Quantile(r.ttft, 0.99)
	p.E2EMean = mean(r.e2e)
	p.QueueMean = r.queueSum / float64(len(r.ttft))
	if r.prompt > 0 {
		p.PrefixHitRate = float64(r.cached) / float64(r.prompt)
	}
	p.LoadImbalance = Imbalance(slices.Values(r.perEngine))
	if r.predTrue > 0 {
		p.OutputPredError = r.predErr / r.predTrue
	}
	return p
}

func mean(v []float64) float64 {
	s := 0.0
	for _, x := range v {
		s += x
	}
	return s / float64(len(v))
}

// Quantile is the nearest-rank q-quantile of sorted v (0 when v is empty).
// It and Imbalance define the numbers every kvmesh report shares: `kvmesh
// bench`, `kvmesh demo` and `kvmesh loadtest` compute them the same way.
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	i := int(math.Ceil(q*float64(len(sorted)))) - 1
	return sorted[min(max(i, 0), len(sorted)-1)]
}

// Imbalance is max / mean of the requests each engine completed (1 = even;
// 0 when none completed). Engines that completed nothing count as zeros.
func Imbalance(perEngine iter.Seq[int]) float64 {
	mx, sum, n := 0, 0, 0
	for c := range perEngine {
		mx, sum, n = max(mx, c), sum+c, n+1
	}
	if sum == 0 {
		return 0
	}
	return float64(mx) / (float64(sum) / float64(n))
}
