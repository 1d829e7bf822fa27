package des

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/scheduler"
)

// ScaleWindow is one report window of an autoscaling run.
type ScaleWindow struct {
	T            float64 `json:"t_s"` // the window's end
	Prefill      int     `json:"prefill"`
	Decode       int     `json:"decode"`
	PrefillReady int     `json:"prefill_ready"`
	DecodeReady  int     `json:"decode_ready"`
	ArrivalRPS   float64 `json:"arrival_rps"`
	Finished     int     `json:"finished"`
	// Attainment is the share of requests finished in the window within
	// both SLOs (1 when none finished).
	Attainment float64 `json:"attainment"`
	// TTFTP90 is over the Finished requests, TPOTP90 over the TPOTCount
	// of them with two output tokens or more (JSON null when none).
	TTFTP90   float64 `json:"ttft_p90_s"`
	TPOTP90   float64 `json:"tpot_p90_s"`
	TPOTCount int     `json:"-"`
}

// scaleWindowJSON is ScaleWindow's JSON: its fields, the latencies of a
// window that finished none as pointers (nil: null) over the embedded
// ones (a field added to ScaleWindow is in the JSON without a copy here).
type scaleWindowJSON struct {
	scaleWindowFields
	TTFTP90 *float64 `json:"ttft_p90_s"`
	TPOTP90 *float64 `json:"tpot_p90_s"`
}

// scaleWindowFields is ScaleWindow without its methods (so without
// MarshalJSON).
type scaleWindowFields ScaleWindow

// MarshalJSON writes w's JSON fields, null for the TTFT p90 when no
// request finished in the window and for the TPOT p90 when none of them
// had two output tokens (a 0 there reads as the best latency).
func (w ScaleWindow) MarshalJSON() ([]byte, error) {
	return json.Marshal(scaleWindowJSON{scaleWindowFields: scaleWindowFields(w),
		TTFTP90: optFloat(w.Finished > 0, w.TTFTP90), TPOTP90: optFloat(w.Finished > 0 && w.TPOTCount > 0, w.TPOTP90)})
}

// optFloat is &v, or nil (JSON null) when v is undefined (!ok).
func optFloat(ok bool, v float64) *float64 {
	if !ok {
		return nil
	}
	return &v
}

// ScaleResult is one autoscaler's run.
type ScaleResult struct {
	Autoscaler string `json:"autoscaler"`
	// Setting describes the autoscaler's configuration (its target knob).
	Setting string `json:"setting"`
	// Attainment is the share of all requests within both SLOs (failed
	// requests count as missed).
	Attainment float64 `json:"attainment"`
	Completed  int     `json:"completed"`
	Failed     int     `json:"failed"`
	// The latencies are over the Completed requests, the TPOTs over the
	// TPOTCount of them with two output tokens or more (JSON null, table
	// n/a, when none: as PDResult's).
	TTFTP90   float64 `json:"ttft_p90_s"`
	TTFTP99   float64 `json:"ttft_p99_s"`
	TPOTP90   float64 `json:"tpot_p90_s"`
	TPOTP99   float64 `json:"tpot_p99_s"`
	TPOTCount int     `json:"-"`
	// GPUHours: every engine from its request to its stop (or the run's
	// end), per role and in total.
	GPUHours        float64 `json:"gpu_hours"`
	PrefillGPUHours float64 `json:"prefill_gpu_hours"`
	DecodeGPUHours  float64 `json:"decode_gpu_hours"`
	PeakPrefill     int     `json:"peak_prefill"`
	PeakDecode      int     `json:"peak_decode"`
	EnginesStarted  int     `json:"engines_started"`
	ScaleDecisions  int     `json:"scale_decisions"`
	Disaggregated   float64 `json:"disaggregated"`
	// Span is the run's end (the last request's finish), seconds.
	Span    float64       `json:"span_s"`
	Windows []ScaleWindow `json:"windows"`
	Wall    time.Duration `json:"-"`
}

// scaleResultJSON is ScaleResult's JSON: its fields, the latencies
// undefined when nothing completed as pointers (nil: null) over the
// embedded ones (a field added to ScaleResult is in the JSON without a
// copy here).
type scaleResultJSON struct {
	scaleResultFields
	TTFTP90 *float64 `json:"ttft_p90_s"`
	TTFTP99 *float64 `json:"ttft_p99_s"`
	TPOTP90 *float64 `json:"tpot_p90_s"`
	TPOTP99 *float64 `json:"tpot_p99_s"`
}

// scaleResultFields is ScaleResult without its methods.
type scaleResultFields ScaleResult

