package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/loadtest/bench"
	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// runBench compares routing policies in a discrete-event simulation: the
// real index and scheduler against simulated engines in virtual time
// (loadtest/bench).
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	opts := bench.DefaultOptions()
	fs := newFlagSet("bench", stderr)
	benchFlags(fs, &opts)
	pdf := pdBenchFlags(fs)
	before := map[string]bool{}
	fs.VisitAll(func(f *flag.Flag) { before[f.Name] = true })
	asf := autoscaleBenchFlags(fs)
	asOnly := map[string]bool{} // the flags only --autoscale runs read
	fs.VisitAll(func(f *flag.Flag) { asOnly[f.Name] = !before[f.Name] && f.Name != "autoscale" })
	quiet := fs.Bool("quiet", false, "no progress on stderr (des, --roles and --autoscale: a line per running policy every 10 s of wall time; live: the load generator's line); warnings still print")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if !*quiet {
		opts.Progress = stderr
	}
	opts.Stderr = stderr
	pols := opts.Policies
	if pdf.on() && !flagGiven(fs, "policies") {
		pols = des.PDPolicies
	}
	if err := benchFlagsRead(fs, opts.Mode, opts.Workload, pols, asf.on(), pdf.on(), asOnly); err != nil {
		return err
	}
	var err error
	if asf.on() {
		err = runBenchAutoscale(ctx, opts, pdf, asf, stdout)
	} else if pdf.on() {
		err = runBenchPD(ctx, fs, opts, pdf, stdout)
	} else {
		err = bench.Run(ctx, opts, stdout)
	}
	if errors.Is(err, bench.ErrUsage) {
		return fmt.Errorf("%w: %s", errUsage, strings.TrimPrefix(err.Error(), bench.ErrUsage.Error()+": "))
	}
	return err
}

// Kinds of `kvmesh bench` run, as benchFlagReaders names them.
const (
	runDES       = 1 << iota // --mode des
	runLive                  // --mode live
	runPD                    // --roles
	runAutoscale             // --autoscale
)

// benchFlagReaders is, for the flags not every kind of run reads, the
// kinds that do. A flag given to a run that does not read it is a usage
// error: silently ignored, it would make the run look like what it is not
// (`--workload chat --roles ...` ran the shared-prefix workload).
var benchFlagReaders = map[string]int{
	"time-scale":             runLive,
	"ingresses":              runLive,
	"port-base":              runLive,
	"no-stream":              runLive,
	"requests-csv":           runDES | runLive | runPD,
	"policies":               runDES | runLive | runPD,
	"engines":                runDES | runLive,
	"event-delay":            runDES,
	"snapshot-interval":      runDES | runPD | runAutoscale,
	"parallel":               runDES | runPD,
	"learn-shared":           runDES | runPD | runAutoscale,
	"learn-unpooled":         runDES, // P/D's learner is always unpooled (pd.LearnConfig)
	"learn-free-intercept":   runDES, // and fits its intercept freely
	"workload":               runDES | runLive | runPD,
	"trace":                  runDES | runLive | runPD,
	"trace-block-size":       runDES | runLive | runPD,
	"groups":                 runDES | runLive | runPD,
	"prompts":                runDES | runLive | runPD,
	"shared":                 runDES | runLive | runPD,
	"question":               runDES | runLive | runPD,
	"output":                 runDES | runLive | runPD,
	"rate":                   runDES | runLive | runPD,
	"rate-scale":             runDES | runLive | runPD,
	"limit":                  runDES | runLive | runPD,
	"roles":                  runPD | runAutoscale,
	"transfer-gbps":          runPD | runAutoscale,
	"transfer-setup":         runPD | runAutoscale,
	"slo-ttft":               runPD | runAutoscale,
	"slo-tpot":               runPD | runAutoscale,
	"llmd-non-cached-tokens": runPD | runAutoscale,
	"output-dist":            runPD | runAutoscale,
	"mixed-prefill":          runPD,
}

// benchWorkloadReads reports whether a --workload kind run reads the
// workload flag f: the shared-prefix generator's shape, the trace
// readers' file and block size, and the rate scale and limit of every
// workload but shared-prefix (`--trace FILE` without `--workload trace`
// ran the shared-prefix workload, the trace unread).
func benchWorkloadReads(kind, f string) bool {
	switch kind {
	case "shared-prefix", "trace", "bailian", "azure", "sharegpt", "chat", "tool-agent", "coding", "rag", "mix":
	default:
		return true // an unknown kind is refused after, by name
	}
	switch f {
	case "groups", "prompts", "shared", "question", "rate":
		return kind == "shared-prefix"
	case "output":
		return kind == "shared-prefix" || kind == "trace" || kind == "bailian"
	case "trace":
		return kind == "trace" || kind == "bailian" || kind == "azure" || kind == "sharegpt"
	case "trace-block-size":
		return kind == "trace" || kind == "bailian"
	case "rate-scale", "limit":
		return kind != "shared-prefix"
	}
	return true
}

