package demo

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/report"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/kvmesh/kvmesh/sim/simtest"
)

// PDModes are the P/D demo's modes: the same engines served aggregated
// (no P/D step: every engine takes whole requests), always disaggregated
// (kvmesh's pair choice, no bypass) and kvmesh's per-request decision.
var PDModes = []string{"aggregated", "pd", "kvmesh-pd"}

// PDConfig is `kvmesh demo --pd`: a P/D cluster of simulators speaking
// vLLM's NIXL protocol on loopback (real side channels) behind one ingress.
type PDConfig struct {
	// Prefill and Decode are the engine counts. Default 2 and 2.
	Prefill, Decode int
	Model           string
	// Workload default: 16 groups × 8 prompts of 3,072 shared + 1,024
	// question tokens, 128 output tokens (long prompts, where P/D matters).
	Workload    workload.SharedPrefix
	Modes       []string // default PDModes
	Concurrency int      // default 16
	Engine      engine.Config
	TimeScale   float64 // default 1
	// TransferGbps is the simulated side channel's bandwidth. Default 100.
	TransferGbps float64
	// PortBase, when > 0, puts every listener on a fixed 127.0.0.1 port
	// from it on: engine i (the prefill engines first) on PortBase+2i (its
	// HTTP API) and PortBase+2i+1 (its NIXL side channel), then the
	// ingress: PDPorts ports in all, reused by each mode's fresh cluster.
	// 0: free (ephemeral) ports.
	PortBase int
	Progress func(mode string, p loadgen.Progress)
	Status   func(msg string)
	Logger   *slog.Logger
}

