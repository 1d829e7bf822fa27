package loadgen

import (
	"maps"
	"slices"

	"github.com/kvmesh/kvmesh/loadtest/report"
)

// Run returns the report's finished requests as report records for the
// HTML report, every time multiplied by scale (1: wall seconds; the live
// benchmark passes the engines' time scale to get engine seconds). Engines
// are indexed in ids' order, then any others by name. A request that
// streamed no output event (Result.NoOutput) has its E2E as its TTFT: its
// answer reached the client only at the end. Failed requests are the
// run's Failures.
func (r *Report) Run(scale float64, ids []string) report.Run {
	ids = slices.Clone(ids)
	for _, e := range slices.Sorted(maps.Keys(r.PerEngine)) {
		if !slices.Contains(ids, e) {
			ids = append(ids, e)
		}
	}
	run := report.Run{EngineIDs: ids, Records: make([]report.Record, 0, r.Completed)}
	for i := range r.Results {
		res := &r.Results[i]
		if res.ErrKind != "" {
			eng := slices.Index(run.EngineIDs, res.Engine)
			if eng < 0 && res.Engine != "" { // an engine that only failed
				run.EngineIDs = append(run.EngineIDs, res.Engine)
				eng = len(run.EngineIDs) - 1
			}
			run.Failures = append(run.Failures, report.Failure{Start: res.Sent.Seconds() * scale, E2E: res.E2E.Seconds() * scale,
				Engine: eng, Kind: res.ErrKind})
			continue
		}
		ttft := res.TTFT
		if res.NoOutput {
			ttft = res.E2E // no output event: nothing reached the client before the end
		}
		run.Records = append(run.Records, report.Record{
			Start: res.Sent.Seconds() * scale, TTFT: ttft.Seconds() * scale, E2E: res.E2E.Seconds() * scale,
			PromptTokens: res.PromptTokens, CachedTokens: res.CachedTokens, OutputTokens: res.OutputTokens, Sequences: res.Sequences,
			Engine: slices.Index(ids, res.Engine),
		})
	}
	return run
}
