package des

import (
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/scheduler"
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
	predN             int     // predictions scored
	recs              records // every finished request (series.go)
	// offered and routed: Σ the prompt tokens the engine caching most of
	// each request's prompt held at routing time (the router's index), over
	// the requests an engine took, and Σ every routed request's prompt
	// tokens, including those the engine refused (failed: too long).
	// pending is the offer of the request being routed until its engine
	// takes it (dispatched) or refuses it (the next offer drops it).
	offered, routed, pending int
	// errs counts the failed requests by kind (failKind), firstErr
	// holds each kind's first reason.
	errs     map[string]int
	firstErr map[string]string
}

// failKind is the kind of a request's failure, as report.PolicyResult's
// Errors counts them: too_long (the engine refused it: longer than its KV
// cache or max model length), no_candidate (the scheduler had no engine),
// or error.
func failKind(err error) string {
	switch {
	case errors.Is(err, engine.ErrTooLong):
		return "too_long"
	case errors.Is(err, scheduler.ErrNoCandidates):
		return "no_candidate"
	}
	return "error"
}

// fail records a request that failed at now and its reason.
func (r *runStats) fail(now time.Duration, err error) {
	r.failed++
	k := failKind(err)
	r.recs.fails = append(r.recs.fails, report.Failure{Start: now.Seconds(), Engine: -1, Kind: k})
	if r.errs == nil {
		r.errs, r.firstErr = map[string]int{}, map[string]string{}
	}
	if r.errs[k]++; r.errs[k] == 1 {
		m := err.Error()
		if len(m) > 200 {
			m = strings.ToValidUTF8(m[:200], "") + "…"
		}
		r.firstErr[k] = m
	}
}

func (r *runStats) predicted(pred, actual int) {
	if pred > 0 {
		r.predErr += math.Abs(float64(pred - actual))
		r.predTrue += float64(actual)
		r.predN++
	}
}

// offer records a routed request: its prompt and the largest prefix, in
// tokens, any candidate engine held for it in the router's index. The
// prefix counts as offered once the engine takes the request (dispatched,
// which sim.send calls after a successful engine Add and before routing
// the next request): a request no engine can serve is offered nothing it
// could take, but its prompt stays in the denominator (result).
func (r *runStats) offer(prompt, best int) {
	r.pending = min(best, prompt)
	r.routed += prompt
}

func (r *runStats) init(n, engines int) {
	r.ttft = make([]float64, 0, n)
	r.e2e = make([]float64, 0, n)
	r.perEngine = make([]int, engines)
	r.recs.engines = engines
}

func (r *runStats) dispatched(now time.Duration) {
	r.offered += r.pending
	r.pending = 0
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
	p := report.PolicyResult{Completed: len(r.ttft), Failed: r.failed, Preemptions: r.preemptions, BadEvents: r.badEvents, Wall: r.wall,
		Offered: true}
	p.Errors, p.FirstErrors = r.errs, r.firstErr
	if r.failed > 0 {
		p.FailureNote = fmt.Sprintf("%d of %d requests failed: %s", r.failed, r.failed+len(r.ttft), report.FailureSummary(r.errs, r.firstErr))
	}
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
	p.SetRecordStats(r.recs.recs)
	p.QueueMean = r.queueSum / float64(len(r.ttft))
	// The hit rate and the offered one share a denominator with the
	// oracle's (Run: every request): the prompt tokens of every routed
	// request, a failed one included as taking and being offered nothing.
	// Over the finished requests only, one long request that no engine
	// could hold made the hit rate exceed both the offered rate and the
	// oracle. Without a filter shedding requests before routing, every
	// request is routed, so taken ≤ offered (up to the index's lag) ≤ oracle.
	den := r.routed
	if den == 0 {
		den = r.prompt
	}
	if den > 0 {
		p.PrefixHitRate = float64(r.cached) / float64(den)
		p.OfferedHitRate = float64(r.offered) / float64(den)
	}
	p.LoadImbalance = report.Imbalance(slices.Values(r.perEngine))
	if p.OutputPredictions = r.predN; r.predTrue > 0 {
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

// learnedCosts is l's pooled estimate and the samples behind it (its own;
// 0: the rates are the prior).
func learnedCosts(l *learn.Learner) report.LearnedCosts {
	own, _ := l.Own(nil)
	n := 0
	for _, e := range own {
		n += int(e.Samples)
	}
	r := l.Pooled()
	return report.LearnedCosts{PrefillRate: r.PrefillRate, StepBase: r.StepBase, DecodeSecPerToken: r.DecodeSecPerToken, Samples: n}
}
