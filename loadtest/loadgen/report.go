package loadgen

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
)

// Latency summarises one latency distribution, in seconds. With no sample
// (N 0) it is undefined: its numbers are 0 in Go and null in JSON.
type Latency struct {
	N    int     `json:"n"`
	Mean float64 `json:"mean_s"`
	P50  float64 `json:"p50_s"`
	P90  float64 `json:"p90_s"`
	P99  float64 `json:"p99_s"`
	Max  float64 `json:"max_s"`
}

// latencyJSON is Latency's JSON, its numbers null when undefined.
type latencyJSON struct {
	N    int      `json:"n"`
	Mean *float64 `json:"mean_s"`
	P50  *float64 `json:"p50_s"`
	P90  *float64 `json:"p90_s"`
	P99  *float64 `json:"p99_s"`
	Max  *float64 `json:"max_s"`
}

// MarshalJSON writes l with null numbers when it has no sample: a 0 there
// would read as a measured latency (as in `kvmesh bench --json`).
func (l Latency) MarshalJSON() ([]byte, error) {
	ok := l.N > 0
	return json.Marshal(latencyJSON{N: l.N, Mean: opt(ok, l.Mean), P50: opt(ok, l.P50), P90: opt(ok, l.P90), P99: opt(ok, l.P99), Max: opt(ok, l.Max)})
}

// opt is &v when ok, else nil (JSON null).
func opt(ok bool, v float64) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// Report is a run's result. Definitions match loadtest/des: throughput is completed
// requests / the run's duration, from the first send to the last request's end,
// completed or failed (a run whose last requests time out took that long:
// before, the window ended at the last success and a tail of failures
// overstated req/s); TPOT as report.TPOTs; prefix hit rate is Σ cached prompt tokens /
// Σ prompt tokens (engine-reported, from usage); load imbalance is max / mean of
// requests completed per engine (from the X-Kvmesh-Engine header; 0 when unknown).
// Numbers that are undefined (nothing completed, no usage, no engine named,
// nothing sent) are 0 in Go and null in JSON (MarshalJSON), as `kvmesh bench
// --json` writes them.
type Report struct {
	Requests  int `json:"requests"`
	Sent      int `json:"sent"`
	Completed int `json:"completed"`
	Failed    int `json:"failed"`
	// NoOutput counts the completed requests whose stream carried no
	// output event (Result.NoOutput): their TTFT is undefined, left out of
	// TTFT.
	NoOutput int `json:"completed_without_output,omitempty"`
	// Errors counts the failed requests by kind; FirstErrors holds each
	// kind's first message, cut to 200 bytes (`kvmesh bench --json`
	// writes both per policy).
	Errors           map[string]int    `json:"errors,omitempty"`
	FirstErrors      map[string]string `json:"first_errors,omitempty"`
	DurationS        float64           `json:"duration_s"`
	ThroughputRPS    float64           `json:"throughput_rps"`
	OutputTokensPerS float64           `json:"output_tokens_per_s"`
	// TTFT is over the completed requests with an output event (all but
	// NoOutput).
	TTFT Latency `json:"ttft"`
	E2E  Latency `json:"e2e"`
	// TPOTMeanS and TPOTP99S are the mean and 99th percentile time per
	// output token after the first, over the completed requests of two
	// output tokens or more per sequence (report.TPOTs; `kvmesh bench
	// --json`'s tpot_mean_s and tpot_p99_s); tpotN counts them (0: null).
	TPOTMeanS   float64 `json:"tpot_mean_s"`
	TPOTP99S    float64 `json:"tpot_p99_s"`
	tpotN       int
	SendLagP99S float64 `json:"send_lag_p99_s"`
	// SlotWaits counts the arrivals that found every concurrency slot
	// taken (their send lag is that wait; without any, lag is the client
	// host's own scheduling delay).
	SlotWaits int `json:"slot_waits"`
	// OpenLoop is true when requests had arrival times (send lag then means the
	// concurrency cap delayed arrivals; in a closed loop every request waits by design).
	OpenLoop      bool           `json:"open_loop"`
	PromptTokens  int64          `json:"prompt_tokens"`
	CachedTokens  int64          `json:"cached_tokens"`
	OutputTokens  int64          `json:"output_tokens"`
	PrefixHitRate float64        `json:"prefix_hit_rate"`
	PerEngine     map[string]int `json:"per_engine,omitempty"`
	// LoadImbalance is over the engines LoadImbalanceEngines says:
	// "given" (CountEngines, `kvmesh loadtest -engines`: an engine that
	// served nothing counts as its 0) or "answered" (those named by a
	// completed request's header; one that served nothing is unseen).
	// Over one engine that answered it is undefined (null: 1.00 would
	// claim a perfect balance the run cannot see).
	LoadImbalance        float64 `json:"load_imbalance"`
	LoadImbalanceEngines string  `json:"load_imbalance_engines,omitempty"`
	// NonCanonicalSSE counts the requests whose stream was valid SSE in
	// another form than vLLM's (Result.NonCanonicalSSE).
	NonCanonicalSSE int `json:"non_canonical_sse,omitempty"`
	// Results holds every request's measurements, in send order.
	Results []Result `json:"-"`
	// enginesKnown: CountEngines gave every engine, so PerEngine holds
	// those that served nothing too.
	enginesKnown bool
}

