// Package bench is `kvmesh bench`: it compares routing policies by
// running a workload (loadtest/workload) through a discrete-event
// simulation of the real index and scheduler against simulated engines
// (loadtest/des), and reports a table or JSON. It owns the command's
// options and their checks; cmd/kvmesh only binds flags onto Options.
package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/des"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// ErrUsage wraps every problem with Options. Problems name the options
// as the command line spells them (--engines), since that is where they
// are set.
var ErrUsage = errors.New("bench: invalid options")

// DefaultProfile is the engine of the scenarios: a 7B model on a
// 48 GB GPU holding 480k tokens of KV at 30,000 blocks of 16.
const DefaultProfile = "7b-l40s"

// Options are the command's settings; DefaultOptions documents the
// defaults. Zero is a valid value only where a field says so.
type Options struct {
	Mode     string   // des (discrete-event simulation) or live (real processes, live.go)
	Engines  int      // simulated engines, 1..4000
	Policies []string // policies to compare (registry.PolicyNames); blank items are skipped
	Profile  string   // engine timing profile (engine.ProfileNames)
	// ProfileFile, when set, is a user-written timing profile
	// (engine.ProfileFile documents its fields); it overrides Profile.
	ProfileFile string
	// Parallel is how many policies are simulated at once (0: GOMAXPROCS).
	Parallel int
	// GPUBlocks (0: engine default), CPUBlocks (0: no CPU tier) per engine;
	// BlockSize tokens per block; MaxRunning and MaxBatchTokens per batch
	// (0: the profile's vLLM default).
	GPUBlocks, CPUBlocks, BlockSize, MaxRunning, MaxBatchTokens int
	// Seed seeds the workload and the schedulers; 0 means the default, 1.
	Seed uint64
	// Workload is shared-prefix, trace (Mooncake JSONL), azure (an Azure
	// LLM inference CSV with synthetic prefixes), chat (multi-turn),
	// tool-agent, coding (per-user repository contexts with edits), rag
	// (shuffled retrieved documents) or mix (long summaries beside short
	// chat) (loadtest/workload documents each).
	Workload string
	// Shared-prefix workload: Groups of Prompts sharing Shared tokens, each
	// with Question more and Output generated; Rate requests/s (0: all at once).
	Groups, Prompts, Shared, Question, Output int
	Rate                                      float64
	// Concurrency caps the client's requests in flight (0: unlimited).
	Concurrency int
	// Trace workload: a Mooncake-format JSONL file (or, for azure, the
	// CSV), its arrival rate scaled by RateScale (> 0; the generated
	// workloads but shared-prefix too), only its first Limit requests (0:
	// all; the same).
	Trace     string
	RateScale float64
	Limit     int
	// TraceBlockTokens is the tokens per hash_ids block of a Mooncake
	// trace (0: the format's, 512 for Mooncake's, 16 for Bailian's); a
	// trace row without output_length generates Output tokens.
	TraceBlockTokens int
	// EventDelay is the KV-event propagation delay to the index;
	// SnapshotInterval the engine load snapshot period (negative: always fresh).
	EventDelay, SnapshotInterval time.Duration
	// SpeculativeTTL is how long a routed request's keys count as cached on
	// its engine before its KV events confirm them (des.Config's; live:
	// the ingresses', in engine time). 0: index.DefaultSpeculativeTTL, the
	// ingress's default.
	SpeculativeTTL time.Duration
	// LearnUnpooled (des) starts each engine's learned costs from the
	// prior, not from the estimate pooled over every engine
	// (learn.Config.Unpooled; an ablation).
	LearnUnpooled bool
	// LearnShared (des) prices every engine with the learned costs pooled
	// over all of them (learn.Config.Shared).
	LearnShared bool
	// LearnFreeIntercept (des) fits the learner's prefill line without its
	// intercept prior (learn.Config.FreeIntercept; an ablation).
	LearnFreeIntercept bool
	// ConfigPath is a SchedulerConfig file with the policies' parameters.
	ConfigPath string
	JSON       bool // JSON instead of a table
	// HTML, when set, is a file to write a self-contained HTML report to.
	HTML string
	// RequestsCSV, when set, is a file to write every finished request to
	// (report.WriteCSV).
	RequestsCSV string
	// Live mode (live.go): engines run TimeScale× faster than real time
	// behind Ingresses ingress replicas.
	TimeScale float64
	Ingresses int
	// PortBase puts the live mesh's listeners on fixed loopback ports
	// from it on (demo.MeshPorts: NATS, 4 per engine, 2 per ingress, in
	// the order loadtest/demo/ports.go documents); 0 picks free ports.
	PortBase int
	// NoStream sends the live requests without streaming (a buffered
	// answer: the client's TTFT is its E2E; the engines' own TTFT is
	// still reported).
	NoStream bool
	// Progress, when set, gets progress lines: the load generator's in live
	// mode, in the DES one per running policy every 10 s of wall time
	// (des.Config.Progress).
	Progress io.Writer
	// Stderr, when set, gets warnings about the run (a trace spanning
	// years); --quiet does not silence them.
	Stderr io.Writer
}

