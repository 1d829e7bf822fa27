package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// loadtestReads reports whether a -workload kind run reads flag f: the
// shared-prefix generator's shape flags and the trace readers' flags each
// belong to their workloads (an unknown kind is refused after).
func loadtestReads(kind, f string) bool {
	switch f {
	case "groups", "prompts", "shared", "question":
		return kind == "shared-prefix"
	case "output":
		return kind != "sharegpt"
	case "trace", "trace-rate-scale":
		return kind != "shared-prefix"
	case "trace-block-size":
		return kind == "mooncake" || kind == "bailian"
	}
	return true
}

// runLoadtest sends a workload to any OpenAI-compatible URL and reports client-side
// latency, throughput, tokens and errors.
func runLoadtest(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("loadtest", stderr)
	cfg := loadgen.DefaultConfig()
	var (
		endpoint   = fs.String("endpoint", string(cfg.Endpoint), "API: completions (token-id prompts), chat, responses (the Responses API) or messages (Anthropic's Messages API); the last three render the tokens as words")
		kind       = fs.String("workload", "shared-prefix", "workload: shared-prefix, mooncake, bailian (Alibaba Bailian JSONL) or sharegpt (ShareGPT JSON conversations as sessions)")
		sp         = workload.SharedPrefix{Groups: 32, Prompts: 16, Shared: 2048, Question: 128, Output: 64, Seed: 1}
		trace      = fs.String("trace", "testdata/traces/mooncake_synthetic_trace.jsonl", "trace (JSONL) for -workload mooncake or bailian; the ShareGPT JSON for sharegpt")
		traceScale = fs.Float64("trace-rate-scale", 1, "mooncake: multiply the trace's arrival rate")
		traceBlock = fs.Int("trace-block-size", 0, "mooncake, bailian: tokens per hash_ids block (0 = the format's: 512, Bailian 16)")
		limit      = fs.Int("limit", 0, "send only the first N requests (0 = all)")
		asJSON     = fs.Bool("json", false, "print the report as JSON on stdout")
		quiet      = fs.Bool("quiet", false, "no progress line on stderr")
		htmlFile   = fs.String("html", "", "also write a self-contained HTML report (plots, table) to this file")
		csvFile    = fs.String("requests-csv", "", "also write every finished request (engine, start, TTFT, E2E, TPOT, prompt, cached and output tokens; wall seconds; failed ones with their error kind) to this CSV file")
		engines    = fs.String("engines", "", "comma-separated engine ids behind -url (as its X-Kvmesh-Engine header names them): the load imbalance counts one that served nothing as its 0 (default: over the engines that answered, n/a over one)")
		maxFailed  = fs.Float64("max-failed-ratio", defaultMaxFailedRatio, "exit 1 (after the report) when more than this fraction of the requests sent failed (0: any failure; 1: never)")
	)
	fs.StringVar(&cfg.URL, "url", "http://127.0.0.1:8000", "base URL of the OpenAI-compatible server")
	fs.StringVar(&cfg.Model, "model", "kvmesh-sim", "model name sent in every request")
	fs.StringVar(&cfg.APIKey, "api-key", os.Getenv("KVMESH_API_KEY"), "bearer API key (default $KVMESH_API_KEY)")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "max requests in flight")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open-loop Poisson arrival rate in req/s (0 = the workload's own arrivals, -1 = closed loop)")
	fs.Uint64Var(&cfg.Seed, "seed", 1, "seed of the workload and of -rate arrivals")
	fs.DurationVar(&cfg.Timeout, "timeout", cfg.Timeout, "per-request timeout")
	fs.StringVar(&cfg.SessionHeader, "session-header", "", "send each request's session id in this header (e.g. X-Session-ID)")
	fs.BoolVar(&cfg.NoStream, "no-stream", false, "non-streaming requests (TTFT = E2E)")
	fs.BoolVar(&cfg.StrictSSE, "strict-sse", false, "read streams only in vLLM's SSE form (any other framing is a stream error; default: any framing the SSE standard allows, counted in the report)")
	fs.IntVar(&cfg.N, "n", 0, "sampled sequences per request (\"n\", parallel sampling as RL rollouts ask; completions and chat; 0 or 1: one)")
	fs.IntVar(&sp.Groups, "groups", sp.Groups, "shared-prefix: groups")
	fs.IntVar(&sp.Prompts, "prompts", sp.Prompts, "shared-prefix: prompts per group")
	fs.IntVar(&sp.Shared, "shared", sp.Shared, "shared-prefix: shared prefix tokens")
	fs.IntVar(&sp.Question, "question", sp.Question, "shared-prefix: question tokens")
	fs.IntVar(&sp.Output, "output", sp.Output, "shared-prefix: output tokens; mooncake: for rows without output_length")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if err := refuseUnread(fs, "-workload "+*kind, func(f string) bool { return loadtestReads(*kind, f) }); err != nil {
		return err
	}
	cfg.Endpoint = loadgen.Endpoint(*endpoint)
	sp.Seed = cfg.Seed
	if *limit < 0 {
		return fmt.Errorf("%w: -limit %d (want ≥ 0; 0 = all)", errUsage, *limit)
	}
	var engineIDs []string
	for _, e := range strings.Split(*engines, ",") {
		if e = strings.TrimSpace(e); e != "" && !slices.Contains(engineIDs, e) {
			engineIDs = append(engineIDs, e)
		}
	}
	if flagGiven(fs, "engines") && len(engineIDs) == 0 {
		return fmt.Errorf("%w: -engines %q names no engine", errUsage, *engines)
	}

	var (
		reqs []workload.Request
		err  error
	)
	switch *kind {
	case "shared-prefix":
		reqs, err = sp.Generate()
	case "mooncake", "bailian":
		if !(*traceScale > 0) || math.IsInf(*traceScale, 0) {
			return fmt.Errorf("%w: -trace-rate-scale %v (want a finite number > 0)", errUsage, *traceScale)
		}
		// Rows without output_length generate -output tokens.
		reqs, err = workload.Mooncake{RateScale: *traceScale, Seed: cfg.Seed, Limit: *limit, BlockTokens: *traceBlock, Output: sp.Output,
			Bailian: *kind == "bailian"}.ReadFile(*trace)
	case "sharegpt":
		if !(*traceScale > 0) || math.IsInf(*traceScale, 0) {
			return fmt.Errorf("%w: -trace-rate-scale %v (want a finite number > 0)", errUsage, *traceScale)
		}
		reqs, err = workload.ShareGPT{RateScale: *traceScale, Seed: cfg.Seed, Limit: *limit}.ReadFile(*trace)
	default:
		return fmt.Errorf("%w: -workload %q (want shared-prefix, mooncake, bailian or sharegpt)", errUsage, *kind)
	}
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *limit > 0 && len(reqs) > *limit {
		reqs = reqs[:*limit]
	}
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if !(*maxFailed >= 0 && *maxFailed <= 1) {
		return fmt.Errorf("%w: -max-failed-ratio %v (want a fraction in [0, 1])", errUsage, *maxFailed)
	}
	for _, out := range []struct{ flag, path string }{{"-html", *htmlFile}, {"-requests-csv", *csvFile}} {
		if out.path == "" {
			continue
		}
		if err := report.CheckWritable(out.flag, out.path); err != nil {
			return fmt.Errorf("%w: %w", errUsage, err)
		}
	}
	if !*quiet {
		cfg.Progress = progressLine(stderr, "")
	}
	rep, err := loadgen.Run(ctx, cfg, reqs)
	if rep == nil {
		if errors.Is(err, loadgen.ErrConfig) {
			return fmt.Errorf("%w: %w", errUsage, err) // e.g. a -rate whose arrivals overflow
		}
		return err
	}
	if engineIDs != nil {
		rep.CountEngines(engineIDs)
	}
	// stdout first, then the files (checked writable above): a file that
	// fails after all loses no result.
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(rep); jerr != nil {
			return jerr
		}
	} else if werr := rep.WriteText(stdout); werr != nil {
		return werr
	}
	if *htmlFile != "" {
		if herr := writeLoadtestHTML(*htmlFile, rep, *kind); herr != nil {
			return herr
		}
	}
	if *csvFile != "" {
		if cerr := writeLoadtestCSV(*csvFile, rep); cerr != nil {
			return cerr
		}
	}
	if err == nil && rep.Sent > 0 && rep.Completed == 0 {
		return fmt.Errorf("no request succeeded (%d failed: %s)", rep.Failed, rep.FailureSummary())
	}
	if err == nil && rep.Sent > 0 && float64(rep.Failed) > *maxFailed*float64(rep.Sent) {
		return fmt.Errorf("%d of %d requests failed (%.1f %%), more than -max-failed-ratio %v allows: %s",
			rep.Failed, rep.Sent, 100*float64(rep.Failed)/float64(rep.Sent), *maxFailed, rep.FailureSummary())
	}
	return err
}

