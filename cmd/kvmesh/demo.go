package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/demo"
	"github.com/kvmesh/kvmesh/loadtest/loadgen"
)

// demoWorkloadFlags are the flags of the aggregated demo the P/D demo reads
// too (when given; otherwise its own defaults).
var demoWorkloadFlags = []string{"groups", "prompts", "shared", "question", "output", "concurrency", "gpu-blocks", "time-scale"}

// demoFlagsRead refuses the flags the kind of demo does not read:
// --autoscale reads its own, --pd its own and demoWorkloadFlags, the
// aggregated demo neither's.
func demoFlagsRead(fs *flag.FlagSet, autoscaling, pd bool) error {
	common := func(f string) bool { return f == "quiet" || f == "v" }
	switch {
	case autoscaling:
		return refuseUnread(fs, "--autoscale", func(f string) bool {
			return common(f) || f == "autoscale" || f == "duration" || f == "peak-rate"
		})
	case pd:
		return refuseUnread(fs, "--pd", func(f string) bool {
			return common(f) || f == "json" || f == "port-base" || strings.HasPrefix(f, "pd") || slices.Contains(demoWorkloadFlags, f)
		})
	}
	return refuseUnread(fs, "demo", func(f string) bool {
		return f != "autoscale" && f != "duration" && f != "peak-rate" && !strings.HasPrefix(f, "pd-")
	})
}

// runDemo runs the whole mesh on loopback and compares routing policies.
func runDemo(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("demo", stderr)
	cfg := demo.DefaultConfig()
	var (
		asJSON   = fs.Bool("json", false, "print the results as JSON (the shape of kvmesh bench --json)")
		policies = fs.String("policies", strings.Join(cfg.Policies, ","), "comma-separated routing policies to compare, in order")
		quiet    = fs.Bool("quiet", false, "no progress on stderr")
		verbose  = fs.Bool("v", false, "log the components' own messages on stderr")
		pdf      = demoPDFlags(fs)
		asf      = demoAutoscaleFlags(fs)
	)
	fs.IntVar(&cfg.Engines, "engines", cfg.Engines, "simulated engines (each with a sidecar)")
	fs.IntVar(&cfg.Ingresses, "ingresses", cfg.Ingresses, "ingress replicas")
	fs.IntVar(&cfg.Workload.Groups, "groups", cfg.Workload.Groups, "shared-prefix groups")
	fs.IntVar(&cfg.Workload.Prompts, "prompts", cfg.Workload.Prompts, "prompts per group")
	fs.IntVar(&cfg.Workload.Shared, "shared", cfg.Workload.Shared, "shared prefix tokens")
	fs.IntVar(&cfg.Workload.Question, "question", cfg.Workload.Question, "question tokens")
	fs.IntVar(&cfg.Workload.Output, "output", cfg.Workload.Output, "output tokens")
	fs.IntVar(&cfg.Concurrency, "concurrency", cfg.Concurrency, "client requests in flight")
	fs.Float64Var(&cfg.Rate, "rate", 0, "open-loop arrival rate in req/s (0 = closed loop at -concurrency)")
	fs.IntVar(&cfg.Engine.GPUBlocks, "gpu-blocks", cfg.Engine.GPUBlocks, "GPU KV capacity of each engine in blocks")
	fs.Float64Var(&cfg.TimeScale, "time-scale", cfg.TimeScale, "engine model seconds per wall second")
	fs.IntVar(&cfg.PortBase, "port-base", 0, "listen on fixed 127.0.0.1 ports from N on, NATS at N, then 4 per engine (its HTTP API, KV events, KV replay, its sidecar's gossip), then 2 per ingress (HTTP, gossip): 1+4×engines+2×ingresses ports (0 = free ephemeral ports; not with --autoscale). With --pd: 2 per engine, prefill engines first (HTTP API, NIXL side channel), then the ingress: 2×engines+1 ports")
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if err := demoFlagsRead(fs, *asf.on, *pdf.on); err != nil {
		return err
	}
	if *asf.on {
		return runDemoAutoscale(ctx, asf, *quiet, *verbose, stdout, stderr)
	}
	if *pdf.on {
		return runDemoPD(ctx, fs, cfg, pdf, *asJSON, *quiet, *verbose, stdout, stderr)
	}
	cfg.Policies = strings.Split(*policies, ",")
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if *verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if !*quiet {
		start := time.Now()
		cfg.Status = func(msg string) {
			fmt.Fprintf(stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), msg)
		}
		lines := map[string]func(loadgen.Progress){}
		cfg.Progress = func(policy string, p loadgen.Progress) {
			if lines[policy] == nil {
				lines[policy] = progressLine(stderr, policy+" ")
			}
			lines[policy](p)
		}
	}
	res, err := demo.Run(ctx, cfg)
	if res == nil || err != nil {
		// An interrupted or failed run has no comparison to show: a table
		// of a cancelled run's requests would read as a result.
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(res.Report); jerr != nil {
			return jerr
		}
	} else {
		fmt.Fprintf(stdout, "\nkvmesh demo: %d engines, %d ingresses, %d groups × %d prompts (%d shared + %d question tokens, %d output)\n\n",
			cfg.Engines, cfg.Ingresses, cfg.Workload.Groups, cfg.Workload.Prompts, cfg.Workload.Shared, cfg.Workload.Question, cfg.Workload.Output)
		if werr := res.WriteTable(stdout); werr != nil {
			return werr
		}
	}
	return err
}
