// Package report holds the numbers every kvmesh load report shares and
// how they are computed: PolicyResult (one policy's or one run's line),
// Report (a comparison, as `kvmesh bench --json` prints it), Quantile and
// Imbalance. `kvmesh bench` (loadtest/des), `kvmesh demo` and `kvmesh
// loadtest` (loadtest/loadgen) all use it, so it imports nothing of theirs.
package report

import (
	"fmt"
	"io"
	"iter"
	"math"
	"strings"
	"text/tabwriter"
	"time"
)

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
	// OfferedHitRate is the hit rate the requests would have had on the
	// engine caching most of each prompt when it was routed (the router's
	// index; DES only). PrefixHitRate below it is hits the policy gave up,
	// for balance or by mistake; OfferedHitRate below a bound of the whole
	// cluster's capacity is the caches' own loss (copies, evictions). Table
	// only: the JSON is the same in DES and live mode, and a live run's
	// routing happens inside the ingresses.
	OfferedHitRate float64 `json:"-"`
	// LoadImbalance is max / mean of requests completed per engine
	// (1 = perfectly even).
	LoadImbalance float64 `json:"load_imbalance"`
	// EngineTTFTMean is the mean TTFT the engines themselves report
	// (vLLM's time-to-first-token histogram), live mode only: the client's
	// TTFT minus it is the mesh's overhead (HTTP, routing, host delays).
	EngineTTFTMean float64 `json:"engine_ttft_mean_s,omitempty"`

	// QueueMean is the mean time a request waited in the engine's queue
	// before its first scheduling (part of TTFT).
	QueueMean float64 `json:"-"`
	// Completed and Failed count the requests that finished and those
	// that did not: latencies and throughput are over the completed ones
	// (the DES's hit rate over every request routed), so a script reading
	// the JSON must see the failures too.
	Completed   int           `json:"completed"`
	Failed      int           `json:"failed"`
	Preemptions int           `json:"-"`
	BadEvents   int           `json:"-"`
	Makespan    time.Duration `json:"-"`
	Wall        time.Duration `json:"-"`
	// FailureNote says why requests failed, when some did and the run
	// knows (live mode: each error kind's count and first message).
	FailureNote string `json:"-"`
	// OutputPredError is the router's output-length prediction error,
	// Σ|predicted − true| / Σ true (0 when nothing was predicted).
	OutputPredError float64 `json:"-"`
	// Learned is kvmesh's learned cost model at the end of a DES run,
	// pooled over engines (zero for other policies): prefill tokens/s, a
	// decode step's fixed cost and its cost per context token, seconds.
	Learned LearnedCosts `json:"-"`
}

// LearnedCosts is a learned cost model (scheduler/learn.Rates).
type LearnedCosts struct {
	PrefillRate, StepBase, DecodeSecPerToken float64
}

// Report is the benchmark's output: `kvmesh bench --json` prints it.
type Report struct {
	Policies      map[string]PolicyResult `json:"policies"`
	OracleHitRate float64                 `json:"oracle_hit_rate"`
	// Order is the policies in the order run (for the table).
	Order []string `json:"-"`
	// Runs holds each policy's finished requests, for the HTML report's
	// plots (nil when not collected).
	Runs map[string]Run `json:"-"`
}

// WriteTable writes the report as an aligned text table.
func (r Report) WriteTable(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tthroughput rps\tTTFT mean s\tp50 s\tp90 s\tp99 s\tqueue s\te2e mean s\thit rate\timbalance\tdone\tfailed\tpreempt\twall\t")
	for _, name := range r.Order {
		p, ok := r.Policies[name]
		if !ok {
			continue
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.3f\t%.2f\t%d\t%d\t%d\t%.1fs\t\n",
			name, p.ThroughputRPS, p.TTFTMean, p.TTFTP50, p.TTFTP90, p.TTFTP99, p.QueueMean, p.E2EMean,
			p.PrefixHitRate, p.LoadImbalance, p.Completed, p.Failed, p.Preemptions, p.Wall.Seconds())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, name := range r.Order {
		if p := r.Policies[name]; p.Learned.PrefillRate > 0 {
			fmt.Fprintf(w, "%s learned: prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g; output length predicted within %.0f%% (mean abs error)\n",
				name, p.Learned.PrefillRate, p.Learned.StepBase, p.Learned.DecodeSecPerToken, 100*p.OutputPredError)
		}
	}
	if o := r.offered(r.Order); o != "" {
		fmt.Fprintln(w, o)
	}
	_, err := fmt.Fprintf(w, "oracle (infinite shared cache) hit rate: %.3f\n", r.OracleHitRate)
	return err
}

// offered is the line that lists names' offered hit rates and the part
// each policy took ("" when none was measured: live runs, P/D).
func (r Report) offered(names []string) string {
	var b strings.Builder
	for _, name := range names {
		if p := r.Policies[name]; p.OfferedHitRate > 0 {
			if b.Len() == 0 {
				b.WriteString("hit rate offered (the engine caching most of each prompt when routed), and the part taken:")
			}
			fmt.Fprintf(&b, " %s %.3f (%.0f%%)", name, p.OfferedHitRate, 100*p.PrefixHitRate/p.OfferedHitRate)
		}
	}
	return b.String()
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