func (c PDConfig) withDefaults() PDConfig {
	if c.Prefill == 0 {
		c.Prefill = 2
	}
	if c.Decode == 0 {
		c.Decode = 2
	}
	if c.Model == "" {
		c.Model = "kvmesh-sim"
	}
	if c.Workload.Groups == 0 {
		c.Workload = workload.SharedPrefix{Groups: 16, Prompts: 8, Shared: 3072, Question: 1024, Output: 128, Seed: 1}
	}
	if len(c.Modes) == 0 {
		c.Modes = PDModes
	}
	if c.Concurrency == 0 {
		c.Concurrency = 16
	}
	if c.Engine.GPUBlocks == 0 {
		c.Engine.GPUBlocks = 4096
	}
	if c.Engine.Profile.Name == "" {
		c.Engine.Profile, _ = engine.LookupProfile("7b-h100")
	}
	if c.TimeScale == 0 {
		c.TimeScale = 1
	}
	if c.TransferGbps == 0 {
		c.TransferGbps = 100
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// PDPorts is how many ports from PDConfig.PortBase on the P/D demo takes.
func PDPorts(prefill, decode int) int { return simtest.PDPorts(prefill+decode) + 1 }

// Validate lists every problem.
func (c PDConfig) Validate() error {
	var errs []error
	if err := CheckPortBase(c.PortBase, PDPorts(c.Prefill, c.Decode), "the P/D demo's engines and ingress"); err != nil {
		errs = append(errs, err)
	}
	if c.Prefill < 1 || c.Decode < 1 || c.Prefill+c.Decode > 16 {
		errs = append(errs, fmt.Errorf("prefill %d and decode %d: want ≥ 1 each, 16 in all at most", c.Prefill, c.Decode))
	}
	for _, m := range c.Modes {
		if !slices.Contains(PDModes, m) {
			errs = append(errs, fmt.Errorf("mode %q: want one of %v", m, PDModes))
		}
	}
	if c.Concurrency < 1 || c.TimeScale <= 0 || c.TransferGbps <= 0 {
		errs = append(errs, errors.New("concurrency, time scale and transfer bandwidth must be > 0"))
	}
	return errors.Join(errs...)
}

// RunPD runs the workload once per mode, each on a fresh P/D cluster (cold
// caches) behind a fresh ingress, and stops everything.
func RunPD(ctx context.Context, cfg PDConfig) (*Result, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo --pd: %w", err)
	}
	reqs, err := cfg.Workload.Generate()
	if err != nil {
		return nil, fmt.Errorf("demo --pd: workload: %w", err)
	}
	status := cfg.Status
	if status == nil {
		status = func(string) {}
	}
	start := time.Now()
	res := &Result{Report: report.Report{Policies: map[string]report.PolicyResult{}, Order: cfg.Modes,
		OracleHitRate: workload.OracleHitRate(reqs, cfg.Engine.Defaults().BlockSize)}, Runs: map[string]*loadgen.Report{}}
	for _, mode := range cfg.Modes {
		status(fmt.Sprintf("starting %d prefill + %d decode simulators (NIXL) and an ingress (%s)", cfg.Prefill, cfg.Decode, mode))
		rep, err := runPDMode(ctx, cfg, mode, reqs)
		if rep != nil {
			res.Runs[mode] = rep
			res.Report.Policies[mode] = rep.PolicyResult()
		}
		if err != nil {
			res.Wall = time.Since(start)
			return res, fmt.Errorf("demo --pd: %s: %w", mode, err)
		}
	}
	res.Wall = time.Since(start)
	return res, nil
}

// pdMembership lists the cluster's engines with their roles.
type pdMembership []ingress.EngineInfo

func (m pdMembership) Engines(dst []ingress.EngineInfo) []ingress.EngineInfo {
	return append(dst, m...)
}

func runPDMode(ctx context.Context, cfg PDConfig, mode string, reqs []workload.Request) (*loadgen.Report, error) {
	base := sim.Config{Model: cfg.Model, TimeScale: cfg.TimeScale, Seed: 1, Logger: cfg.Logger, Engine: cfg.Engine}
	base.PD.TransferGbps = cfg.TransferGbps
	cl, err := simtest.StartPD(ctx, simtest.PDOptions{Base: base, Prefill: cfg.Prefill, Decode: cfg.Decode, PortBase: cfg.PortBase})
	if err != nil {
		return nil, err
	}
	defer cl.Close()
	var m pdMembership
	var ids []string
	add := func(prefix string, role scheduler.Role, ss []*sim.Server) {
		for i, s := range ss {
			id := prefix + strconv.Itoa(i)
			ids = append(ids, id)
			m = append(m, ingress.EngineInfo{Engine: scheduler.Engine{ID: id, Model: cfg.Model, Healthy: true, Role: role}, URL: s.URL()})
		}
	}
	add("prefill-", scheduler.RolePrefill, cl.Prefill)
	add("decode-", scheduler.RoleDecode, cl.Decode)
	ic := ingress.DefaultConfig()
	ic.Listen = loopback(cfg.PortBase, simtest.PDPorts(cfg.Prefill+cfg.Decode))
	ic.Scheduler.Policy = "kvmesh"
	ic.Learn.Prior = wallPrior(cfg.TimeScale)
	ic.PD.TransferGbps = cfg.TransferGbps
	switch mode {
	case "pd":
		ic.PD.Policy = "kvmesh-always"
	case "kvmesh-pd":
		ic.PD.Policy = "kvmesh"
	}
	srv, err := ingress.New(ic, ingress.Deps{Logger: cfg.Logger, AccessLog: cfg.Logger, Membership: m})
	if err != nil {
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		return nil, err
	}
	defer srv.Close()
	lc := loadgen.DefaultConfig()
	lc.URLs = []string{"http://" + srv.Addr()}
	lc.Model = cfg.Model
	lc.Concurrency = cfg.Concurrency
	lc.Rate = -1
	lc.Seed = cfg.Workload.Seed
	lc.Timeout = 2 * time.Minute
	lc.StrictSSE = true // kvmesh's own ingresses: a framing regression fails the run
	if cfg.Progress != nil {
		lc.Progress = func(p loadgen.Progress) { cfg.Progress(mode, p) }
	}
	rep, err := loadgen.Run(ctx, lc, reqs)
	if rep != nil {
		rep.CountEngines(ids)
	}
	if err == nil && rep.Failed > 0 {
		err = fmt.Errorf("%d of %d requests failed: %v", rep.Failed, rep.Sent, rep.Errors)
	}
	return rep, err
}