// reportJSON is Report's JSON: its fields, those that may be undefined
// replaced by pointers (nil: null).
type reportJSON struct {
	reportFields
	DurationS        *float64 `json:"duration_s"`
	ThroughputRPS    *float64 `json:"throughput_rps"`
	OutputTokensPerS *float64 `json:"output_tokens_per_s"`
	SendLagP99S      *float64 `json:"send_lag_p99_s"`
	PrefixHitRate    *float64 `json:"prefix_hit_rate"`
	LoadImbalance    *float64 `json:"load_imbalance"`
	TPOTMeanS        *float64 `json:"tpot_mean_s"`
	TPOTP99S         *float64 `json:"tpot_p99_s"`
}

// reportFields is Report without its methods (so without MarshalJSON).
type reportFields Report

// MarshalJSON writes r with null for what is undefined: the duration,
// throughputs and latencies when nothing completed, the send lag when
// nothing was sent, the hit rate when no usage was reported, the load
// imbalance when it is undefined (report.Imbalance) or no engine was named.
func (r Report) MarshalJSON() ([]byte, error) {
	timed := r.Completed > 0 && r.DurationS > 0
	return json.Marshal(reportJSON{reportFields: reportFields(r),
		DurationS: opt(timed, r.DurationS), ThroughputRPS: opt(timed, r.ThroughputRPS), OutputTokensPerS: opt(timed, r.OutputTokensPerS),
		SendLagP99S: opt(r.Sent > 0, r.SendLagP99S), PrefixHitRate: opt(r.PromptTokens > 0, r.PrefixHitRate),
		LoadImbalance: opt(r.LoadImbalance > 0, r.LoadImbalance), TPOTMeanS: opt(r.tpotN > 0, r.TPOTMeanS), TPOTP99S: opt(r.tpotN > 0, r.TPOTP99S)})
}

// FailureSummary is one line per error kind with its count and the first
// message seen ("" when nothing failed).
func (r *Report) FailureSummary() string {
	return report.FailureSummary(r.Errors, r.firstErrors())
}

// firstErrors is each error kind's first message, cut to 200 bytes.
func (r *Report) firstErrors() map[string]string {
	first := map[string]string{}
	for i := range r.Results {
		res := &r.Results[i]
		if _, ok := first[res.ErrKind]; res.ErrKind == "" || ok {
			continue
		}
		m := strings.TrimSpace(res.ErrMsg)
		if len(m) > 200 {
			m = strings.ToValidUTF8(m[:200], "") + "…"
		}
		first[res.ErrKind] = m
	}
	return first
}