// defaultMaxFailedRatio is -max-failed-ratio's default: a run with more
// than 1 % of its requests failed exits 1.
const defaultMaxFailedRatio = 0.01

// writeLoadtestHTML writes rep as a self-contained HTML report.
// The command line is left out: it may carry -api-key.
func writeLoadtestHTML(path string, rep *loadgen.Report, kind string) error {
	err := report.WriteFile(path, func(w io.Writer) error {
		notes := []string{fmt.Sprintf("workload %s: %d requests sent, %d completed; measured at the client (wall seconds)", kind, rep.Sent, rep.Completed)}
		if rep.EnginesUnseen() {
			notes = append(notes, fmt.Sprintf("load imbalance over the %d engines that answered (engines that served nothing are unseen; n/a over one): -engines names them all", len(rep.PerEngine)))
		}
		return report.WriteHTML(w, loadtestReport(rep), report.HTMLMeta{Title: "kvmesh loadtest", Notes: notes})
	})
	if err != nil {
		return fmt.Errorf("-html: %w", err)
	}
	return nil
}

// progressLine reports loadgen progress on w (loadgen.ProgressLine: one
// redrawn line on a terminal, periodic plain lines elsewhere).
func progressLine(w io.Writer, prefix string) func(loadgen.Progress) {
	return loadgen.ProgressLine(w, prefix)
}

// loadtestReport is rep as the benchmark's report of one policy, "run".
func loadtestReport(rep *loadgen.Report) report.Report {
	ids := slices.Sorted(maps.Keys(rep.PerEngine))
	return report.Report{Policies: map[string]report.PolicyResult{"run": rep.PolicyResult()}, Order: []string{"run"},
		Runs: map[string]report.Run{"run": rep.Run(1, ids)}}
}

// writeLoadtestCSV writes rep's finished requests as CSV rows
// (report.WriteCSV; the policy column says "run").
func writeLoadtestCSV(path string, rep *loadgen.Report) error {
	if err := report.WriteFile(path, func(w io.Writer) error { return report.WriteCSV(w, loadtestReport(rep)) }); err != nil {
		return fmt.Errorf("-requests-csv: %w", err)
	}
	return nil
}
