package des

import (
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
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
	// SpeculativeTTL is how long a routed request's keys count as cached
	// on its engine before its KV events confirm them
	// (index.Config.SpeculativeTTL). Default index.DefaultSpeculativeTTL,
	// what the ingress ships (ingress.Config.SpeculativeTTL).
	SpeculativeTTL time.Duration
	// Learn configures the kvmesh policy's online cost model. Its prior
	// defaults to the kvmesh block's rates (else policies.DefaultKVMeshConfig:
	// what a live ingress starts from); the
	// engines' timing profile is never given to a router.
	Learn learn.Config
	// FixedCosts turns the learner off: kvmesh prices with the kvmesh
	// config's rates as given (for ablations; no headline number uses it).
	FixedCosts bool
	// Progress, when set, gets a plain line per running policy every
	// ProgressEvery of wall time (0: DefaultProgressEvery): the virtual time
	// reached, the arrivals' span and the requests done (progress.go). It
	// changes no result.
	Progress      io.Writer
	ProgressEvery time.Duration
	// progressClock is the wall clock progress reads (nil: time.Now); tests
	// step it.
	progressClock func() time.Time
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
	if c.SnapshotInterval == 0 {
		c.SnapshotInterval = 200 * time.Millisecond
	}
	if c.SpeculativeTTL == 0 {
		c.SpeculativeTTL = index.DefaultSpeculativeTTL
	}
	if c.Seed == 0 {
		c.Seed = 1
	}
	if c.Learn.Prior == (learn.Rates{}) {
		k := policies.NewKVMesh()
		sc := c.Scheduler
		sc.Policy = "kvmesh"
		if p, err := registry.Policy(&sc); err == nil { // an invalid block is reported by Run
			if kp, ok := p.(policies.KVMesh); ok {
				k = kp
			}
		}
		c.Learn.Prior = learn.Rates{PrefillRate: k.PrefillRate, StepBase: k.StepBase, DecodeSecPerToken: k.DecodeSecPerToken}
	}
	c.Learn.Defaults()
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
	if c.SpeculativeTTL < 0 {
		errs = append(errs, fmt.Errorf("%w: speculative TTL %v is negative", ErrConfig, c.SpeculativeTTL))
	}
	if c.Parallel < 0 {
		errs = append(errs, fmt.Errorf("%w: parallel %d is negative", ErrConfig, c.Parallel))
	}
	if err := c.Learn.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: learn: %w", ErrConfig, err))
	}
	if err := c.Engine.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("%w: engine: %w", ErrConfig, err))
	}
	return errors.Join(errs...)
}
