package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/demo"
	"github.com/kvmesh/kvmesh/loadtest/loadgen"
)

type demoPD struct {
	on              *bool
	prefill, decode *int
	modes           *string
}

func demoPDFlags(fs *flag.FlagSet) demoPD {
	return demoPD{
		on:      fs.Bool("pd", false, "P/D demo: prefill and decode simulators (vLLM NIXL protocol, real side channels) behind one ingress; aggregated vs P/D vs kvmesh's conditional P/D"),
		prefill: fs.Int("pd-prefill", 2, "with --pd: prefill engines"),
		decode:  fs.Int("pd-decode", 2, "with --pd: decode engines"),
		modes:   fs.String("pd-modes", strings.Join(demo.PDModes, ","), "with --pd: modes to compare, in order"),
	}
}

// runDemoPD is `kvmesh demo --pd`; the workload, concurrency, GPU-block and
// time-scale flags apply when given, otherwise the P/D demo's defaults.
func runDemoPD(ctx context.Context, fs *flag.FlagSet, base demo.Config, f demoPD, asJSON, quiet, verbose bool, stdout, stderr io.Writer) error {
	cfg := demo.PDConfig{Prefill: *f.prefill, Decode: *f.decode, Modes: strings.Split(*f.modes, ",")}
	if flagGiven(fs, "groups") || flagGiven(fs, "prompts") || flagGiven(fs, "shared") || flagGiven(fs, "question") || flagGiven(fs, "output") {
		cfg.Workload = base.Workload
	}
	if flagGiven(fs, "concurrency") {
		cfg.Concurrency = base.Concurrency
	}
	if flagGiven(fs, "gpu-blocks") {
		cfg.Engine.GPUBlocks = base.Engine.GPUBlocks
	}
	if flagGiven(fs, "time-scale") {
		cfg.TimeScale = base.TimeScale
	}
	cfg.PortBase = base.PortBase
	if verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if !quiet {
		start := time.Now()
		cfg.Status = func(msg string) { fmt.Fprintf(stderr, "[%5.1fs] %s\n", time.Since(start).Seconds(), msg) }
		lines := map[string]func(loadgen.Progress){}
		cfg.Progress = func(mode string, p loadgen.Progress) {
			if lines[mode] == nil {
				lines[mode] = progressLine(stderr, mode+" ")
			}
			lines[mode](p)
		}
	}
	res, err := demo.RunPD(ctx, cfg)
	if res == nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if jerr := enc.Encode(res.Report); jerr != nil {
			return jerr
		}
		return err
	}
	fmt.Fprintf(stdout, "\nkvmesh demo --pd: %d prefill + %d decode engines, one ingress\n\n", cfg.Prefill, cfg.Decode)
	if werr := res.WriteTable(stdout); werr != nil {
		return werr
	}
	return err
}