func buildReport(results []Result, total int) *Report {
	r := &Report{Requests: total, Sent: len(results), Errors: map[string]int{}, PerEngine: map[string]int{}, Results: results}
	var ttft, e2e, lag []float64
	var first, last time.Duration = -1, 0
	for i := range results {
		res := &results[i]
		if first < 0 || res.Sent < first {
			first = res.Sent
		}
		lag = append(lag, res.SendLag.Seconds())
		last = max(last, res.Sent+res.E2E) // a failure's end too (timeouts)
		if res.NonCanonicalSSE {
			r.NonCanonicalSSE++
		}
		if res.ErrKind != "" {
			r.Failed++
			r.Errors[res.ErrKind]++
			continue
		}
		r.Completed++
		if res.NoOutput {
			r.NoOutput++
		} else {
			ttft = append(ttft, res.TTFT.Seconds())
		}
		e2e = append(e2e, res.E2E.Seconds())
		r.PromptTokens += int64(res.PromptTokens)
		r.CachedTokens += int64(res.CachedTokens)
		r.OutputTokens += int64(res.OutputTokens)
		if res.Engine != "" {
			r.PerEngine[res.Engine]++
		}
	}
	if r.Completed > 0 && last > first {
		r.DurationS = (last - first).Seconds()
		r.ThroughputRPS = float64(r.Completed) / r.DurationS
		r.OutputTokensPerS = float64(r.OutputTokens) / r.DurationS
	}
	if r.Failed > 0 {
		r.FirstErrors = r.firstErrors()
	}
	r.TTFT, r.E2E = summarize(ttft), summarize(e2e)
	r.SendLagP99S = summarize(lag).P99
	if r.PromptTokens > 0 {
		r.PrefixHitRate = float64(r.CachedTokens) / float64(r.PromptTokens)
	}
	r.setImbalance()
	tpot := report.TPOTs(r.Run(1, nil).Records)
	if r.tpotN = len(tpot); r.tpotN > 0 {
		r.TPOTMeanS, r.TPOTP99S = mean(tpot), report.Quantile(tpot, 0.99)
	}
	return r
}

func mean(xs []float64) float64 {
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return sum / float64(len(xs))
}

// CountEngines adds engines that served nothing (known from elsewhere, e.g. the
// cluster's membership), so the load imbalance counts them as the zeros they are.
func (r *Report) CountEngines(ids []string) {
	r.enginesKnown = true
	for _, id := range ids {
		if _, ok := r.PerEngine[id]; !ok {
			r.PerEngine[id] = 0
		}
	}
	r.setImbalance()
}

// setImbalance sets the load imbalance and what it is over.
func (r *Report) setImbalance() {
	r.LoadImbalance, r.LoadImbalanceEngines = 0, ""
	switch {
	case len(r.PerEngine) == 0:
		return
	case r.enginesKnown:
		r.LoadImbalanceEngines = "given"
	default:
		r.LoadImbalanceEngines = "answered"
		if len(r.PerEngine) < 2 {
			return
		}
	}
	r.LoadImbalance = report.Imbalance(maps.Values(r.PerEngine))
}

// EnginesUnseen reports whether engines that served nothing may be
// missing from r's load imbalance (no CountEngines).
func (r *Report) EnginesUnseen() bool { return len(r.PerEngine) > 0 && !r.enginesKnown }

// summarize sorts xs and returns its mean and quantiles (report.Quantile).
func summarize(xs []float64) Latency {
	if len(xs) == 0 {
		return Latency{}
	}
	slices.Sort(xs)
	sum := 0.0
	for _, x := range xs {
		sum += x
	}
	return Latency{N: len(xs), Mean: sum / float64(len(xs)), P50: report.Quantile(xs, 0.50), P90: report.Quantile(xs, 0.90),
		P99: report.Quantile(xs, 0.99), Max: xs[len(xs)-1]}
}

// PolicyResult converts the report to the line `kvmesh bench --json` prints per policy.
func (r *Report) PolicyResult() report.PolicyResult {
	p := report.PolicyResult{
		ThroughputRPS: r.ThroughputRPS,
		TTFTMean:      r.TTFT.Mean, TTFTP50: r.TTFT.P50, TTFTP90: r.TTFT.P90, TTFTP99: r.TTFT.P99,
		E2EMean:         r.E2E.Mean,
		PrefixHitRate:   r.PrefixHitRate,
		HitUnknown:      r.PromptTokens == 0,
		LoadImbalance:   r.LoadImbalance,
		ImbalanceUnseen: r.EnginesUnseen(),
		Completed:       r.Completed,
		Failed:          r.Failed,
		Makespan:        time.Duration(r.DurationS * float64(time.Second)),
		Errors:          r.Errors,
		FirstErrors:     r.FirstErrors,
		QueueUnknown:    true, // the engines' queues are theirs
	}
	p.SetRecordStats(r.Run(1, nil).Records) // E2E p99 and TPOT, in wall seconds as the rest
	return p
}

