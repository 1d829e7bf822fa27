// Package report holds the numbers every kvmesh load report shares and
// how they are computed: PolicyResult (one policy's or one run's line),
// Report (a comparison, as `kvmesh bench --json` prints it), Quantile and
// Imbalance. `kvmesh bench` (loadtest/des), `kvmesh demo` and `kvmesh
// loadtest` (loadtest/loadgen) all use it, so it imports nothing of theirs.
package report

import (
	"encoding/json"
	"fmt"
	"io"
	"iter"
	"maps"
	"math"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// PolicyResult is one policy's line of the report. JSON names are fixed
// (scripts rely on them; docs/BENCHMARKS.md, "`kvmesh bench --json`",
// documents each); the fields tagged "-" are for the table only.
type PolicyResult struct {
	ThroughputRPS float64 `json:"throughput_rps"`
	TTFTMean      float64 `json:"ttft_mean_s"`
	TTFTP50       float64 `json:"ttft_p50_s"`
	TTFTP90       float64 `json:"ttft_p90_s"`
	TTFTP99       float64 `json:"ttft_p99_s"`
	E2EMean       float64 `json:"e2e_mean_s"`
	// E2EP99 is the 99th percentile of the end-to-end latency; TPOTMean
	// and TPOTP99 the mean and 99th percentile of the time per output
	// token after the first, over the TPOTCount requests of two output
	// tokens or more per sequence (SetRecordStats: the HTML report's).
	E2EP99    float64 `json:"e2e_p99_s"`
	TPOTMean  float64 `json:"tpot_mean_s"`
	TPOTP99   float64 `json:"tpot_p99_s"`
	TPOTCount int     `json:"-"`
	// PrefixHitRate is Σ cached prompt tokens / Σ prompt tokens: JSON
	// null, table n/a when undefined (hitDefined: nothing completed, or
	// HitUnknown, a server that reported no usage).
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	HitUnknown    bool    `json:"-"`
	// OfferedHitRate is the hit rate the requests would have had on the
	// engine caching most of each prompt when it was routed (the router's
	// index; DES only: Offered). PrefixHitRate below it is hits the policy
	// gave up, for balance or by mistake; OfferedHitRate below a bound of
	// the whole cluster's capacity is the caches' own loss (copies,
	// evictions). A live run's routing happens inside the ingresses: JSON
	// null there.
	OfferedHitRate float64 `json:"offered_hit_rate"`
	Offered        bool    `json:"-"`
	// LoadImbalance is max / mean of requests completed per engine
	// (1 = perfectly even), defined only when at least as many requests
	// completed as there are engines (Imbalance): 0 when not (JSON null,
	// table n/a).
	LoadImbalance float64 `json:"load_imbalance"`
	// ImbalanceUnseen: LoadImbalance is over the engines that answered
	// only (`kvmesh loadtest` without -engines): those that served nothing
	// are unseen, and with one it is undefined for that reason, not for
	// too few requests.
	ImbalanceUnseen bool `json:"-"`
	// EngineTTFTMean is the mean TTFT the engines themselves report
	// (vLLM's time-to-first-token histogram), live mode only: the client's
	// TTFT minus it is the mesh's overhead (HTTP, routing, host delays).
	EngineTTFTMean float64 `json:"engine_ttft_mean_s,omitempty"`

	// QueueMean is the mean time a request waited in the engine's queue
	// before its first scheduling (part of TTFT). QueueUnknown: not
	// measured (a client's own run: `kvmesh loadtest`, `kvmesh demo`, which
	// see no engine's queue): JSON null, table n/a.
	QueueMean    float64 `json:"queue_mean_s"`
	QueueUnknown bool    `json:"-"`
	// Completed and Failed count the requests that finished and those
	// that did not: latencies and throughput are over the completed ones
	// (the DES's hit rate over every request routed), so a script reading
	// the JSON must see the failures too. With none completed they are
	// undefined: JSON null (throughput_rps, ttft_*, e2e_*, tpot_*,
	// queue_mean_s, load_imbalance), table n/a.
	Completed   int `json:"completed"`
	Failed      int `json:"failed"`
	Preemptions int `json:"preemptions"`
	// Errors counts the failed requests by kind (the load generator's
	// kinds live, http_400, timeout...; the DES's too_long and
	// no_candidate), FirstErrors is each kind's first message (cut to 200
	// bytes): as `kvmesh loadtest -json` writes them, so a script reading
	// the JSON sees why requests failed. Left out when none failed.
	Errors      map[string]int    `json:"errors,omitempty"`
	FirstErrors map[string]string `json:"first_errors,omitempty"`
	BadEvents   int               `json:"-"`
	Makespan    time.Duration     `json:"-"`
	Wall        time.Duration     `json:"-"`
	// FailureNote says why requests failed, when some did and the run
	// knows (live mode: each error kind's count and first message).
	FailureNote string `json:"-"`
	// OutputPredError is the router's output-length prediction error,
	// Σ|predicted − true| / Σ true over the OutputPredictions requests
	// whose prediction was scored (0 and undefined when none was).
	OutputPredError   float64 `json:"-"`
	OutputPredictions int     `json:"-"`
	// Learned is kvmesh's learned cost model at the end of a DES run,
	// pooled over engines (zero for other policies): prefill tokens/s, a
	// decode step's fixed cost and its cost per context token, seconds.
	Learned LearnedCosts `json:"-"`
}

// policyJSON is PolicyResult's JSON: its JSON fields, in its order, the
// numbers that may be undefined as pointers (nil: null).
type policyJSON struct {
	ThroughputRPS  *float64          `json:"throughput_rps"`
	TTFTMean       *float64          `json:"ttft_mean_s"`
	TTFTP50        *float64          `json:"ttft_p50_s"`
	TTFTP90        *float64          `json:"ttft_p90_s"`
	TTFTP99        *float64          `json:"ttft_p99_s"`
	E2EMean        *float64          `json:"e2e_mean_s"`
	E2EP99         *float64          `json:"e2e_p99_s"`
	TPOTMean       *float64          `json:"tpot_mean_s"`
	TPOTP99        *float64          `json:"tpot_p99_s"`
	PrefixHitRate  *float64          `json:"prefix_hit_rate"`
	OfferedHitRate *float64          `json:"offered_hit_rate"`
	LoadImbalance  *float64          `json:"load_imbalance"`
	EngineTTFTMean float64           `json:"engine_ttft_mean_s,omitempty"`
	QueueMean      *float64          `json:"queue_mean_s"`
	Completed      int               `json:"completed"`
	Failed         int               `json:"failed"`
	Preemptions    int               `json:"preemptions"`
	Errors         map[string]int    `json:"errors,omitempty"`
	FirstErrors    map[string]string `json:"first_errors,omitempty"`
}

// MarshalJSON writes p's JSON fields, null where p.Completed,
// p.TPOTCount, p.Offered or p.LoadImbalance says they are undefined: a 0
// there read as a measured throughput or TTFT ranks a policy that
// completed nothing first (or divides by it). The hit rates of a policy
// that completed nothing are null too: no request was served, so no
// cache was read (the DES counted its refused prompts, and wrote 0).
func (p PolicyResult) MarshalJSON() ([]byte, error) {
	done := p.Completed > 0
	opt := func(ok bool, v float64) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	return json.Marshal(policyJSON{ThroughputRPS: opt(done, p.ThroughputRPS), TTFTMean: opt(done, p.TTFTMean),
		TTFTP50: opt(done, p.TTFTP50), TTFTP90: opt(done, p.TTFTP90), TTFTP99: opt(done, p.TTFTP99), E2EMean: opt(done, p.E2EMean),
		E2EP99: opt(done, p.E2EP99), TPOTMean: opt(done && p.TPOTCount > 0, p.TPOTMean), TPOTP99: opt(done && p.TPOTCount > 0, p.TPOTP99),
		PrefixHitRate: opt(p.hitDefined(), p.PrefixHitRate), OfferedHitRate: opt(done && p.Offered, p.OfferedHitRate), LoadImbalance: opt(p.imbalanceDefined(), p.LoadImbalance),
		EngineTTFTMean: p.EngineTTFTMean, QueueMean: opt(done && !p.QueueUnknown, p.QueueMean), Completed: p.Completed, Failed: p.Failed,
		Preemptions: p.Preemptions, Errors: p.Errors, FirstErrors: p.FirstErrors})
}

// SetRecordStats sets p's E2E p99 and TPOT mean and p99 from its run's
// finished requests, as the HTML report computes them (TPOTs).
func (p *PolicyResult) SetRecordStats(recs []Record) {
	tpot := TPOTs(recs)
	p.TPOTCount = len(tpot)
	p.TPOTMean, p.TPOTP99 = meanOf(tpot), Quantile(tpot, 0.99)
	p.E2EP99 = Quantile(sortedValues(recs, func(r Record) float64 { return r.E2E }), 0.99)
}

// TPOTs is the sorted times per output token of recs' requests that have
// one: two output tokens or more per sequence (a one-token answer has no
// time between tokens, and counted as 0 it pulled the mean down).
func TPOTs(recs []Record) []float64 {
	var v []float64
	for _, r := range recs {
		if r.OutputTokens/max(1, r.Sequences) >= 2 {
			v = append(v, r.TPOT())
		}
	}
	slices.Sort(v)
	return v
}

// FailureSummary is errs' kinds in order, each with its count and, when
// first has one, its first message: "http_400 4 (first: ...); timeout 1".
func FailureSummary(errs map[string]int, first map[string]string) string {
	parts := make([]string, 0, len(errs))
	for _, k := range slices.Sorted(maps.Keys(errs)) {
		p := fmt.Sprintf("%s %d", k, errs[k])
		if m := first[k]; m != "" {
			p += " (first: " + m + ")"
		}
		parts = append(parts, p)
	}
	return strings.Join(parts, "; ")
}

// hitDefined reports whether p.PrefixHitRate is a measurement.
func (p PolicyResult) hitDefined() bool { return p.Completed > 0 && !p.HitUnknown }

// imbalanceDefined reports whether p.LoadImbalance is a measurement.
func (p PolicyResult) imbalanceDefined() bool { return p.Completed > 0 && p.LoadImbalance > 0 }

// cell formats v as format does, or "n/a" when it is undefined (!ok).
func cell(ok bool, format string, v float64) string {
	if !ok {
		return "n/a"
	}
	return fmt.Sprintf(format, v)
}

// LearnedCosts is a learned cost model (scheduler/learn.Rates) and the
// samples it was fitted to (0: none, the rates are the learner's prior).
type LearnedCosts struct {
	PrefillRate, StepBase, DecodeSecPerToken float64
	Samples                                  int
}

// Report is the benchmark's output: `kvmesh bench --json` prints it.
type Report struct {
	// Run says what ran (nil: not recorded, left out of the JSON).
	Run           *RunInfo                `json:"run,omitempty"`
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
		done := p.Completed > 0
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%.1fs\t\n",
			name, cell(done, "%.2f", p.ThroughputRPS), cell(done, "%.3f", p.TTFTMean), cell(done, "%.3f", p.TTFTP50),
			cell(done, "%.3f", p.TTFTP90), cell(done, "%.3f", p.TTFTP99), cell(done && !p.QueueUnknown, "%.3f", p.QueueMean), cell(done, "%.3f", p.E2EMean),
			cell(p.hitDefined(), "%.3f", p.PrefixHitRate), cell(p.imbalanceDefined(), "%.2f", p.LoadImbalance), p.Completed, p.Failed, p.Preemptions, p.Wall.Seconds())
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if n := r.fewerThanEngines(r.Order); n != "" {
		fmt.Fprintf(w, "imbalance n/a (%s): fewer requests completed than there are engines\n", n)
	}
	for _, name := range r.Order {
		if p := r.Policies[name]; p.Learned.PrefillRate > 0 {
			p.writeLearned(w, name)
		}
	}
	if o := r.offered(r.Order); o != "" {
		fmt.Fprintln(w, o)
	}
	_, err := fmt.Fprintf(w, "oracle (infinite shared cache) hit rate: %.3f\n", r.OracleHitRate)
	return err
}