// vllmBlockSizes are the block sizes vLLM's --block-size accepts
// (vllm/config/cache.py's BlockSize; 256 since v0.10). The simulated
// engine would run any size up to 1024, but an engine no vLLM can be is
// not a faithful comparison, so --block-size is one of these.
var vllmBlockSizes = []int{1, 8, 16, 32, 64, 128, 256}

// DefaultOptions compares the baselines, the emulated routers and kvmesh
// on 8 engines with a shared-prefix workload of 64 groups of 16 prompts.
func DefaultOptions() Options {
	return Options{Mode: "des", Engines: 8, Policies: DefaultPolicies(), Profile: DefaultProfile, BlockSize: 16, Seed: 1,
		Workload: "shared-prefix", Groups: 64, Prompts: 16, Shared: 2048, Question: 128, Output: 256, RateScale: 1,
		SnapshotInterval: 200 * time.Millisecond, TimeScale: DefaultTimeScale, Ingresses: 1}
}

// DefaultPolicies are every policy but the generic weighted one (which
// needs scorers from a config).
func DefaultPolicies() []string {
	return slices.DeleteFunc(registry.PolicyNames(), func(p string) bool { return p == "weighted" })
}

// Run checks o, runs the simulation and writes the report to stdout.
func Run(ctx context.Context, o Options, stdout io.Writer) error {
	cfg, names, err := o.Prepare()
	if err != nil {
		return err
	}
	reqs, err := o.Requests()
	if err != nil {
		return fmt.Errorf("%w: %v", ErrUsage, err)
	}
	rep, err := o.run(ctx, cfg, reqs, names)
	if err != nil {
		return err
	}
	rep.Run = o.RunInfo(cfg, reqs, names)
	// The report goes to stdout first: a file that cannot be written
	// after all (checked in Prepare, but the disk may fill) loses no
	// result.
	if err := o.writeReport(stdout, rep, reqs, cfg, names); err != nil {
		return err
	}
	if o.HTML != "" {
		if err := o.writeHTML(rep, reqs, cfg); err != nil {
			return err
		}
	}
	if o.RequestsCSV != "" {
		if err := o.WriteRequestsCSV(rep); err != nil {
			return err
		}
	}
	return NoneCompleted(outcomes(rep))
}

// writeReport writes rep to stdout as JSON or as the table.
func (o Options) writeReport(stdout io.Writer, rep report.Report, reqs []workload.Request, cfg des.Config, names []string) error {
	if o.JSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(rep); err != nil {
			return err
		}
		// The JSON has each policy's errors; the same lines as under
		// the table go to stderr, where a CI log shows them.
		if o.Stderr != nil {
			return writeFailures(o.Stderr, rep)
		}
		return nil
	}
	st := workload.Summarize(reqs)
	fmt.Fprintf(stdout, "workload %s: %d requests, %d prompt + %d output tokens, arrivals over %.1fs; %d engines (%s)\n",
		o.Workload, st.Requests, st.PromptTokens, st.OutputTokens, st.Duration.Seconds(), o.Engines, cfg.Engine.Profile.Name)
	WriteWorkloadNotes(stdout, st)
	if o.Mode == "live" {
		o.liveNote(stdout)
	}
	if slices.Contains(names, "kvmesh") && o.Mode == "des" {
		c := cfg
		c.Defaults()
		k, err := kvmeshParams(c.Scheduler)
		if err != nil {
			return err
		}
		fmt.Fprintf(stdout, "kvmesh cost model learned online from prior prefillRate %.0f tok/s, stepBase %.4fs, decodeSecPerToken %.3g; decodeWeight %g, externalityWeight %g, stallWeight %g, missPenalty %g, waitingWeight %g; hold %gs (aging %g, affinity %g)\n",
			k.PrefillRate, k.StepBase, k.DecodeSecPerToken, k.DecodeWeight, k.ExternalityWeight, k.StallWeight, k.MissPenalty, k.WaitingWeight, k.Hold.Seconds, k.Hold.Aging, k.Hold.Affinity)
	}
	if err := rep.WriteTable(stdout); err != nil {
		return err
	}
	if err := writeFailures(stdout, rep); err != nil {
		return err
	}
	if o.Mode != "live" {
		return nil
	}
	return o.liveOverheads(stdout, rep)
}

