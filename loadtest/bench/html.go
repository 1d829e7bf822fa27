package bench

import (
	"fmt"
	"io"
	"strings"

	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// writeHTML writes rep as a self-contained HTML report (report.WriteHTML)
// to o.HTML.
func (o Options) writeHTML(rep report.Report, reqs []workload.Request, cfg des.Config) error {
	notes := []string{
		o.workloadNote(reqs),
		fmt.Sprintf("%d engines, profile %s, %d GPU blocks of %d tokens, seed %d", o.Engines, cfg.Engine.Profile.Name,
			cfg.Engine.Defaults().GPUBlocks, cfg.Engine.Defaults().BlockSize, max(o.Seed, 1)),
		"policies: " + strings.Join(rep.Order, ", "),
	}
	title := "kvmesh bench (discrete-event simulation)"
	if o.Mode == "live" {
		title = "kvmesh bench --mode live"
		notes = append(notes, fmt.Sprintf("live: sim engines at %g× real time, %d ingress replicas; times in engine seconds",
			o.TimeScale, o.Ingresses))
	}
	return o.writeHTMLFile(rep, report.HTMLMeta{Title: title, Notes: notes})
}

// workloadNote is the report's line about the workload.
func (o Options) workloadNote(reqs []workload.Request) string {
	st := workload.Summarize(reqs)
	return fmt.Sprintf("workload %s: %d requests, %d prompt + %d output tokens, arrivals over %.1fs", o.Workload,
		st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds())
}

// WritePDHTML writes a P/D run (`kvmesh bench --roles ...`) as a
// self-contained HTML report to o.HTML: the plots of the aggregated
// benchmark's report over the requests' decoding engines, and each policy's
// goodput, attainment and disaggregated share (des.PDReport.AsReport).
func (o Options) WritePDHTML(rep des.PDReport, reqs []workload.Request, cfg des.PDConfig) error {
	r, pdNotes := rep.AsReport()
	notes := append([]string{
		o.workloadNote(reqs),
		fmt.Sprintf("%d engines, profile %s, %d GPU blocks of %d tokens, transfer %g Gbit/s, seed %d", cfg.Roles.Total(),
			cfg.Engine.Profile.Name, cfg.Engine.Defaults().GPUBlocks, cfg.Engine.Defaults().BlockSize, cfg.TransferGbps, max(o.Seed, 1)),
		"policies: " + strings.Join(r.Order, ", ") + " (aggregated: the same engines, all mixed)",
	}, pdNotes...)
	return o.writeHTMLFile(r, report.HTMLMeta{Title: "kvmesh bench --roles (prefill/decode, discrete-event simulation)", Notes: notes})
}

// WriteScaleHTML writes an autoscaling run (`kvmesh bench --autoscale
// ...`) as a self-contained HTML report to o.HTML: the runs' table and,
// window by window, their engines, the arrivals, attainment and TTFT p90
// (des.ScaleReport.Charts).
func (o Options) WriteScaleHTML(rep des.ScaleReport) error {
	names, header, rows, charts := rep.Charts()
	notes := []string{
		fmt.Sprintf("%s: %d requests; SLO TTFT %.3gs, TPOT %.3gs; engine start-up %.0fs", rep.Workload, rep.Requests,
			rep.SLOTTFT, rep.SLOTPOT, rep.StartupDelay),
		"GPU-hours count every engine from its request to its stop; \"÷ static\" is against the static run",
	}
	return fileFlag("--html", o.HTML, func(w io.Writer) error {
		return report.WriteChartsHTML(w, report.HTMLMeta{Title: "kvmesh bench --autoscale (discrete-event simulation)", Notes: notes},
			names, header, rows, charts)
	})
}

func (o Options) writeHTMLFile(rep report.Report, m report.HTMLMeta) error {
	return fileFlag("--html", o.HTML, func(w io.Writer) error { return report.WriteHTML(w, rep, m) })
}

// WriteRequestsCSV writes every finished request of rep (report.WriteCSV)
// to o.RequestsCSV.
func (o Options) WriteRequestsCSV(rep report.Report) error {
	return fileFlag("--requests-csv", o.RequestsCSV, func(w io.Writer) error { return report.WriteCSV(w, rep) })
}

// fileFlag writes the file a flag names (report.WriteFile); an error names
// the flag.
func fileFlag(flag, path string, write func(io.Writer) error) error {
	if err := report.WriteFile(path, write); err != nil {
		return fmt.Errorf("%s: %w", flag, err)
	}
	return nil
}
