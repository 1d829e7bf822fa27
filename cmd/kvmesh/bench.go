package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/internal/engine"
	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
)

// runBench compares routing policies in a discrete-event simulation: the
// real index and scheduler against simulated engines in virtual time.
func runBench(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	var (
		mode        = fs.String("mode", "des", "benchmark mode (des: discrete-event simulation)")
		engines     = fs.Int("engines", 8, "simulated engines")
		policies    = fs.String("policies", strings.Join(defaultPolicies(), ","), "comma-separated policies: "+strings.Join(scheduler.PolicyNames[:len(scheduler.PolicyNames)-1], ","))
		profile     = fs.String("profile", engine.DefaultProfile, "engine timing profile: "+strings.Join(engine.ProfileNames(), ", "))
		gpuBlocks   = fs.Int("gpu-blocks", 0, "GPU KV capacity per engine in blocks (0 = engine default)")
		cpuBlocks   = fs.Int("cpu-blocks", 0, "CPU-tier KV capacity per engine in blocks (0 = no CPU tier)")
		blockSize   = fs.Int("block-size", 16, "tokens per KV block")
		maxRunning  = fs.Int("max-running", 0, "max sequences per batch (0 = engine default)")
		seed        = fs.Uint64("seed", 1, "workload and scheduler seed")
		wl          = fs.String("workload", "shared-prefix", "workload: shared-prefix or trace")
		groups      = fs.Int("groups", 64, "shared-prefix: groups")
		prompts     = fs.Int("prompts", 16, "shared-prefix: prompts per group")
		shared      = fs.Int("shared", 2048, "shared-prefix: shared prefix tokens")
		question    = fs.Int("question", 128, "shared-prefix: question tokens")
		output      = fs.Int("output", 256, "shared-prefix: output tokens")
		rate        = fs.Float64("rate", 0, "shared-prefix: request rate per second (0 = all at once)")
		concurrency = fs.Int("concurrency", 0, "client max requests in flight (0 = unlimited)")
		trace       = fs.String("trace", "", "trace: Mooncake-format JSONL file")
		rateScale   = fs.Float64("rate-scale", 1, "trace: arrival rate multiplier")
		limit       = fs.Int("limit", 0, "trace: use only the first N requests (0 = all)")
		eventDelay  = fs.Duration("event-delay", 0, "KV event propagation delay to the index")
		snapshot    = fs.Duration("snapshot-interval", 200*time.Millisecond, "engine load snapshot period (gossip staleness); negative = always fresh")
		configPath  = fs.String("config", "", "SchedulerConfig YAML (policy parameters; --policies still picks the policies)")
		jsonOut     = fs.Bool("json", false, "print JSON instead of a table")
	)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if *mode != "des" {
		return fmt.Errorf("%w: --mode %q (only des)", errUsage, *mode)
	}
	prof, err := engine.LookupProfile(*profile)
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	cfg := des.Config{
		Engines:          *engines,
		Engine:           engine.Config{BlockSize: *blockSize, GPUBlocks: *gpuBlocks, CPUBlocks: *cpuBlocks, MaxRunning: *maxRunning, Profile: prof},
		Concurrency:      *concurrency,
		EventDelay:       *eventDelay,
		SnapshotInterval: *snapshot,
		Seed:             *seed,
	}
	if *configPath != "" {
		sc, err := scheduler.LoadConfig(*configPath)
		if err != nil {
			return err
		}
		cfg.Scheduler = sc
	}
	var reqs []workload.Request
	switch *wl {
	case "shared-prefix":
		reqs, err = workload.SharedPrefix{Groups: *groups, Prompts: *prompts, Shared: *shared, Question: *question,
			Output: *output, Rate: *rate, Seed: *seed}.Generate()
	case "trace":
		if *trace == "" {
			return fmt.Errorf("%w: --workload trace needs --trace FILE", errUsage)
		}
		reqs, err = workload.Mooncake{RateScale: *rateScale, Seed: *seed, Limit: *limit}.ReadFile(*trace)
	default:
		return fmt.Errorf("%w: --workload %q (shared-prefix or trace)", errUsage, *wl)
	}
	if err != nil {
		return fmt.Errorf("%w: %v", errUsage, err)
	}
	var names []string
	for _, p := range strings.Split(*policies, ",") {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !slices.Contains(scheduler.PolicyNames, p) {
			return fmt.Errorf("%w: --policies: unknown policy %q (known: %s)", errUsage, p, strings.Join(scheduler.PolicyNames, ", "))
		}
		names = append(names, p)
	}
	if len(names) == 0 {
		return fmt.Errorf("%w: --policies is empty", errUsage)
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
		fmt.Fprintf(stdout, "kvmesh cost model: prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g, decodeWeight %g, externalityWeight %g, missPenalty %g\n",
			k.PrefillRate, k.StepBase, k.DecodeSecPerToken, k.DecodeWeight, k.ExternalityWeight, k.MissPenalty)
	}
	return rep.WriteTable(stdout)
}

func defaultPolicies() []string {
	return []string{"random", "round-robin", "least-request", "kthena", "ray", "sglang", "dynamo", "llmd", "kvmesh"}
}