// writeLearned writes the policy's learned costs and how well it
// predicted output lengths: with nothing sampled the rates are the prior's
// and say so, and with no prediction scored the error is n/a (both read
// as learned, "within 0%", before).
func (p PolicyResult) writeLearned(w io.Writer, name string) {
	l := p.Learned
	rates := fmt.Sprintf("prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g", l.PrefillRate, l.StepBase, l.DecodeSecPerToken)
	if l.Samples == 0 {
		fmt.Fprintf(w, "%s learned nothing (no samples): its rates are the prior's, %s", name, rates)
	} else {
		fmt.Fprintf(w, "%s learned: %s", name, rates)
	}
	if p.OutputPredictions == 0 {
		fmt.Fprintln(w, "; output length predicted: n/a (no prediction scored)")
		return
	}
	fmt.Fprintf(w, "; output length predicted within %.0f%% (mean abs error)\n", 100*p.OutputPredError)
}

// fewerThanEngines lists names' policies whose requests completed but
// too few for an imbalance ("" when none).
func (r Report) fewerThanEngines(names []string) string {
	var few []string
	for _, name := range names {
		if p, ok := r.Policies[name]; ok && p.Completed > 0 && !p.imbalanceDefined() && !p.ImbalanceUnseen {
			few = append(few, name)
		}
	}
	return strings.Join(few, ", ")
}

// offered is the line that lists names' offered hit rates and the part
// each policy took ("" when none was measured: live runs, P/D).
func (r Report) offered(names []string) string {
	var b strings.Builder
	for _, name := range names {
		if p := r.Policies[name]; p.OfferedHitRate > 0 && p.Completed > 0 {
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

// Imbalance is max / mean of the requests each engine completed (1 =
// even). Engines that completed nothing count as zeros. It is defined only
// when at least as many requests completed as there are engines, and 0
// (undefined) otherwise: with fewer, some engines must stay idle whatever
// the router does, and max / mean measures the request count, not the
// balance (64 requests on 2,000 engines, at most 5 on one: 156). From one
// request per engine up, the most even split scores below 2.
func Imbalance(perEngine iter.Seq[int]) float64 {
	mx, sum, n := 0, 0, 0
	for c := range perEngine {
		mx, sum, n = max(mx, c), sum+c, n+1
	}
	if sum == 0 || sum < n {
		return 0
	}
	return float64(mx) / (float64(sum) / float64(n))
}
