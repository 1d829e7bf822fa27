package report

import (
	"encoding/csv"
	"fmt"
	"io"
	"strconv"
)

// WriteCSV writes every finished request of r's runs, one row each, policy
// by policy in r's order, for analysis outside kvmesh: policy, the engine
// that decoded it, the engine that ran its prefill leg (P/D runs; empty when
// the same engine did), start, TTFT and E2E in seconds from the run's start
// (engine time), TPOT in seconds (empty for a one-token answer), prompt,
// cached prompt and output tokens, and error: empty for a completed request.
// Then each failed request (Run.Failures), with its error kind in error,
// its E2E the time to the failure, and no TTFT, TPOT or tokens; its engine
// when known (a kvmesh ingress's header on an HTTP error).
func WriteCSV(w io.Writer, r Report) error {
	cw := csv.NewWriter(w)
	cw.Write([]string{"policy", "engine", "prefill_engine", "start_s", "ttft_s", "e2e_s", "tpot_s",
		"prompt_tokens", "cached_tokens", "output_tokens", "error"})
	f := func(v float64) string { return strconv.FormatFloat(v, 'g', 9, 64) }
	for _, p := range r.policies() {
		run := r.Runs[p]
		name := func(e int) string {
			if e >= 0 && e < len(run.EngineIDs) {
				return run.EngineIDs[e]
			}
			return ""
		}
		for i, rec := range run.Records {
			pre, tpot := "", ""
			if run.Prefill != nil && run.Prefill[i] >= 0 {
				pre = name(run.Prefill[i])
			}
			if rec.OutputTokens > 1 {
				tpot = f(rec.TPOT())
			}
			cw.Write([]string{p, name(rec.Engine), pre, f(rec.Start), f(rec.TTFT), f(rec.E2E), tpot,
				strconv.Itoa(rec.PromptTokens), strconv.Itoa(rec.CachedTokens), strconv.Itoa(rec.OutputTokens), ""})
		}
		for _, fl := range run.Failures {
			cw.Write([]string{p, name(fl.Engine), "", f(fl.Start), "", f(fl.E2E), "", "", "", "", fl.Kind})
		}
	}
	cw.Flush()
	if err := cw.Error(); err != nil {
		return fmt.Errorf("requests csv: %w", err)
	}
	return nil
}