// writeFailures writes a line per policy whose requests failed: how many,
// and each kind's count and first message.
func writeFailures(w io.Writer, rep report.Report) error {
	for _, p := range rep.Order {
		if res := rep.Policies[p]; res.FailureNote != "" {
			note := res.FailureNote
			if res.Completed == 0 {
				note += "; none completed, so its throughput, latencies, hit rate and imbalance are n/a"
			}
			if _, err := fmt.Fprintf(w, "%s: %s\n", p, note); err != nil {
				return err
			}
		}
	}
	return nil
}

// WriteWorkloadNotes writes, under a report's workload line, what reading
// the workload changed: trace rows with output_length 0, sent as 1 token.
func WriteWorkloadNotes(w io.Writer, st workload.Stats) {
	if st.ZeroOutput > 0 {
		fmt.Fprintf(w, "%d trace rows with output_length 0 sent as 1 output token\n", st.ZeroOutput)
	}
}

// run runs the prepared benchmark in o's mode.
func (o Options) run(ctx context.Context, cfg des.Config, reqs []workload.Request, names []string) (report.Report, error) {
	if o.Mode == "live" {
		return runLive(ctx, o, cfg, reqs, names)
	}
	return des.Run(ctx, cfg, reqs, names)
}

// Prepare checks o and returns the simulation's config and the policies
// to compare. Every problem is listed, joined by "; " on one line, wrapping
// ErrUsage: des.Config and the workloads read some zero values as
// "default" (0 engines would run 8), so they are rejected here first.
func (o *Options) Prepare() (des.Config, []string, error) {
	var probs []string
	bad := func(format string, a ...any) { probs = append(probs, fmt.Sprintf(format, a...)) }
	prof := o.checkEngines(bad)
	o.checkWorkload(bad)
	o.checkLive(bad)
	for _, out := range []struct{ flag, path string }{{"--html", o.HTML}, {"--requests-csv", o.RequestsCSV}} {
		if out.path == "" {
			continue
		}
		if err := report.CheckWritable(out.flag, out.path); err != nil {
			bad("%v", err)
		}
	}
	var sc scheduler.Config
	if o.ConfigPath != "" {
		var err error
		if sc, err = registry.LoadConfig(o.ConfigPath); err != nil {
			bad("--config: %v", err)
		}
	}
	names := o.checkPolicies(sc, bad)
	seed := o.Seed
	// des.Config reads seed 0 as its default 1 for the schedulers; seed 0
	// means that default for the workload too, so it runs exactly seed 1.
	if seed == 0 {
		seed = 1
	}
	cfg := des.Config{
		Engines: o.Engines,
		Engine: engine.Config{BlockSize: o.BlockSize, GPUBlocks: o.GPUBlocks, CPUBlocks: o.CPUBlocks, MaxRunning: o.MaxRunning,
			MaxBatchTokens: o.MaxBatchTokens, Profile: prof},
		Scheduler:        sc,
		Concurrency:      o.Concurrency,
		EventDelay:       o.EventDelay,
		SnapshotInterval: o.SnapshotInterval,
		SpeculativeTTL:   o.SpeculativeTTL,
		Seed:             seed,
		Parallel:         o.Parallel,
		Learn:            learn.Config{Unpooled: o.LearnUnpooled, Shared: o.LearnShared, FreeIntercept: o.LearnFreeIntercept},
	}
	if o.Mode == "des" {
		cfg.Progress = o.Progress // live mode's comes from the load generator
	}
	if len(probs) == 0 {
		// Whatever des would still reject (a --config parameter...), as a
		// usage error too.
		c := cfg
		c.Defaults()
		if err := c.Validate(); err != nil {
			bad("%v", err)
		}
	}
	if len(probs) > 0 {
		return cfg, nil, fmt.Errorf("%w: %s", ErrUsage, strings.Join(probs, "; "))
	}
	return cfg, names, nil
}

