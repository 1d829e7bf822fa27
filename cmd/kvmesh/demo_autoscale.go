package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/demo"
)

type demoAutoscale struct {
	on       *bool
	duration *time.Duration
	peak     *float64
}

func demoAutoscaleFlags(fs *flag.FlagSet) demoAutoscale {
	return demoAutoscale{
		on:       fs.Bool("autoscale", false, "autoscaling demo: a P/D deployment run by kvmesh orchestrator --local under a load ramp (up, hold, down); prefill and decode scale within the ratio band"),
		duration: fs.Duration("duration", 75*time.Second, "with --autoscale: length of the ramp"),
		peak:     fs.Float64("peak-rate", 24, "with --autoscale: arrival rate at the hold, req/s"),
	}
}

// runDemoAutoscale is `kvmesh demo --autoscale`: a live view on stderr
// (one line redrawn on a terminal, plain lines otherwise), the summary on
// stdout; exit status 1 when the run did not show both roles scaling up
// and down within the band.
func runDemoAutoscale(ctx context.Context, f demoAutoscale, quiet, verbose bool, stdout, stderr io.Writer) error {
	cfg := demo.AutoscaleConfig{Duration: *f.duration, PeakRate: *f.peak}
	if verbose {
		cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
	}
	if !quiet {
		tty := isTerminal(stderr)
		phase := ""
		cfg.View = func(s demo.AutoscaleSample) {
			switch {
			case !tty:
				fmt.Fprintln(stderr, s.Line())
			case s.Phase != phase && phase != "":
				fmt.Fprintf(stderr, "\n%s", s.Line()) // keep the last line of each phase
			default:
				fmt.Fprintf(stderr, "\r\033[K%s", s.Line())
			}
			phase = s.Phase
		}
		defer func() {
			if tty {
				fmt.Fprintln(stderr)
			}
		}()
		fmt.Fprintf(stderr, "kvmesh demo --autoscale: P/D deployment (sim + sidecar processes, an ingress) under a %v ramp to %g req/s\n", cfg.Duration, cfg.PeakRate)
	}
	res, err := demo.RunAutoscale(ctx, cfg)
	if res == nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	if werr := res.WriteSummary(stdout); werr != nil {
		return werr
	}
	if err != nil {
		return err
	}
	return res.Check()
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
