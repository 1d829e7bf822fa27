package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// runBench compares routing policies in a discrete-event simulation: the
// real index and scheduler against simulated engines in virtual time.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	var (
		mode        = fs.String("mode", "des", "benchmark mode (des: discrete-event simulation)")
		engines     = fs.Int("engines", 8, "simulated engines (1..4000)")
		policies    = fs.String("policies", strings.Join(defaultPolicies(), ","), "comma-separated policies: "+strings.Join(scheduler.PolicyNames[:len(scheduler.PolicyNames)-1], ","))
		profile     = fs.String("profile", benchProfile, "engine timing profile: "+strings.Join(engine.ProfileNames(), ", "))
		gpuBlocks   = fs.Int("gpu-blocks", 0, "GPU KV capacity per engine in blocks (0 = engine default)")
		cpuBlocks   = fs.Int("cpu-blocks", 0, "CPU-tier KV capacity per engine in blocks (0 = no CPU tier)")
		blockSize   = fs.Int("block-size", 16, "tokens per KV block")
		maxRunning  = fs.Int("max-running", 0, "max sequences per batch (0 = the profile's vLLM default)")
		maxBatchTok = fs.Int("max-batch-tokens", 0, "token budget per step (0 = the profile's vLLM default)")
		seed        = fs.Uint64("seed", 1, "workload and scheduler seed (0 means the default, 1)")
		wl          = fs.String("workload", "shared-prefix", "workload: shared-prefix or trace")
		groups      = fs.Int("groups", 64, "shared-prefix: groups")
		prompts     = fs.Int("prompts", 16, "shared-prefix: prompts per group")
		shared      = fs.Int("shared", 2048, "shared-prefix: shared prefix tokens")
		question    = fs.Int("question", 128, "shared-prefix: question tokens")
		output      = fs.Int("output", 256, "shared-prefix: output tokens")
		rate        = fs.Float64("rate", 0, "shared-prefix: request rate per second (0 = all at once)")
		concurrency = fs.Int("concurrency", 0, "client max requests in flight (0 = unlimited)")
		trace       = fs.String("trace", "", "trace: Mooncake-format JSONL file")
		rateScale   = fs.Float64("rate-scale", 1, "trace: arrival rate multiplier (> 0)")
		limit       = fs.Int("limit", 0, "trace: use only the first N requests (0 = all)")
		eventDelay  = fs.Duration("event-delay", 0, "KV event propagation delay to the index")
		snapshot    = fs.Duration("snapshot-interval", 200*time.Millisecond, "engine load snapshot period (gossip staleness); negative = always fresh")
		configPath  = fs.String("config", "", "SchedulerConfig YAML (policy parameters; --policies still picks the policies)")
		jsonOut     = fs.Bool("json", false, "print JSON instead of a table")
		pdf         = pdBenchFlags(fs)
	)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	// Every invalid value is a usage error listing every problem: des.Config
	// and the workloads read some zero values as "default" (0 engines would
	// run 8), so the command line must reject them before they get there.
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	if *mode != "des" {
		bad("--mode %q: only des", *mode)
	}
	prof, err := engine.LookupProfile(*profile)
	if err != nil {
		bad("--profile %q: want one of %s", *profile, strings.Join(engine.ProfileNames(), ", "))
	}
	if *engines < 1 || *engines > 4000 {
		bad("--engines %d: want 1..4000", *engines)
	}
	if *gpuBlocks < 0 || *gpuBlocks > 1<<30 {
		bad("--gpu-blocks %d: want 0 (engine default) or 1..2^30", *gpuBlocks)
	}
	if *cpuBlocks < 0 || *cpuBlocks > 1<<30 {
		bad("--cpu-blocks %d: want 0..2^30", *cpuBlocks)
	}
	if *blockSize < 1 || *blockSize > 1024 {
		bad("--block-size %d: want 1..1024", *blockSize)
	}
	atLeast := func(name string, v, lo int, note string) {
		if v < lo {
			bad("--%s %d: want ≥ %d%s", name, v, lo, note)
		}
	}
	atLeast("max-running", *maxRunning, 0, "")
	atLeast("max-batch-tokens", *maxBatchTok, 0, "")
	atLeast("concurrency", *concurrency, 0, " (0 = unlimited)")
	if *eventDelay < 0 {
		bad("--event-delay %v: want ≥ 0", *eventDelay)
	}
	atLeast("groups", *groups, 1, "")
	atLeast("prompts", *prompts, 1, "")
	atLeast("shared", *shared, 0, "")
	atLeast("question", *question, 0, "")
	if *shared == 0 && *question == 0 {
		bad("--shared and --question are both 0: a prompt needs a token")
	}
	atLeast("output", *output, 1, "")
	if *rate < 0 || math.IsNaN(*rate) || math.IsInf(*rate, 0) {
		bad("--rate %v: want a finite rate ≥ 0 (0 = all at once)", *rate)
	}
	if !(*rateScale > 0) || math.IsInf(*rateScale, 0) {
		bad("--rate-scale %v: want a finite multiplier > 0", *rateScale)
	}
	atLeast("limit", *limit, 0, " (0 = all)")
	switch *wl {
	case "shared-prefix":
	case "trace":
		if *trace == "" {
			bad("--workload trace needs --trace FILE")
		}
	default:
		bad("--workload %q: want shared-prefix or trace", *wl)
	}
	var sc scheduler.Config
	if *configPath != "" {
		if sc, err = scheduler.LoadConfig(*configPath); err != nil {
			bad("--config: %v", err)
		}
	}
	var names []string
	given := false
	if pdf.on() && !flagGiven(fs, "policies") {
		*policies = strings.Join(des.PDPolicies, ",")
	}
	for _, p := range strings.Split(*policies, ",") {
		p = strings.TrimSpace(p)
		given = given || p != ""
		switch {
		case p == "":
		case pdf.on() && !slices.Contains(des.PDPolicies, p):
			bad("--policies: unknown P/D policy %q with --roles (known: %s)", p, strings.Join(des.PDPolicies, ", "))
		case pdf.on():
			names = append(names, p)
		case !slices.Contains(scheduler.PolicyNames, p):
			bad("--policies: unknown policy %q (known: %s)", p, strings.Join(scheduler.PolicyNames, ", "))
		case slices.Contains(names, p):
			bad("--policies: %q given twice", p)
		case p == "weighted" && len(sc.Weighted) == 0:
			bad("--policies: weighted needs a --config with weighted scorers")
		default:
			names = append(names, p)
		}
	}
	if !given {
		bad("--policies is empty")
	}
	// des.Config reads seed 0 as its default 1 for the schedulers; --seed 0
	// means that default for the workload too, so it runs exactly --seed 1.
	if *seed == 0 {
		*seed = 1
	}
	cfg := des.Config{
		Engines:          *engines,
		Engine:           engine.Config{BlockSize: *blockSize, GPUBlocks: *gpuBlocks, CPUBlocks: *cpuBlocks, MaxRunning: *maxRunning, MaxBatchTokens: *maxBatchTok, Profile: prof},
		Scheduler:        sc,
		Concurrency:      *concurrency,
		EventDelay:       *eventDelay,
		SnapshotInterval: *snapshot,
		Seed:             *seed,
	}
	pdCfg := pdf.config(cfg, bad)
	if len(probs) == 0 && !pdf.on() {
		// Whatever des would still reject (a --config parameter...), as a
		// usage error too.
		c := cfg
		c.Defaults()
		if err := c.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if len(probs) > 0 {
		return fmt.Errorf("%w: %s", errUsage, strings.Join(probs, "; "))
	}
	var reqs []workload.Request
	if *wl == "trace" {
		reqs, err = workload.Mooncake{RateScale: *rateScale, Seed: *seed, Limit: *limit}.ReadFile(*trace)
	} else {
		reqs, err = workload.SharedPrefix{Groups: *groups, Prompts: *prompts, Shared: *shared, Question: *question,
			Output: *output, Rate: *rate, Seed: *seed}.Generate()
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	if pdf.on() {
		return runBenchPD(ctx, pdCfg, reqs, names, *jsonOut, stdout)
	}
	rep, err := des.Run(ctx, cfg, reqs, names)
	if err != nil {
		return err
	}
	if *jsonOut {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(rep)
	}
	st := workload.Summarize(reqs)
	fmt.Fprintf(stdout, "workload %s: %d requests, %d prompt + %d output tokens, arrivals over %.1fs; %d engines (%s)\n",
		*wl, st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds(), *engines, prof.Name)
	if slices.Contains(names, "kvmesh") {
		k := cfg.Scheduler.KVMesh
		if k == nil {
			k = des.KVMeshFromProfile(prof)
		}
		fmt.Fprintf(stdout, "kvmesh cost model: prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g, decodeWeight %g, externalityWeight %g, missPenalty %g, waitingWeight %g\n",
			k.PrefillRate, k.StepBase, k.DecodeSecPerToken, k.DecodeWeight, k.ExternalityWeight, k.MissPenalty, k.WaitingWeight)
	}
	return rep.WriteTable(stdout)
}

// benchProfile is the engine of the scenarios: a 7B model on a
// 48 GB GPU holding 480k tokens of KV at 30,000 blocks of 16.
const benchProfile = "7b-l40s"

func defaultPolicies() []string {
	return []string{"random", "round-robin", "least-request", "kthena", "ray", "sglang", "dynamo", "llmd", "kvmesh"}
}