// checkEngines checks the mode and the simulated engines; it returns the
// timing profile.
func (o *Options) checkEngines(bad func(string, ...any)) engine.Profile {
	if o.Mode != "des" && o.Mode != "live" {
		bad("--mode %q: want des or live", o.Mode)
	}
	prof, err := engine.LookupProfile(o.Profile)
	if err != nil {
		bad("--profile %q: want one of %s", o.Profile, strings.Join(engine.ProfileNames(), ", "))
	}
	if o.ProfileFile != "" {
		if prof, err = engine.LoadProfileFile(o.ProfileFile); err != nil {
			bad("--profile-file: %v", err)
		}
	}
	atLeast(bad, "parallel", o.Parallel, 0, " (0 = GOMAXPROCS)")
	if o.Engines < 1 || o.Engines > 4000 {
		bad("--engines %d: want 1..4000", o.Engines)
	}
	if o.GPUBlocks < 0 || o.GPUBlocks > 1<<30 {
		bad("--gpu-blocks %d: want 0 (engine default) or 1..2^30", o.GPUBlocks)
	}
	if o.CPUBlocks < 0 || o.CPUBlocks > 1<<30 {
		bad("--cpu-blocks %d: want 0..2^30", o.CPUBlocks)
	}
	if !slices.Contains(vllmBlockSizes, o.BlockSize) {
		bad("--block-size %d: want one of %s (vLLM's --block-size choices: the simulated engines are vLLM's)", o.BlockSize,
			strings.Trim(strings.Join(strings.Fields(fmt.Sprint(vllmBlockSizes)), ", "), "[]"))
	}
	atLeast(bad, "max-running", o.MaxRunning, 0, "")
	atLeast(bad, "max-batch-tokens", o.MaxBatchTokens, 0, "")
	atLeast(bad, "concurrency", o.Concurrency, 0, " (0 = unlimited)")
	if o.EventDelay < 0 {
		bad("--event-delay %v: want ≥ 0", o.EventDelay)
	}
	if o.SpeculativeTTL < 0 {
		bad("--speculative-ttl %v: want ≥ 0", o.SpeculativeTTL)
	}
	return prof
}

// checkWorkload checks the workload's options.
func (o *Options) checkWorkload(bad func(string, ...any)) {
	atLeast(bad, "groups", o.Groups, 1, "")
	atLeast(bad, "prompts", o.Prompts, 1, "")
	atLeast(bad, "shared", o.Shared, 0, "")
	atLeast(bad, "question", o.Question, 0, "")
	if o.Shared == 0 && o.Question == 0 {
		bad("--shared and --question are both 0: a prompt needs a token")
	}
	atLeast(bad, "output", o.Output, 1, "")
	if o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0) {
		bad("--rate %v: want a finite rate ≥ 0 (0 = all at once)", o.Rate)
	}
	if !(o.RateScale > 0) || math.IsInf(o.RateScale, 0) {
		bad("--rate-scale %v: want a finite multiplier > 0", o.RateScale)
	}
	atLeast(bad, "limit", o.Limit, 0, " (0 = all)")
	atLeast(bad, "trace-block-size", o.TraceBlockTokens, 0, " (0 = the format's: 512, Bailian 16)")
	switch o.Workload {
	case "shared-prefix":
	case "trace", "bailian", "azure", "sharegpt":
		if o.Trace == "" {
			bad("--workload %s needs --trace FILE", o.Workload)
		}
	case "chat", "tool-agent", "coding", "rag", "mix":
	default:
		bad("--workload %q: want shared-prefix, trace, bailian, azure, sharegpt, chat, tool-agent, coding, rag or mix", o.Workload)
	}
}

