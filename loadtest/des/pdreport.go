package des

import (
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// pdStats accumulates one P/D run's per-request results.
type pdStats struct {
	ttft, tpot, e2e []float64    // seconds; tpot only for requests with ≥ 2 output tokens
	good            int          // requests within both SLOs
	goodCandidates  [][2]float64 // (TTFT, TPOT) per finished request
	cached, prompt  int
	disaggregated   int
	held            int     // requests the router-side hold delayed (aggregated routing)
	heldSum         float64 // their seconds held
	xferBytes       float64
	recs            []report.Record // every finished request (the HTML report's plots)
	prefills        []int           // parallel to recs: the prefill leg's engine, -1 when aggregated
	first, last     time.Duration
	any             bool
	failed          int
	preemptions     int
	wall            time.Duration
}

func (r *pdStats) init(n int) {
	r.ttft, r.e2e, r.tpot = make([]float64, 0, n), make([]float64, 0, n), make([]float64, 0, n)
	r.recs, r.prefills = make([]report.Record, 0, n), make([]int, 0, n)
}

func (r *pdStats) dispatched(now time.Duration) {
	if !r.any || now < r.first {
		r.first, r.any = now, true
	}
}

// finished records a request decoded on engine e (prefilled on engine
// prefill, -1 when on e), sent at sent.
func (r *pdStats) finished(e, prefill int, sent time.Duration, res engine.Result, cached int) {
	ttft := (res.FirstToken - sent).Seconds()
	r.ttft = append(r.ttft, ttft)
	r.e2e = append(r.e2e, (res.Finished - sent).Seconds())
	tpot := 0.0
	if res.OutputTokens > 1 {
		tpot = (res.Finished - res.FirstToken).Seconds() / float64(res.OutputTokens-1)
		r.tpot = append(r.tpot, tpot)
	}
	r.goodCandidates = append(r.goodCandidates, [2]float64{ttft, tpot})
	r.cached += cached
	r.prompt += res.PromptTokens
	r.recs = append(r.recs, report.Record{Start: sent.Seconds(), TTFT: ttft, E2E: (res.Finished - sent).Seconds(),
		PromptTokens: res.PromptTokens, CachedTokens: cached, OutputTokens: res.OutputTokens, Engine: e})
	r.prefills = append(r.prefills, prefill)
	r.last = max(r.last, res.Finished)
}

// PDResult is one P/D policy's line of the report.
type PDResult struct {
	// GoodputRPS is requests/s whose TTFT ≤ SLO TTFT and mean time per
	// output token ≤ SLO TPOT, over the run's makespan.
	GoodputRPS    float64 `json:"goodput_rps"`
	SLOAttainment float64 `json:"slo_attainment"`
	ThroughputRPS float64 `json:"throughput_rps"`
	TTFTMean      float64 `json:"ttft_mean_s"`
	TTFTP50       float64 `json:"ttft_p50_s"`
	TTFTP90       float64 `json:"ttft_p90_s"`
	TTFTP99       float64 `json:"ttft_p99_s"`
	TPOTMean      float64 `json:"tpot_mean_s"`
	TPOTP50       float64 `json:"tpot_p50_s"`
	TPOTP90       float64 `json:"tpot_p90_s"`
	TPOTP99       float64 `json:"tpot_p99_s"`
	// TPOTCount is the requests the TPOTs are over: those of two output
	// tokens or more (JSON null TPOTs when none).
	TPOTCount int     `json:"-"`
	E2EMean   float64 `json:"e2e_mean_s"`
	E2EP99    float64 `json:"e2e_p99_s"`
	// Disaggregated is the fraction of requests served by a pair.
	Disaggregated float64 `json:"disaggregated"`
	// Held is the fraction of requests the router-side hold delayed
	// (aggregated routing only), HeldMean their mean wait there (counted
	// in their TTFT and E2E).
	Held     float64 `json:"held"`
	HeldMean float64 `json:"held_mean_s"`
	// PrefixHitRate is Σ prompt tokens not computed by the leg that
	// prefilled / Σ prompt tokens.
	PrefixHitRate float64 `json:"prefix_hit_rate"`
	// LoadImbalance is max ÷ mean completions over the engines that may
	// decode (0, JSON null: fewer completions than those engines).
	LoadImbalance float64       `json:"load_imbalance"`
	TransferGB    float64       `json:"transfer_gb"`
	Completed     int           `json:"completed"`
	Failed        int           `json:"failed"`
	Preemptions   int           `json:"preemptions"`
	Makespan      time.Duration `json:"-"`
	Wall          time.Duration `json:"-"`
}

// pdResultJSON is PDResult's JSON: its fields in its order, the numbers
// undefined when nothing completed as pointers (nil: null).
type pdResultJSON struct {
	GoodputRPS    float64  `json:"goodput_rps"`
	SLOAttainment float64  `json:"slo_attainment"`
	ThroughputRPS *float64 `json:"throughput_rps"`
	TTFTMean      *float64 `json:"ttft_mean_s"`
	TTFTP50       *float64 `json:"ttft_p50_s"`
	TTFTP90       *float64 `json:"ttft_p90_s"`
	TTFTP99       *float64 `json:"ttft_p99_s"`
	TPOTMean      *float64 `json:"tpot_mean_s"`
	TPOTP50       *float64 `json:"tpot_p50_s"`
	TPOTP90       *float64 `json:"tpot_p90_s"`
	TPOTP99       *float64 `json:"tpot_p99_s"`
	E2EMean       *float64 `json:"e2e_mean_s"`
	E2EP99        *float64 `json:"e2e_p99_s"`
	Disaggregated float64  `json:"disaggregated"`
	Held          float64  `json:"held"`
	HeldMean      float64  `json:"held_mean_s"`
	PrefixHitRate float64  `json:"prefix_hit_rate"`
	LoadImbalance *float64 `json:"load_imbalance"`
	TransferGB    float64  `json:"transfer_gb"`
	Completed     int      `json:"completed"`
	Failed        int      `json:"failed"`
	Preemptions   int      `json:"preemptions"`
}

// MarshalJSON writes p's JSON fields, null for the throughput and
// latencies when no request completed (as report.PolicyResult's): a 0
// there reads as the best TTFT; the TPOTs also when no request had two
// output tokens, the imbalance when too few completed. Goodput and SLO
// attainment stay numbers: none of the requests met the SLOs.
func (p PDResult) MarshalJSON() ([]byte, error) {
	done := p.Completed > 0
	opt := func(ok bool, v float64) *float64 {
		if !ok {
			return nil
		}
		return &v
	}
	tpot := done && p.TPOTCount > 0
	return json.Marshal(pdResultJSON{GoodputRPS: p.GoodputRPS, SLOAttainment: p.SLOAttainment,
		ThroughputRPS: opt(done, p.ThroughputRPS), TTFTMean: opt(done, p.TTFTMean), TTFTP50: opt(done, p.TTFTP50),
		TTFTP90: opt(done, p.TTFTP90), TTFTP99: opt(done, p.TTFTP99), TPOTMean: opt(tpot, p.TPOTMean), TPOTP50: opt(tpot, p.TPOTP50),
		TPOTP90: opt(tpot, p.TPOTP90), TPOTP99: opt(tpot, p.TPOTP99), E2EMean: opt(done, p.E2EMean), E2EP99: opt(done, p.E2EP99),
		Disaggregated: p.Disaggregated, Held: p.Held, HeldMean: p.HeldMean, PrefixHitRate: p.PrefixHitRate,
		LoadImbalance: opt(done && p.LoadImbalance > 0, p.LoadImbalance), TransferGB: p.TransferGB, Completed: p.Completed,
		Failed: p.Failed, Preemptions: p.Preemptions})
}

// PDReport is `kvmesh bench --mode des --roles ...`'s output.
type PDReport struct {
	// Run says what ran (nil: not recorded, left out of the JSON).
	Run      *report.RunInfo     `json:"run,omitempty"`
	Policies map[string]PDResult `json:"policies"`
	Roles    Roles               `json:"-"`
	SLOTTFT  float64             `json:"slo_ttft_s"`
	SLOTPOT  float64             `json:"slo_tpot_s"`
	Order    []string            `json:"-"`
	// Runs holds each policy's finished requests (Record.Engine: the
	// engine that decoded), for the HTML report.
	Runs map[string]report.Run `json:"-"`
}

// AsReport is r in the aggregated benchmark's terms, for report.WriteHTML
// (its table, TTFT and TPOT CDFs, throughput, queue and hit rate over time,
// requests per decoding engine) and report.WriteCSV, and one note line per
// policy with what that table has no column for: goodput under the SLOs,
// attainment, the share disaggregated and held, the KV transferred.
func (r PDReport) AsReport() (report.Report, []string) {
	rep := report.Report{Policies: make(map[string]report.PolicyResult, len(r.Policies)), Order: r.Order, Runs: r.Runs}
	notes := []string{fmt.Sprintf("roles %v; goodput: requests/s with TTFT ≤ %.3gs and TPOT ≤ %.3gs", r.Roles, r.SLOTTFT, r.SLOTPOT)}
	for _, name := range r.Order {
		p, ok := r.Policies[name]
		if !ok {
			continue
		}
		rep.Policies[name] = report.PolicyResult{ThroughputRPS: p.ThroughputRPS, TTFTMean: p.TTFTMean, TTFTP50: p.TTFTP50,
			TTFTP90: p.TTFTP90, TTFTP99: p.TTFTP99, E2EMean: p.E2EMean, E2EP99: p.E2EP99, TPOTMean: p.TPOTMean,
			TPOTP99: p.TPOTP99, TPOTCount: p.TPOTCount, PrefixHitRate: p.PrefixHitRate, LoadImbalance: p.LoadImbalance,
			Completed: p.Completed, Failed: p.Failed, Preemptions: p.Preemptions, Makespan: p.Makespan, Wall: p.Wall}
		notes = append(notes, fmt.Sprintf("%s: goodput %.2f req/s, SLO met %.1f %%, disaggregated %.0f %%, held %.0f %%, KV transferred %.1f GB",
			name, p.GoodputRPS, 100*p.SLOAttainment, 100*p.Disaggregated, 100*p.Held, p.TransferGB))
	}
	return rep, notes
}

// records is the finished requests with the engines' names, and the max ÷
// mean completions over the engines that may decode (0, undefined, with
// fewer completions than those engines: report.Imbalance).
func (s *pdSim) records() (report.Run, float64) {
	ids := make([]string, len(s.view))
	per := make([]int, len(s.view))
	for _, rec := range s.out.recs {
		per[rec.Engine]++
	}
	var sum, top, n int
	for e, v := range s.view {
		ids[e] = v.ID
		if v.Role != scheduler.RolePrefill {
			sum, top, n = sum+per[e], max(top, per[e]), n+1
		}
	}
	imb := 0.0
	if sum > 0 && sum >= n { // report.Imbalance: undefined with fewer requests than engines
		imb = float64(top) * float64(n) / float64(sum)
	}
	return report.Run{Records: s.out.recs, EngineIDs: ids, Prefill: s.out.prefills}, imb
}

func (r *pdStats) result(cfg *PDConfig) PDResult {
	p := PDResult{Completed: len(r.ttft), Failed: r.failed, Preemptions: r.preemptions, Wall: r.wall, TransferGB: r.xferBytes / 1e9}
	if len(r.ttft) == 0 {
		return p
	}
	for _, g := range r.goodCandidates {
		if meetsSLO(g, cfg.SLOTTFT.Seconds(), cfg.SLOTPOT.Seconds()) {
			r.good++
		}
	}
	p.Makespan = r.last - r.first
	if p.Makespan > 0 {
		p.ThroughputRPS = float64(len(r.ttft)) / p.Makespan.Seconds()
		p.GoodputRPS = float64(r.good) / p.Makespan.Seconds()
	}
	p.SLOAttainment = float64(r.good) / float64(len(r.ttft)+r.failed)
	slices.Sort(r.ttft)
	slices.Sort(r.tpot)
	p.TTFTMean, p.TTFTP50, p.TTFTP90, p.TTFTP99 = mean(r.ttft), report.Quantile(r.ttft, 0.5), report.Quantile(r.ttft, 0.9), report.Quantile(r.ttft, 0.99)
	if len(r.tpot) > 0 {
		p.TPOTMean, p.TPOTP50, p.TPOTP90, p.TPOTP99 = mean(r.tpot), report.Quantile(r.tpot, 0.5), report.Quantile(r.tpot, 0.9), report.Quantile(r.tpot, 0.99)
	}
	p.E2EMean = mean(r.e2e)
	e2e := slices.Clone(r.e2e) // sorted apart: the mean is summed in finish order, as before
	slices.Sort(e2e)
	p.E2EP99 = report.Quantile(e2e, 0.99)
	p.TPOTCount = len(r.tpot)
	p.Disaggregated = float64(r.disaggregated) / float64(len(r.ttft)+r.failed)
	p.Held = float64(r.held) / float64(len(r.ttft)+r.failed)
	if r.held > 0 {
		p.HeldMean = r.heldSum / float64(r.held)
	}
	if r.prompt > 0 {
		p.PrefixHitRate = float64(r.cached) / float64(r.prompt)
	}
	return p
}

// meetsSLO reports whether a request's (TTFT, TPOT), seconds, meet the
// SLOs. A negative latency is a broken measurement, never a met SLO (a
// transfer time that overflowed made TTFTs of −9.2e9 s count as met).
func meetsSLO(g [2]float64, ttft, tpot float64) bool {
	return g[0] >= 0 && g[1] >= 0 && g[0] <= ttft && g[1] <= tpot
}

// WriteTable writes the report as an aligned text table.
func (r PDReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "roles %v; SLO TTFT %.3gs, TPOT %.3gs\n", r.Roles, r.SLOTTFT, r.SLOTPOT)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "policy\tgoodput rps\tSLO met\tthroughput rps\tTTFT p50 s\tp90 s\tp99 s\tTPOT p50 ms\tp90 ms\tp99 ms\tdisagg\theld\thit rate\txfer GB\tdone\tfailed\tpreempt\twall\t")
	for _, name := range r.Order {
		p, ok := r.Policies[name]
		if !ok {
			continue
		}
		cell := func(format string, v float64) string { // n/a when nothing completed
			if p.Completed == 0 {
				return "n/a"
			}
			return fmt.Sprintf(format, v)
		}
		fmt.Fprintf(tw, "%s\t%.2f\t%.1f%%\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%.0f%%\t%.0f%%\t%.3f\t%.1f\t%d\t%d\t%d\t%.1fs\t\n",
			name, p.GoodputRPS, 100*p.SLOAttainment, cell("%.2f", p.ThroughputRPS), cell("%.3f", p.TTFTP50), cell("%.3f", p.TTFTP90),
			cell("%.3f", p.TTFTP99), cell("%.1f", 1e3*p.TPOTP50), cell("%.1f", 1e3*p.TPOTP90), cell("%.1f", 1e3*p.TPOTP99),
			100*p.Disaggregated, 100*p.Held, p.PrefixHitRate, p.TransferGB, p.Completed, p.Failed, p.Preemptions, p.Wall.Seconds())
	}
	return tw.Flush()
}