// WriteText writes a human-readable summary.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "requests      %d sent, %d completed, %d failed\n", r.Sent, r.Completed, r.Failed)
	first := r.firstErrors()
	for _, k := range slices.Sorted(maps.Keys(r.Errors)) {
		fmt.Fprintf(&b, "  error %-14s %d", k, r.Errors[k])
		if m := first[k]; m != "" {
			fmt.Fprintf(&b, " (first: %s)", m)
		}
		b.WriteByte('\n')
	}
	if r.Completed > 0 && r.DurationS > 0 {
		fmt.Fprintf(&b, "duration      %.2f s\n", r.DurationS)
		fmt.Fprintf(&b, "throughput    %.2f req/s, %.0f output tok/s\n", r.ThroughputRPS, r.OutputTokensPerS)
	} else {
		fmt.Fprintf(&b, "duration      n/a\nthroughput    n/a\n")
	}
	switch {
	case r.NoOutput > 0 && r.NoOutput == r.Completed:
		fmt.Fprintf(&b, "TTFT          n/a: no completed request streamed an output event (text, reasoning or a tool call)\n")
	case r.Completed == 0:
		fmt.Fprintf(&b, "TTFT          n/a\n")
	default:
		fmt.Fprintf(&b, "TTFT          mean %s  p50 %s  p90 %s  p99 %s", ms(r.TTFT.Mean), ms(r.TTFT.P50), ms(r.TTFT.P90), ms(r.TTFT.P99))
		if r.NoOutput > 0 {
			fmt.Fprintf(&b, "  (over %d: %d completed without an output event are left out)", r.Completed-r.NoOutput, r.NoOutput)
		}
		b.WriteByte('\n')
	}
	if r.tpotN > 0 {
		fmt.Fprintf(&b, "TPOT          mean %s  p99 %s\n", ms(r.TPOTMeanS), ms(r.TPOTP99S))
	} else {
		fmt.Fprintf(&b, "TPOT          n/a (no completed request of two output tokens or more)\n")
	}
	if r.E2E.N > 0 {
		fmt.Fprintf(&b, "E2E           mean %s  p50 %s  p90 %s  p99 %s\n", ms(r.E2E.Mean), ms(r.E2E.P50), ms(r.E2E.P90), ms(r.E2E.P99))
	} else {
		fmt.Fprintf(&b, "E2E           n/a\n")
	}
	switch {
	case r.Completed == 0:
		fmt.Fprintf(&b, "tokens        n/a (no request completed)\n")
	case r.PromptTokens == 0:
		fmt.Fprintf(&b, "tokens        prompt and cached not reported (the server sent no usage), output %d (counted as output chunks)\n", r.OutputTokens)
	default:
		fmt.Fprintf(&b, "tokens        prompt %d (cached %d, hit rate %.1f%%), output %d\n", r.PromptTokens, r.CachedTokens, 100*r.PrefixHitRate, r.OutputTokens)
	}
	if len(r.PerEngine) > 0 {
		imb := fmt.Sprintf("%.2f", r.LoadImbalance)
		switch {
		case r.LoadImbalance > 0:
		case !r.enginesKnown && len(r.PerEngine) == 1:
			imb = "n/a" // the line says why
		default:
			imb = "n/a (fewer requests completed than engines)"
		}
		if r.enginesKnown {
			fmt.Fprintf(&b, "engines       load imbalance %s:", imb)
		} else {
			fmt.Fprintf(&b, "engines       load imbalance %s over the %d that answered (engines that served nothing are unseen; -engines names them all):", imb, len(r.PerEngine))
		}
		for _, e := range slices.Sorted(maps.Keys(r.PerEngine)) {
			fmt.Fprintf(&b, " %s=%d", e, r.PerEngine[e])
		}
		b.WriteByte('\n')
	}
	if r.NonCanonicalSSE > 0 {
		fmt.Fprintf(&b, "SSE framing   %d streams were valid SSE but not in vLLM's form (e.g. \"data:\" without its space, id: or event: lines): read as the SSE standard allows\n", r.NonCanonicalSSE)
	}
	if r.OpenLoop && r.SendLagP99S > 0.001 {
		if r.SlotWaits > 0 {
			fmt.Fprintf(&b, "send lag p99  %s (%d arrivals waited for a concurrency slot)\n", ms(r.SendLagP99S), r.SlotWaits)
			fmt.Fprintf(&b, "warning       latencies count from the send, not the scheduled arrival: the %d delayed arrivals' wait is only in the send lag, so TTFT and E2E understate a stall (raise -concurrency)\n", r.SlotWaits)
		} else {
			fmt.Fprintf(&b, "send lag p99  %s (the client host's scheduling delay: no arrival waited for a slot)\n", ms(r.SendLagP99S))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

func ms(s float64) string { return fmt.Sprintf("%.1fms", s*1000) }