// benchLearners are the policies that price with kvmesh's learner (the
// aggregated ones: loadtest/des sim.go; the P/D ones: pdsim.go); the
// --learn-* flags configure it, so a run of none of them does not read
// them.
var benchLearners = []string{"kvmesh", "kvmesh-always", "aggregated"}

// benchFlagsRead refuses, every one at once, the flags the run fs
// describes would not read: benchFlagReaders' outside their runs, asOnly's
// outside --autoscale runs, a workload's flags outside runs of that
// workload, and the learner's flags in runs whose policies (pols) do not
// learn.
func benchFlagsRead(fs *flag.FlagSet, mode, wl string, pols []string, autoscaling, pd bool, asOnly map[string]bool) error {
	kind, name := runDES, "--mode des"
	switch {
	case autoscaling:
		kind, name = runAutoscale, "--autoscale"
	case pd:
		kind, name = runPD, "--roles"
	case mode == "live":
		kind, name = runLive, "--mode live"
	}
	byKind := func(f string) bool {
		r := benchFlagReaders[f]
		if asOnly[f] {
			r = runAutoscale
		}
		return r == 0 || r&kind != 0
	}
	learns := slices.ContainsFunc(pols, func(p string) bool { return slices.Contains(benchLearners, strings.TrimSpace(p)) })
	errs := []error{refuseUnread(fs, name, byKind)}
	if kind != runAutoscale { // --autoscale runs kvmesh on its own workload
		errs = append(errs,
			refuseUnread(fs, "--workload "+wl, func(f string) bool { return !byKind(f) || benchWorkloadReads(wl, f) }),
			refuseUnread(fs, "--policies "+strings.Join(pols, ",")+" (no kvmesh learner)",
				func(f string) bool { return learns || !byKind(f) || !strings.HasPrefix(f, "learn-") }))
	}
	var probs []string
	for _, err := range errs {
		if err != nil {
			probs = append(probs, strings.TrimPrefix(err.Error(), errUsage.Error()+": "))
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	return nil
}

// benchFlags binds every `kvmesh bench` flag onto o.
func benchFlags(fs *flag.FlagSet, o *bench.Options) {
	fs.StringVar(&o.Mode, "mode", o.Mode, "benchmark mode (des: discrete-event simulation; live: sim engines, sidecars, NATS and ingresses at --time-scale)")
	fs.Float64Var(&o.TimeScale, "time-scale", o.TimeScale, "live: engines and arrivals run this many times faster than real time")
	fs.IntVar(&o.Ingresses, "ingresses", o.Ingresses, "live: ingress replicas (requests round-robin over them)")
	fs.IntVar(&o.PortBase, "port-base", o.PortBase, "live: listen on fixed 127.0.0.1 ports from N on, NATS at N, then 4 per engine (its HTTP API, KV events, KV replay, its sidecar's gossip), then 2 per ingress (HTTP, gossip): 1+4×engines+2×ingresses ports (0 = free ephemeral ports)")
	fs.BoolVar(&o.NoStream, "no-stream", false, "live: non-streamed requests (the client's TTFT is then its E2E)")
	fs.StringVar(&o.HTML, "html", o.HTML, "also write a self-contained HTML report (plots, table) to this file")
	fs.StringVar(&o.RequestsCSV, "requests-csv", o.RequestsCSV, "also write every finished request (policy, engines, start, TTFT, E2E, TPOT, prompt, cached and output tokens; failed ones with their error kind) to this CSV file")
	fs.IntVar(&o.Engines, "engines", o.Engines, "simulated engines (1..4000)")
	fs.Func("policies", "comma-separated policies (default "+strings.Join(o.Policies, ",")+")", func(s string) error {
		o.Policies = strings.Split(s, ",")
		return nil
	})
	fs.StringVar(&o.Profile, "profile", o.Profile, "engine timing profile: "+strings.Join(engine.ProfileNames(), ", "))
	fs.StringVar(&o.ProfileFile, "profile-file", o.ProfileFile, "engine timing profile from a YAML file (engine.ProfileFile documents the fields; overrides --profile)")
	fs.IntVar(&o.GPUBlocks, "gpu-blocks", o.GPUBlocks, fmt.Sprintf("GPU KV capacity per engine in blocks (0 = the engine's default, %d, whatever the profile)", engine.Config{}.Defaults().GPUBlocks))
	fs.IntVar(&o.CPUBlocks, "cpu-blocks", o.CPUBlocks, "CPU-tier KV capacity per engine in blocks (0 = no CPU tier)")
	fs.IntVar(&o.BlockSize, "block-size", o.BlockSize, "tokens per KV block: 1, 8, 16, 32, 64, 128 or 256, as vLLM's --block-size")
	fs.IntVar(&o.MaxRunning, "max-running", o.MaxRunning, "max sequences per batch (0 = the profile's vLLM default)")
	fs.IntVar(&o.MaxBatchTokens, "max-batch-tokens", o.MaxBatchTokens, "token budget per step (0 = the profile's vLLM default)")
	fs.Uint64Var(&o.Seed, "seed", o.Seed, "workload and scheduler seed (0 means the default, 1)")
	fs.StringVar(&o.Workload, "workload", o.Workload, "workload: shared-prefix, trace (Mooncake JSONL), bailian (Alibaba Bailian JSONL), azure (Azure CSV + synthetic prefixes), sharegpt (ShareGPT JSON conversations as sessions), chat, tool-agent, coding (per-user repository contexts with edits), rag (shuffled retrieved documents) or mix (long summaries beside short chat)")
	fs.IntVar(&o.Groups, "groups", o.Groups, "shared-prefix: groups")
	fs.IntVar(&o.Prompts, "prompts", o.Prompts, "shared-prefix: prompts per group")
	fs.IntVar(&o.Shared, "shared", o.Shared, "shared-prefix: shared prefix tokens")
	fs.IntVar(&o.Question, "question", o.Question, "shared-prefix: question tokens")
	fs.IntVar(&o.Output, "output", o.Output, "shared-prefix: output tokens; trace: for rows without output_length")
	fs.Float64Var(&o.Rate, "rate", o.Rate, "shared-prefix: request rate per second (0 = all at once)")
	fs.IntVar(&o.Concurrency, "concurrency", o.Concurrency, "client max requests in flight (0 = unlimited)")
	fs.StringVar(&o.Trace, "trace", o.Trace, "trace, bailian, azure: the trace file (Mooncake JSONL: aiperf's forms too, session_id + delay rows, absolute timestamps, rows in any order)")
	fs.IntVar(&o.TraceBlockTokens, "trace-block-size", o.TraceBlockTokens, "trace, bailian: tokens per hash_ids block (0 = the format's: 512, Bailian 16)")
	fs.Float64Var(&o.RateScale, "rate-scale", o.RateScale, "trace, azure, sharegpt, chat, tool-agent, coding, rag, mix: arrival rate multiplier (> 0)")
	fs.IntVar(&o.Limit, "limit", o.Limit, "trace, azure, sharegpt, chat, tool-agent, coding, rag, mix: use only the first N requests (0 = all)")
	fs.DurationVar(&o.EventDelay, "event-delay", o.EventDelay, "KV event propagation delay to the index")
	fs.DurationVar(&o.SpeculativeTTL, "speculative-ttl", index.DefaultSpeculativeTTL, "how long a routed request's keys count as cached on its engine before its KV events confirm them (the ingress's speculativeTTL, whose default this is)")
	fs.DurationVar(&o.SnapshotInterval, "snapshot-interval", o.SnapshotInterval, "engine load snapshot period (gossip staleness); negative = always fresh")
	fs.BoolVar(&o.LearnShared, "learn-shared", false, "des: kvmesh's learner prices every engine with the costs pooled over all of them (engines taken as replicas; no per-engine rates)")
	fs.BoolVar(&o.LearnUnpooled, "learn-unpooled", false, "des: kvmesh's learner starts each engine from its prior, not from the estimate pooled over every engine (an ablation)")
	fs.BoolVar(&o.LearnFreeIntercept, "learn-free-intercept", false, "des: kvmesh's learner fits the prefill line's intercept without its prior at the decode step's cost (an ablation)")
	fs.StringVar(&o.ConfigPath, "config", o.ConfigPath, "SchedulerConfig YAML (policy parameters; --policies still picks the policies)")
	fs.BoolVar(&o.JSON, "json", o.JSON, "print JSON instead of a table")
	fs.IntVar(&o.Parallel, "parallel", o.Parallel, "policies simulated at once (0 = GOMAXPROCS)")
}