// MarshalJSON writes r's JSON fields, null for the latencies when no
// request completed and for the TPOTs also when none had two output
// tokens (as PDResult's: a 0 there ranked a run that completed nothing
// best). Attainment stays a number: none of the requests met the SLOs.
func (r ScaleResult) MarshalJSON() ([]byte, error) {
	done, tpot := r.Completed > 0, r.Completed > 0 && r.TPOTCount > 0
	return json.Marshal(scaleResultJSON{scaleResultFields: scaleResultFields(r),
		TTFTP90: optFloat(done, r.TTFTP90), TTFTP99: optFloat(done, r.TTFTP99),
		TPOTP90: optFloat(tpot, r.TPOTP90), TPOTP99: optFloat(tpot, r.TPOTP99)})
}

// latencyCells are r's table cells for its TTFT p99 (seconds) and TPOT
// p99 (milliseconds): n/a when undefined, as in the JSON.
func (r ScaleResult) latencyCells() (ttft, tpot string) {
	ttft, tpot = "n/a", "n/a"
	if r.Completed > 0 {
		ttft = fmt.Sprintf("%.2f", r.TTFTP99)
		if r.TPOTCount > 0 {
			tpot = fmt.Sprintf("%.1f", 1e3*r.TPOTP99)
		}
	}
	return ttft, tpot
}

// scaleReport accumulates the current report window.
type scaleReport struct {
	width      time.Duration
	edge       time.Duration
	arrivals   int
	ttft, tpot []float64
	good, fin  int
	windows    []ScaleWindow
	peakP      int
	peakD      int
	lastP      int
	lastD      int
	decisions  int
}

func (r *scaleReport) init(cfg *ScaleConfig) {
	r.width, r.edge = cfg.ReportWindow, cfg.ReportWindow
	r.lastP, r.lastD = cfg.Roles.Prefill, cfg.Roles.Decode
	r.peakP, r.peakD = r.lastP, r.lastD
}

func (r *scaleReport) absorb(b *bucket) {
	r.arrivals += b.arrivals
	r.ttft = append(r.ttft, b.ttft...)
	r.tpot = append(r.tpot, b.tpot...)
	r.good += b.good
	r.fin += b.finished
}

// tick records the sync's replicas and closes the window at its edge.
func (r *scaleReport) tick(s *scaleSim, now time.Duration) {
	p, _ := s.replicas(scheduler.RolePrefill)
	d, _ := s.replicas(scheduler.RoleDecode)
	r.peakP, r.peakD = max(r.peakP, p), max(r.peakD, d)
	if p != r.lastP || d != r.lastD {
		r.decisions++
	}
	r.lastP, r.lastD = p, d
	if now >= r.edge {
		r.flush(s, now)
		r.edge = now + r.width
	}
}

func (r *scaleReport) flush(s *scaleSim, now time.Duration) {
	if r.fin == 0 && r.arrivals == 0 && len(r.windows) > 0 && r.windows[len(r.windows)-1].T == now.Seconds() {
		return
	}
	w := ScaleWindow{T: now.Seconds(), Finished: r.fin, Attainment: 1}
	w.Prefill, w.PrefillReady = s.replicas(scheduler.RolePrefill)
	w.Decode, w.DecodeReady = s.replicas(scheduler.RoleDecode)
	w.ArrivalRPS = float64(r.arrivals) / r.width.Seconds()
	if r.fin > 0 {
		w.Attainment = float64(r.good) / float64(r.fin)
	}
	if len(r.ttft) > 0 {
		slices.Sort(r.ttft)
		w.TTFTP90 = report.Quantile(r.ttft, 0.9)
	}
	if len(r.tpot) > 0 {
		slices.Sort(r.tpot)
		w.TPOTP90, w.TPOTCount = report.Quantile(r.tpot, 0.9), len(r.tpot)
	}
	r.windows = append(r.windows, w)
	r.arrivals, r.ttft, r.tpot, r.good, r.fin = 0, r.ttft[:0], r.tpot[:0], 0, 0
}

func (s *scaleSim) result(end time.Duration) ScaleResult {
	pd := s.out.result(s.cfg)
	res := ScaleResult{Autoscaler: s.as.Name(), Setting: s.as.Setting(), Attainment: pd.SLOAttainment, Completed: pd.Completed,
		Failed: pd.Failed, TTFTP90: pd.TTFTP90, TTFTP99: pd.TTFTP99, TPOTP90: pd.TPOTP90, TPOTP99: pd.TPOTP99,
		TPOTCount: pd.TPOTCount, PeakPrefill: s.rep.peakP, PeakDecode: s.rep.peakD, EnginesStarted: len(s.insts) - s.cfg.Roles.Total(),
		ScaleDecisions: s.rep.decisions, Disaggregated: pd.Disaggregated, Span: end.Seconds(), Windows: s.rep.windows, Wall: s.out.wall}
	p, d := s.gpuSeconds(end)
	res.PrefillGPUHours, res.DecodeGPUHours, res.GPUHours = p/3600, d/3600, (p+d)/3600
	return res
}

