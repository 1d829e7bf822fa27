package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/demo"
	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// Live mode (--mode live) runs the workload through the real processes
// instead of the discrete-event simulation: `kvmesh sim` engines running
// TimeScale× faster than real time, each with its sidecar, an embedded NATS
// server and Ingresses ingress replicas with the policy under test — the
// demo's wiring (loadtest/demo), not a second one — and the Go load
// generator replaying the workload's arrivals TimeScale× faster. Every time
// in the report is converted back to engine time (× TimeScale), so it
// reads like the DES report of the same options.
//
// What differs from the DES on purpose: KV events and load reach the
// router through the real sidecars, NATS and gossip, whose delays are
// wall-clock and so TimeScale× longer in engine time; HTTP and routing
// overheads count in TTFT the same way. A smaller TimeScale shrinks both.
const (
	maxLiveEngines = 32
	maxTimeScale   = 1000
)

// DefaultTimeScale runs live engines 10× faster than real time.
const DefaultTimeScale = 10

// checkLive checks the options only live mode reads.
func (o *Options) checkLive(bad func(string, ...any)) {
	if o.Mode != "live" {
		if o.NoStream {
			bad("--no-stream: live mode only (the DES's router sees every first token)")
		}
		return
	}
	if o.Engines > maxLiveEngines {
		bad("--engines %d: live mode runs at most %d engines", o.Engines, maxLiveEngines)
	}
	if !(o.TimeScale > 0) || o.TimeScale > maxTimeScale {
		bad("--time-scale %v: want (0, %d]", o.TimeScale, maxTimeScale)
	}
	if o.Ingresses < 1 || o.Ingresses > 16 {
		bad("--ingresses %d: want 1..16", o.Ingresses)
	}
	if err := demo.CheckPortBase(o.PortBase, demo.MeshPorts(o.Engines, o.Ingresses),
		fmt.Sprintf("NATS, %d engines with their sidecars and %d ingresses", o.Engines, o.Ingresses)); err != nil {
		bad("--port-base: %v", err)
	}
	if o.EventDelay != 0 {
		bad("--event-delay: live mode's KV events take the time they really take")
	}
	if o.ConfigPath != "" {
		bad("--config: live mode's ingresses run each policy with its defaults (not yet with a SchedulerConfig)")
	}
}

// runLive runs reqs through a live mesh once per policy, resetting the
// engines' prefix caches between policies, and reports in engine time.
func runLive(ctx context.Context, o Options, cfg des.Config, reqs []workload.Request, names []string) (report.Report, error) {
	rep := report.Report{Policies: make(map[string]report.PolicyResult, len(names)), Order: names,
		Runs: make(map[string]report.Run, len(names)), OracleHitRate: workload.OracleHitRate(reqs, cfg.Engine.BlockSize)}
	cl, err := demo.StartCluster(ctx, o.clusterConfig(cfg))
	if err != nil {
		return rep, fmt.Errorf("live: %w", err)
	}
	runErr := func() error {
		for i, p := range names {
			if i > 0 {
				if err := cl.ResetCaches(ctx); err != nil {
					return err
				}
			}
			if err := cl.StartIngresses(ctx, p, i); err != nil {
				return err
			}
			res, run, err := o.liveOne(ctx, cl, p, reqs)
			rep.Policies[p], rep.Runs[p] = res, run
			if err := errors.Join(err, cl.StopIngresses()); err != nil {
				return err
			}
		}
		return nil
	}()
	if err := errors.Join(runErr, cl.Close()); err != nil {
		return rep, fmt.Errorf("live: %w", err)
	}
	return rep, nil
}

// clusterConfig is the live mesh for o: the DES's engines, filled with
// the engine's own defaults here because the demo's differ (2,048 GPU
// blocks, so a shorter max model length: long trace prompts would fail).
func (o Options) clusterConfig(cfg des.Config) demo.Config {
	dc := demo.DefaultConfig()
	dc.Engines, dc.Ingresses, dc.Engine, dc.TimeScale = o.Engines, o.Ingresses, cfg.Engine.Defaults(), o.TimeScale
	dc.StartTimeout = time.Minute
	dc.PortBase = o.PortBase
	dc.SpeculativeTTL = cfg.SpeculativeTTL
	return dc
}

