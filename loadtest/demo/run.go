package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/report"

	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// Result is a demo's outcome.
type Result struct {
	// Report has the shape `kvmesh bench --json` prints, measured at the client.
	Report report.Report
	// Runs are the full client-side reports per policy.
	Runs map[string]*loadgen.Report
	// Wall is the whole demo's duration, start-up and shutdown included.
	Wall time.Duration
}

// Run starts the mesh, runs the workload once per policy and stops everything.
func Run(ctx context.Context, cfg Config) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	reqs, err := cfg.Workload.Generate()
	if err != nil {
		return nil, fmt.Errorf("demo: workload: %w", err)
	}
	status := cfg.Status
	if status == nil {
		status = func(string) {}
	}
	start := time.Now()
	res := &Result{
		Report: report.Report{Policies: map[string]report.PolicyResult{}, Order: cfg.Policies,
			OracleHitRate: workload.OracleHitRate(reqs, cfg.Engine.BlockSize)},
		Runs: map[string]*loadgen.Report{},
	}
	m := &mesh{cfg: cfg}
	runErr := func() error {
		ports := ""
		if cfg.PortBase != 0 {
			ports = fmt.Sprintf(" on 127.0.0.1 ports %d..%d (ingresses last)", cfg.PortBase, cfg.PortBase+MeshPorts(cfg.Engines, cfg.Ingresses)-1)
		}
		status(fmt.Sprintf("starting embedded NATS and %d simulated engines with their sidecars%s", cfg.Engines, ports))
		if err := m.startEngines(ctx); err != nil {
			return err
		}
		for i, policy := range cfg.Policies {
			if i > 0 {
				status("resetting the engines' prefix caches")
				if err := m.resetCaches(ctx); err != nil {
					return err
				}
			}
			status(fmt.Sprintf("starting %d ingress replicas with policy %q", cfg.Ingresses, policy))
			if err := m.startIngresses(ctx, policy, i); err != nil {
				return err
			}
			status(fmt.Sprintf("sending %d requests through the ingresses (%s)", len(reqs), policy))
			rep, err := m.load(ctx, policy, reqs)
			if rep != nil {
				rep.CountEngines(m.engineIDs)
				res.Runs[policy] = rep
				res.Report.Policies[policy] = rep.PolicyResult()
			}
			if err != nil {
				return err
			}
			if err := m.stopIngresses(); err != nil {
				return fmt.Errorf("stop ingresses: %w", err)
			}
		}
		return nil
	}()
	status("stopping")
	stopErr := m.stop()
	res.Wall = time.Since(start)
	if err := errors.Join(runErr, stopErr); err != nil {
		return res, fmt.Errorf("demo: %w", err)
	}
	return res, nil
}

// load sends the workload through the ingresses (round-robin, like a Service).
func (m *mesh) load(ctx context.Context, policy string, reqs []workload.Request) (*loadgen.Report, error) {
	lc := loadgen.DefaultConfig()
	lc.URLs = m.ingressURLs()
	lc.Model = m.cfg.Model
	lc.Concurrency = m.cfg.Concurrency
	lc.Rate = m.cfg.Rate
	if lc.Rate == 0 {
		lc.Rate = -1 // closed loop
	}
	lc.Seed = m.cfg.Workload.Seed
	lc.SessionHeader = "X-Session-ID"
	lc.Timeout = 2 * time.Minute
	lc.StrictSSE = true // kvmesh's own ingresses: a framing regression fails the run
	if m.cfg.Progress != nil {
		lc.Progress = func(p loadgen.Progress) { m.cfg.Progress(policy, p) }
	}
	rep, err := loadgen.Run(ctx, lc, reqs)
	if err != nil {
		return rep, fmt.Errorf("%s run: %w", policy, err)
	}
	if rep.Failed > 0 {
		return rep, fmt.Errorf("%s run: %d of %d requests failed: %s", policy, rep.Failed, rep.Sent, rep.FailureSummary())
	}
	return rep, nil
}

// WriteTable writes the results table, one line per policy.
func (r *Result) WriteTable(w io.Writer) error {
	var b strings.Builder
	w0 := len("policy") // the first column is as wide as its longest name ("aggregated", "kvmesh-pd")
	for _, p := range r.Report.Order {
		w0 = max(w0, len(p))
	}
	fmt.Fprintf(&b, "%-*s %10s %10s %10s %10s %10s %9s %9s\n", w0, "policy", "req/s", "TTFT p50", "TTFT p99", "TTFT mean", "E2E mean", "hit rate", "imbalance")
	for _, p := range r.Report.Order {
		pr, ok := r.Report.Policies[p]
		if !ok {
			continue
		}
		fmt.Fprintf(&b, "%-*s %10.2f %10s %10s %10s %10s %8.1f%% %9.2f\n", w0, p, pr.ThroughputRPS,
			ms(pr.TTFTP50), ms(pr.TTFTP99), ms(pr.TTFTMean), ms(pr.E2EMean), 100*pr.PrefixHitRate, pr.LoadImbalance)
	}
	fmt.Fprintf(&b, "oracle hit rate (one infinite shared cache): %.1f%%; measured at the client; wall %s\n",
		100*r.Report.OracleHitRate, r.Wall.Round(100*time.Millisecond))
	if rnd, ok := r.Report.Policies["random"]; ok {
		if kv, ok := r.Report.Policies["kvmesh"]; ok && kv.TTFTP50 > 0 {
			fmt.Fprintf(&b, "kvmesh vs random: TTFT p50 %s, p99 %s, hit rate %+.1f points, throughput %.2f×\n",
				lowerOrHigher(kv.TTFTP50, rnd.TTFTP50), lowerOrHigher(kv.TTFTP99, rnd.TTFTP99), 100*(kv.PrefixHitRate-rnd.PrefixHitRate),
				kv.ThroughputRPS/max(rnd.ThroughputRPS, 1e-9))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// lowerOrHigher says how x compares with ref: "3.2× lower" or "1.3× higher".
func lowerOrHigher(x, ref float64) string {
	if x <= ref {
		return fmt.Sprintf("%.1f× lower", ref/max(x, 1e-9))
	}
	return fmt.Sprintf("%.1f× higher", x/max(ref, 1e-9))
}

func ms(s float64) string { return fmt.Sprintf("%.0fms", s*1000) }