// ScaleReport is `kvmesh bench --mode des --autoscale ...`'s output.
type ScaleReport struct {
	// Run says what ran (nil: not recorded, left out of the JSON).
	Run          *report.RunInfo `json:"run,omitempty"`
	Workload     string          `json:"workload"`
	Requests     int             `json:"requests"`
	SLOTTFT      float64         `json:"slo_ttft_s"`
	SLOTPOT      float64         `json:"slo_tpot_s"`
	StartupDelay float64         `json:"startup_delay_s"`
	Runs         []ScaleResult   `json:"runs"`
	// Static is the static deployment the others are compared with (the
	// run named "static"), when there is one.
	StaticGPUHours float64 `json:"static_gpu_hours,omitempty"`
}

// WriteTable writes one line per run.
func (r ScaleReport) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "%s: %d requests; SLO TTFT %.3gs, TPOT %.3gs; start-up delay %.0fs\n", r.Workload, r.Requests, r.SLOTTFT, r.SLOTPOT, r.StartupDelay)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "autoscaler\tsetting\tSLO met\tGPU-h\t÷ static\tprefill GPU-h\tdecode GPU-h\tpeak P/D\tstarted\tdecisions\tTTFT p99 s\tTPOT p99 ms\tfailed\twall\t")
	for _, x := range r.Runs {
		ratio := "-"
		if r.StaticGPUHours > 0 {
			ratio = fmt.Sprintf("%.2f", x.GPUHours/r.StaticGPUHours)
		}
		ttft, tpot := x.latencyCells()
		fmt.Fprintf(tw, "%s\t%s\t%.2f%%\t%.2f\t%s\t%.2f\t%.2f\t%d/%d\t%d\t%d\t%s\t%s\t%d\t%.1fs\t\n",
			x.Autoscaler, x.Setting, 100*x.Attainment, x.GPUHours, ratio, x.PrefillGPUHours, x.DecodeGPUHours,
			x.PeakPrefill, x.PeakDecode, x.EnginesStarted, x.ScaleDecisions, ttft, tpot, x.Failed, x.Wall.Seconds())
	}
	return tw.Flush()
}

// Charts is r for report.WriteChartsHTML: a name per run (its autoscaler
// and setting), the table's columns and rows, and over the report windows
// (x in minutes) the prefill and decode engines each run holds (requested,
// starting ones included), the arrival rate, each window's SLO attainment
// and TTFT p90.
func (r ScaleReport) Charts() (names, header []string, rows [][]string, charts []report.Chart) {
	header = []string{"run", "SLO met", "GPU-h", "÷ static", "prefill GPU-h", "decode GPU-h", "peak P/D", "started",
		"decisions", "TTFT p99 s", "TPOT p99 ms", "failed"}
	charts = []report.Chart{
		{ID: "prefill-engines", Title: "Prefill engines", XLabel: "time (min)", YLabel: "engines"},
		{ID: "decode-engines", Title: "Decode engines", XLabel: "time (min)", YLabel: "engines"},
		{ID: "arrivals", Title: "Arrivals", XLabel: "time (min)", YLabel: "requests / s"},
		{ID: "attainment", Title: "SLO attainment per window", XLabel: "time (min)", YLabel: "share within both SLOs"},
		{ID: "ttft-p90", Title: "TTFT p90 per window", XLabel: "time (min)", YLabel: "seconds"},
	}
	f := func(format string, a ...any) string { return fmt.Sprintf(format, a...) }
	for i, x := range r.Runs {
		name := x.Autoscaler
		if x.Setting != "" {
			name += " " + x.Setting
		}
		if slices.Contains(names, name) {
			name = f("%s (%d)", name, i+1)
		}
		names = append(names, name)
		ratio := "-"
		if r.StaticGPUHours > 0 {
			ratio = f("%.2f", x.GPUHours/r.StaticGPUHours)
		}
		ttftCell, tpotCell := x.latencyCells()
		rows = append(rows, []string{name, f("%.2f %%", 100*x.Attainment), f("%.2f", x.GPUHours), ratio,
			f("%.2f", x.PrefillGPUHours), f("%.2f", x.DecodeGPUHours), f("%d/%d", x.PeakPrefill, x.PeakDecode),
			f("%d", x.EnginesStarted), f("%d", x.ScaleDecisions), ttftCell, tpotCell, f("%d", x.Failed)})
		n := len(x.Windows)
		t, pre, dec, arr, att, ttft := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n),
			make([]float64, n), make([]float64, n)
		for j, w := range x.Windows {
			t[j], pre[j], dec[j], arr[j], ttft[j] = w.T/60, float64(w.Prefill), float64(w.Decode), w.ArrivalRPS, w.TTFTP90
			att[j] = w.Attainment
			if w.Finished == 0 {
				att[j], ttft[j] = math.NaN(), math.NaN() // nothing finished: no point
			}
		}
		for k, ys := range [][]float64{pre, dec, arr, att, ttft} {
			charts[k].Lines = append(charts[k].Lines, report.ChartLine{Name: name, X: t, Y: ys})
		}
	}
	return names, header, rows, charts
}
