// Package demo runs the whole kvmesh mesh in one process on loopback — an embedded
// NATS server, simulated engines (sim) each with its sidecar, and ingress
// replicas — and sends one shared-prefix workload through the ingresses once per
// routing policy (random, then kvmesh), resetting the engines' prefix caches between
// runs. Everything is measured at the client with loadtest/loadgen and reported in the
// shape `kvmesh bench --json` uses.
//
// It owns only the wiring and the run order: every component is the real package
// (no fakes), configured here for one machine, and everything it starts is stopped
// before Run returns.
package demo

import (
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/loadgen"
	"github.com/kvmesh/kvmesh/loadtest/workload"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("invalid demo config")

// Config configures a demo run.
type Config struct {
	// Engines is the number of simulated engines (each with a sidecar). Default 4.
	Engines int
	// Ingresses is the number of ingress replicas; the client spreads requests over
	// them round-robin, as a Service would. Default 2.
	Ingresses int
	// Model is the served model name. Default "kvmesh-sim".
	Model string
	// Workload is the shared-prefix workload. Default 32 groups × 16 prompts, 2,048
	// shared + 128 question tokens, 64 output tokens.
	Workload workload.SharedPrefix
	// Policies run in order. Default random, then kvmesh.
	Policies []string
	// Concurrency caps requests in flight at the client. Default 48.
	Concurrency int
	// Rate is the open-loop arrival rate (req/s); 0 = closed loop at Concurrency.
	Rate float64
	// Engine configures every simulated engine. Default: block size 16, 2,048 GPU
	// blocks (32k tokens: a quarter of the workload's prefixes plus working space, so
	// random routing evicts what it will need again), the 7b-h100 timing profile.
	Engine engine.Config
	// TimeScale runs the engines' model time faster than real time. Default 1.
	TimeScale float64
	// SpeculativeTTL is the ingresses' speculativeTTL in engine time (they
	// get it divided by TimeScale). 0: index.DefaultSpeculativeTTL, the
	// ingress's default.
	SpeculativeTTL time.Duration
	// Progress, when set, gets loadgen progress per policy run (from one goroutine).
	Progress func(policy string, p loadgen.Progress)
	// Status, when set, gets one line per phase ("starting 4 engines", ...).
	Status func(msg string)
	// Logger receives the components' logs. Default: discarded (the demo's output is
	// its table); pass a real logger to debug the wiring.
	Logger *slog.Logger
	// StartTimeout bounds waiting for the mesh to come up or settle. Default 30 s.
	StartTimeout time.Duration
	// PortBase puts every listener of the mesh on a fixed loopback port
	// from it on, as ports.go lays them out (MeshPorts(Engines,
	// Ingresses) of them); 0 (default) picks free ports.
	PortBase int
}

// DefaultConfig returns the demo of the issue: 4 engines, 2 ingresses, 32×16 prompts.
func DefaultConfig() Config {
	return Config{
		Engines: 4, Ingresses: 2, Model: "kvmesh-sim",
		Workload: workload.SharedPrefix{Groups: 32, Prompts: 16, Shared: 2048, Question: 128, Output: 64, Seed: 1},
		Policies: []string{"random", "kvmesh"}, Concurrency: 48,
		Engine:    engine.Config{BlockSize: 16, GPUBlocks: 2048},
		TimeScale: 1, StartTimeout: 30 * time.Second,
	}
}

func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Engines == 0 {
		c.Engines = d.Engines
	}
	if c.Ingresses == 0 {
		c.Ingresses = d.Ingresses
	}
	if c.Model == "" {
		c.Model = d.Model
	}
	if c.Workload == (workload.SharedPrefix{}) {
		c.Workload = d.Workload
	}
	if len(c.Policies) == 0 {
		c.Policies = d.Policies
	}
	if c.Concurrency == 0 {
		c.Concurrency = d.Concurrency
	}
	if c.Engine.BlockSize == 0 {
		c.Engine.BlockSize = d.Engine.BlockSize
	}
	if c.Engine.GPUBlocks == 0 {
		c.Engine.GPUBlocks = d.Engine.GPUBlocks
	}
	if c.TimeScale == 0 {
		c.TimeScale = d.TimeScale
	}
	if c.StartTimeout == 0 {
		c.StartTimeout = d.StartTimeout
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return c
}

// Validate lists every problem (after defaults).
func (c Config) Validate() error {
	var errs []error
	if c.Engines < 1 || c.Engines > 64 {
		errs = append(errs, fmt.Errorf("%w: engines %d not in [1, 64]", ErrConfig, c.Engines))
	}
	if c.Ingresses < 1 || c.Ingresses > 16 {
		errs = append(errs, fmt.Errorf("%w: ingresses %d not in [1, 16]", ErrConfig, c.Ingresses))
	}
	if err := c.Workload.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: workload: %w", ErrConfig, err))
	}
	if c.Concurrency < 1 {
		errs = append(errs, fmt.Errorf("%w: concurrency %d < 1", ErrConfig, c.Concurrency))
	}
	if c.Rate < 0 {
		errs = append(errs, fmt.Errorf("%w: rate %v < 0", ErrConfig, c.Rate))
	}
	if c.SpeculativeTTL < 0 {
		errs = append(errs, fmt.Errorf("%w: speculative TTL %v is negative", ErrConfig, c.SpeculativeTTL))
	}
	if c.TimeScale <= 0 {
		errs = append(errs, fmt.Errorf("%w: time scale %v <= 0", ErrConfig, c.TimeScale))
	}
	seen := map[string]bool{}
	for _, p := range c.Policies {
		if p == "" || seen[p] {
			errs = append(errs, fmt.Errorf("%w: policy %q empty or repeated", ErrConfig, p))
		}
		seen[p] = true
	}
	if err := CheckPortBase(c.PortBase, MeshPorts(c.Engines, c.Ingresses),
		fmt.Sprintf("NATS, %d engines with their sidecars and %d ingresses", c.Engines, c.Ingresses)); err != nil {
		errs = append(errs, fmt.Errorf("%w: %w", ErrConfig, err))
	}
	if err := c.Engine.Defaults().Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: engine: %w", ErrConfig, err))
	}
	return errors.Join(errs...)
}
