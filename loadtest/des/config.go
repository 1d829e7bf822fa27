package des

import (
	"errors"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// ErrConfig wraps every configuration problem.
var ErrConfig = errors.New("des: invalid config")

// Config configures one benchmark run (every policy sees the same one).
type Config struct {
	// Engines is the number of simulated engines. Default 8.
	Engines int
	// Engine configures every engine (block size, GPU blocks, profile...).
	Engine engine.Config
	// Model is the model name in the key root. Default "kvmesh-bench".
	Model string
	// Scheduler is the base scheduler config; Run sets Policy per policy.
	Scheduler scheduler.Config
	// Concurrency caps requests in flight from the client (0 = no cap):
	// like `vllm bench serve --max-concurrency`, a request past the cap
	// waits client-side and its TTFT starts when it is sent.
	Concurrency int
	// EventDelay is how long KV events take to reach the router's index
	// (engine → sidecar → NATS → ingress). Default 0.
	EventDelay time.Duration
	// SnapshotInterval is how often the router's view of engine load
	// (running, waiting, KV usage, queued prefill) is refreshed: gossip
	// staleness. Default 200ms; negative means always fresh.
	SnapshotInterval time.Duration
	// Seed seeds the schedulers. Default 1.
	Seed uint64
	// Parallel runs policies on this many goroutines. Default GOMAXPROCS.
	Parallel int
	// ExactLookup makes the router's index read every key of a chain
	// (index.Config.ExactLookup) instead of searching it.
	ExactLookup bool
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Engines == 0 {
		c.Engines = 8
	}
	c.Engine = c.Engine.Defaults()
	if c.Model == "" {
		c.Model = "kvmesh-bench"
	}
	c.Scheduler.Defaults()
	if !c.Scheduler.HasParams("kvmesh") {
		// Encoding a struct of numbers cannot fail.
		_ = c.Scheduler.SetParams("kvmesh", KVMeshFromProfile(c.Engine.Profile))
	}
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 200 * time.Millisecond
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
}

// Validate lists every problem.
func (c *Config) Validate() error {
	var errs []error
	if c.Engines <= 0 || c.Engines > 4000 {
		errs = append(errs, fmt.Errorf("%w: engines %d outside 1..4000", ErrConfig, c.Engines))
	}
	if c.Concurrency < 0 {
		errs = append(errs, fmt.Errorf("%w: concurrency %d is negative", ErrConfig, c.Concurrency))
	}
	if c.EventDelay < 0 {
		errs = append(errs, fmt.Errorf("%w: event delay %v is negative", ErrConfig, c.EventDelay))
	}
	if c.Parallel < 0 {
		errs = append(errs, fmt.Errorf("%w: parallel %d is negative", ErrConfig, c.Parallel))
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: engine: %w", ErrConfig, err))
	}
	return errors.Join(errs...)
}

// KVMeshFromProfile derives the kvmesh policy's cost-model parameters from
// an engine timing profile, so the router's estimate has the simulator's
// shape and scale: prefill rate from FLOP/s, a step's fixed cost from the
// weight read and launch overhead, decode cost per context token from the
// KV read.
func KVMeshFromProfile(p engine.Profile) *policies.KVMeshConfig {
	d := policies.DefaultKVMeshConfig() // the weights; the rates come from the profile
	k := &d
	if p.Params > 0 && p.FLOPS > 0 {
		k.PrefillRate = p.FLOPS / (2 * p.Params)
	}
	if p.MemBW > 0 {
		k.StepBase = p.StepOverhead.Seconds() + p.WeightBytes/p.MemBW
		k.DecodeSecPerToken = p.KVBytesPerToken / p.MemBW
	}
	if k.PrefillRate <= 0 {
		k.PrefillRate = 30000
	}
	return k
}
