package des

import (
	"math"
	"slices"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"

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
	recs              records // every finished request (series.go)
	// offered and routed: Σ the prompt tokens the engine caching most of
	// each request's prompt held at routing time (the router's index), and
	// Σ the routed requests' prompt tokens.
	offered, routed int
}

func (r *runStats) predicted(pred, actual int) {
	if pred > 0 {
		r.predErr += math.Abs(float64(pred - actual))
		r.predTrue += float64(actual)
	}
}

// offer records a routed request: its prompt and the largest prefix, in
// tokens, any candidate engine held for it in the router's index.
func (r *runStats) offer(prompt, best int) {
	r.offered += min(best, prompt)
	r.routed += prompt
}

func (r *runStats) init(n, engines int) {
	r.ttft = make([]float64, 0, n)
	r.e2e = make([]float64, 0, n)
	r.perEngine = make([]int, engines)
	r.recs.engines = engines
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
	r.recs.add(e, res)
}

func (r *runStats) result() report.PolicyResult {
	p := report.PolicyResult{Completed: len(r.ttft), Failed: r.failed, Preemptions: r.preemptions, BadEvents: r.badEvents, Wall: r.wall}
	if len(r.ttft) == 0 {
		return p
	}
	p.Makespan = r.lastFinish - r.firstDispatch
	if p.Makespan > 0 {
		p.ThroughputRPS = float64(len(r.ttft)) / p.Makespan.Seconds()
	}
	slices.Sort(r.ttft)
	p.TTFTMean = mean(r.ttft)
	p.TTFTP50 = report.Quantile(r.ttft, 0.50)
	p.TTFTP90 = report.Quantile(r.ttft, 0.90)
	p.TTFTP99 = report.Quantile(r.ttft, 0.99)
	p.E2EMean = mean(r.e2e)
	p.QueueMean = r.queueSum / float64(len(r.ttft))
	if r.prompt > 0 {
		p.PrefixHitRate = float64(r.cached) / float64(r.prompt)
	}
	if r.routed > 0 {
		p.OfferedHitRate = float64(r.offered) / float64(r.routed)
	}
	p.LoadImbalance = report.Imbalance(slices.Values(r.perEngine))
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
