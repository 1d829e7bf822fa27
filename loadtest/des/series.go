package des

import (
	"fmt"

	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// records keeps every finished request of a run for the HTML report's
// plots (report.Record); runStats owns one.
type records struct {
	recs    []report.Record
	fails   []report.Failure // refused when routed (runStats.fail)
	engines int
}

func (r *records) add(e int, res engine.Result) {
	r.recs = append(r.recs, report.Record{
		Start: res.Arrival.Seconds(), TTFT: res.TTFT.Seconds(), E2E: (res.Finished - res.Arrival).Seconds(),
		PromptTokens: res.PromptTokens, CachedTokens: res.CachedTokens + res.CPUCachedTokens,
		OutputTokens: res.OutputTokens, Engine: e,
	})
}

// run is the records with their engine ids (the DES names engine i
// "engine-i", as the live mesh does).
func (r *records) run() report.Run {
	ids := make([]string, r.engines)
	for i := range ids {
		ids[i] = fmt.Sprintf("engine-%d", i)
	}
	return report.Run{Records: r.recs, EngineIDs: ids, Failures: r.fails}
}