// checkPolicies checks the policy list against the registry and sc.
func (o *Options) checkPolicies(sc scheduler.Config, bad func(string, ...any)) []string {
	var names []string
	given := false
	for _, p := range o.Policies {
		p = strings.TrimSpace(p)
		given = given || p != ""
		switch {
		case p == "":
		case !slices.Contains(registry.PolicyNames(), p):
			bad("--policies: unknown policy %q (known: %s)", p, strings.Join(registry.PolicyNames(), ", "))
		case slices.Contains(names, p):
			bad("--policies: %q given twice", p)
		case p == "weighted" && !sc.HasParams("weighted"):
			bad("--policies: weighted needs a --config with weighted scorers")
		default:
			names = append(names, p)
		}
	}
	if !given {
		bad("--policies is empty")
	}
	return names
}

func atLeast(bad func(string, ...any), name string, v, lo int, note string) {
	if v < lo {
		bad("--%s %d: want ≥ %d%s", name, v, lo, note)
	}
}

// Mooncake is how o reads a Mooncake-format trace (--workload trace, or
// bailian for Bailian's form), with the workload seed seed; `kvmesh bench
// --mode des --roles` reads its trace with it too.
func (o *Options) Mooncake(seed uint64) workload.Mooncake {
	return workload.Mooncake{RateScale: o.RateScale, Seed: seed, Limit: o.Limit, BlockTokens: o.TraceBlockTokens, Output: o.Output,
		Bailian: o.Workload == "bailian"}
}

// Requests generates or reads the workload o names (after Prepare), and
// warns on o.Stderr about a trace whose arrivals span more than
// maxTraceSpan.
func (o *Options) Requests() ([]workload.Request, error) {
	reqs, err := o.requests()
	if err == nil && o.Trace != "" && benchTraceKinds[o.Workload] {
		o.warnSpan(reqs)
	}
	return reqs, err
}

// benchTraceKinds are the workloads read from --trace.
var benchTraceKinds = map[string]bool{"trace": true, "bailian": true, "azure": true, "sharegpt": true}

// maxTraceSpan is the longest trace span taken without a warning: public
// traces cover hours to weeks, and a span of years is most often one row
// with a relative timestamp among epoch ones (the readers subtract the
// earliest timestamp, so "0" and 1733480000000 ms make 55 years).
const maxTraceSpan = 30 * 24 * time.Hour

// warnSpan warns when reqs' arrivals span more than maxTraceSpan.
func (o *Options) warnSpan(reqs []workload.Request) {
	if o.Stderr == nil || len(reqs) == 0 {
		return
	}
	span := workload.Summarize(reqs).Duration
	if span <= maxTraceSpan {
		return
	}
	gap, at := time.Duration(0), 0
	for i := 1; i < len(reqs); i++ {
		if d := reqs[i].Arrival - reqs[i-1].Arrival; d > gap {
			gap, at = d, i
		}
	}
	fmt.Fprintf(o.Stderr, "warning: --trace %s: arrivals span %.0f days, %.0f of them a gap before request %d (in arrival order): mixed relative and epoch timestamps?\n",
		o.Trace, span.Hours()/24, gap.Hours()/24, at)
}

// requests is Requests without the warning.
func (o *Options) requests() ([]workload.Request, error) {
	seed := max(o.Seed, 1)
	switch o.Workload {
	case "trace", "bailian":
		return o.Mooncake(seed).ReadFile(o.Trace)
	case "azure":
		return workload.Azure{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.ReadFile(o.Trace)
	case "sharegpt":
		return workload.ShareGPT{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.ReadFile(o.Trace)
	case "chat":
		return workload.Chat{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.Generate()
	case "tool-agent":
		return workload.ToolAgent{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.Generate()
	case "coding":
		return workload.Coding{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.Generate()
	case "rag":
		return workload.RAG{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.Generate()
	case "mix":
		return workload.Mix{RateScale: o.RateScale, Seed: seed, Limit: o.Limit}.Generate()
	}
	return workload.SharedPrefix{Groups: o.Groups, Prompts: o.Prompts, Shared: o.Shared, Question: o.Question,
		Output: o.Output, Rate: o.Rate, Seed: seed}.Generate()
}

// kvmeshParams is the kvmesh policy sc configures.
func kvmeshParams(sc scheduler.Config) (policies.KVMesh, error) {
	sc.Policy = "kvmesh"
	p, err := registry.Policy(&sc)
	if err != nil {
		return policies.KVMesh{}, err
	}
	k, _ := p.(policies.KVMesh)
	return k, nil
}