// liveOne sends reqs through the running ingresses with arrivals
// TimeScale× sooner and converts the client's measurements to engine time.
func (o Options) liveOne(ctx context.Context, cl *demo.Cluster, policy string, reqs []workload.Request) (report.PolicyResult, report.Run, error) {
	s := o.TimeScale
	scaled := make([]workload.Request, len(reqs))
	for i, r := range reqs {
		r.Arrival = time.Duration(float64(r.Arrival) / s)
		r.Think = time.Duration(float64(r.Think) / s)
		scaled[i] = r
	}
	lc := loadgen.DefaultConfig()
	lc.URLs = cl.IngressURLs()
	lc.Model = demo.DefaultConfig().Model
	lc.Concurrency = o.Concurrency
	if lc.Concurrency == 0 { // unlimited, as in the DES
		lc.Concurrency = min(max(len(reqs), 1), 100_000)
	}
	lc.Seed = max(o.Seed, 1)
	// No session header: the ingress would move a session's previous
	// engine to the front for every policy (its session affinity), making
	// random and round-robin sticky, and the DES models no affinity. Both
	// modes run the policy alone.
	lc.SessionHeader = ""
	lc.Timeout = 10 * time.Minute
	lc.StrictSSE = true // kvmesh's own ingresses: a framing regression fails the run
	lc.NoStream = o.NoStream
	lc.Progress = o.liveProgress(policy)
	client := &http.Client{Timeout: 10 * time.Second}
	defer client.CloseIdleConnections()
	before, serr := scrapeEngines(ctx, client, cl.EngineURLs())
	start := time.Now()
	lr, err := loadgen.Run(ctx, lc, scaled)
	if lr == nil {
		return report.PolicyResult{}, report.Run{}, fmt.Errorf("%s: %w", policy, err)
	}
	ids := cl.EngineIDs()
	lr.CountEngines(ids)
	res := lr.PolicyResult()
	res.ThroughputRPS /= s
	res.TTFTMean, res.TTFTP50, res.TTFTP90, res.TTFTP99 = res.TTFTMean*s, res.TTFTP50*s, res.TTFTP90*s, res.TTFTP99*s
	res.E2EMean *= s
	res.Makespan = time.Duration(float64(res.Makespan) * s)
	res.Wall = time.Since(start)
	after, aerr := scrapeEngines(ctx, client, cl.EngineURLs())
	if serr = errors.Join(serr, aerr); serr == nil {
		res.EngineTTFTMean, res.QueueMean = after.means(before)
		res.QueueUnknown = false // the engines' own histograms
		res.Preemptions = int(after.preemptions - before.preemptions)
	}
	err = errors.Join(err, serr)
	if lr.Failed > 0 {
		// Failures are part of the result, as in the DES (its "failed"
		// column): the other requests' numbers and the other policies
		// still count, even when none of this policy's succeeded (its
		// numbers are then n/a, and Run fails at the end: NoneCompleted).
		// The reason goes under the table.
		res.FailureNote = fmt.Sprintf("%d of %d requests failed: %s", lr.Failed, lr.Sent, lr.FailureSummary())
	}
	if err != nil {
		err = fmt.Errorf("%s: %w", policy, err)
	}
	run := lr.Run(s, ids)
	res.SetRecordStats(run.Records)
	return res, run, err
}

// liveProgress is the load generator's progress line on o.Progress (nil:
// none). Its time and rate are the client's wall clock, where the table's
// are engine time (TimeScale× longer), so the line says which (a 600 ms,
// 25 req/s line beside a 2.7 req/s row read as a contradiction).
func (o Options) liveProgress(policy string) func(loadgen.Progress) {
	if o.Progress == nil {
		return nil
	}
	return loadgen.ProgressLine(o.Progress, fmt.Sprintf("%s (wall clock; engine time ×%g) ", policy, o.TimeScale))
}

// liveNote describes a live run for the table's header.
func (o Options) liveNote(w io.Writer) {
	fmt.Fprintf(w, "live: %d sim engines at %g× real time with sidecars, embedded NATS, %d ingress replica(s); times in engine seconds\n",
		o.Engines, o.TimeScale, o.Ingresses)
	if o.PortBase != 0 {
		fmt.Fprintf(w, "live: listening on 127.0.0.1 ports %d..%d (--port-base)\n", o.PortBase, o.PortBase+demo.MeshPorts(o.Engines, o.Ingresses)-1)
	}
}

// liveOverheads writes, per policy, the engines' own mean TTFT and queue
// time beside the client's TTFT. The difference holds the wait for the
// step in progress when a request arrived (the simulator stamps arrivals at
// the next step's start and so leaves it out; the DES counts it as queue)
// and the mesh's overhead (HTTP, routing, the host's scheduling delays),
// which is wall time multiplied by the time scale like every client time.
func (o Options) liveOverheads(w io.Writer, rep report.Report) error {
	for _, p := range rep.Order {
		r, ok := rep.Policies[p]
		if !ok || r.EngineTTFTMean == 0 {
			continue
		}
		if _, err := fmt.Fprintf(w, "%s: engine-reported TTFT mean %.3f s, queue %.3f s; client − engine %.3f s\n",
			p, r.EngineTTFTMean, r.QueueMean, r.TTFTMean-r.EngineTTFTMean); err != nil {
			return err
		}
	}
	return nil
}
