package bench

import (
	"errors"
	"fmt"
	"strings"

	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// RunInfo is the JSON report's "run" header for o's run of the policies
// names on cfg (o.Prepare's) with reqs: an aggregated run in o's mode.
// P/D and autoscaling runs set Kind, Roles and the transfer after.
func (o *Options) RunInfo(cfg des.Config, reqs []workload.Request, names []string) *report.RunInfo {
	c := cfg
	c.Defaults()
	e := c.Engine
	ri := &report.RunInfo{Mode: o.Mode, Kind: "aggregated", Engines: o.Engines, Profile: e.Profile.Name,
		BlockSize: e.BlockSize, GPUBlocks: e.GPUBlocks, CPUBlocks: e.CPUBlocks, MaxRunning: e.MaxRunning,
		MaxBatchTokens: e.MaxBatchTokens, Seed: c.Seed, Policies: append([]string{}, names...), Concurrency: o.Concurrency,
		Workload: o.workloadInfo(reqs)}
	if o.ProfileFile != "" {
		ri.ProfileFile = report.Ptr(o.ProfileFile)
	}
	if o.ConfigPath != "" {
		ri.Config = report.Ptr(o.ConfigPath)
	}
	if o.Mode == "live" {
		ri.TimeScale, ri.Ingresses = report.Ptr(o.TimeScale), report.Ptr(o.Ingresses)
	} else {
		ri.EventDelay, ri.SnapshotInterval = report.Ptr(c.EventDelay.Seconds()), report.Ptr(c.SnapshotInterval.Seconds())
	}
	return ri
}

// workloadInfo is the run header's workload: the options its kind reads
// (the others null) and what reqs came to.
func (o *Options) workloadInfo(reqs []workload.Request) report.Workload {
	w := WorkloadSummary(o.Workload, reqs)
	switch o.Workload {
	case "shared-prefix":
		w.Groups, w.Prompts, w.Shared, w.Question = report.Ptr(o.Groups), report.Ptr(o.Prompts), report.Ptr(o.Shared), report.Ptr(o.Question)
		w.Output, w.Rate = report.Ptr(o.Output), report.Ptr(o.Rate)
		return w
	case "trace", "bailian":
		w.Output = report.Ptr(o.Output) // for rows without output_length
	}
	if benchTraceKinds[o.Workload] {
		w.Trace = report.Ptr(o.Trace)
	}
	w.RateScale, w.Limit = report.Ptr(o.RateScale), report.Ptr(o.Limit)
	return w
}

// WorkloadSummary is the run header's workload of kind, with what reqs
// came to and every option null.
func WorkloadSummary(kind string, reqs []workload.Request) report.Workload {
	st := workload.Summarize(reqs)
	return report.Workload{Kind: kind, Requests: st.Requests, PromptTokens: st.PromptTokens, OutputTokens: st.OutputTokens,
		Arrivals: st.Duration.Seconds(), ZeroOutputRows: st.ZeroOutput}
}

// ErrNoneCompleted is returned, after the report, when some policy
// completed no request: its numbers are n/a in the report and the command
// exits non-zero, in every kind of run (the DES exited 0 with every
// request failed, live mode ended at the first such policy with no report).
var ErrNoneCompleted = errors.New("no request succeeded")

// Outcome is a policy's (or autoscaler's) request counts, for
// NoneCompleted.
type Outcome struct {
	Name              string
	Completed, Failed int
}

// NoneCompleted is ErrNoneCompleted naming the outcomes that completed
// nothing, or nil.
func NoneCompleted(outs []Outcome) error {
	var none []string
	for _, o := range outs {
		if o.Completed == 0 {
			none = append(none, fmt.Sprintf("%s (%d failed)", o.Name, o.Failed))
		}
	}
	if len(none) == 0 {
		return nil
	}
	return fmt.Errorf("%w for %s: the report above shows n/a", ErrNoneCompleted, strings.Join(none, ", "))
}

// outcomes lists rep's policies' counts, in its order.
func outcomes(rep report.Report) []Outcome {
	var outs []Outcome
	for _, p := range rep.Order {
		if r, ok := rep.Policies[p]; ok {
			outs = append(outs, Outcome{p, r.Completed, r.Failed})
		}
	}
	return outs
}
