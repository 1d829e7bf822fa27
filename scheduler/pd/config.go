package pd

import (
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// LearnConfig is c as the learner behind a P/D step must be configured:
// unpooled (learn.Config.Unpooled) and with a free prefill intercept
// (learn.Config.FreeIntercept). Prefill and decode engines play different
// parts — a prefill engine's time to first token is not a decode engine's
// line — and pooling across them, or per role, was measured mixed for this
// step, as was the intercept prior at the decode step's cost (long-prompt
// knee, seed 1: 4.63 → 4.43 req/s; docs/BENCHMARKS.md, "Cross-validation
// (unseen traffic)"). The ingress with a P/D policy and the DES's P/D
// benchmark both build their learner through it.
func LearnConfig(c learn.Config) learn.Config {
	c.Unpooled = true
	c.FreeIntercept = true
	return c
}

// Names are the P/D policies New knows: kvmesh's choice, kvmesh's pair
// choice without the aggregated bypass, and the emulations.
var Names = []string{"kvmesh", "kvmesh-always", "kthena", "llmd", "dynamo", "sglang", "aibrix"}

// Config configures the P/D step.
type Config struct {
	// Policy is one of Names. Default "kvmesh".
	Policy string
	// Cost is kvmesh's cost model (policies.KVMeshConfig); nil: defaults.
	Cost *policies.KVMeshConfig
	// KVBytesPerToken is the KV size of a prompt token; 0: 131,072.
	KVBytesPerToken float64
	// TransferGbps is prefill → decode bandwidth in Gbit/s; 0: 100.
	TransferGbps float64
	// TransferSetup is a transfer's fixed cost in seconds; 0: 0.002
	// (negative: none).
	TransferSetup float64
	// SLOTTFT is the TTFT objective kvmesh's choice prices (seconds; 0:
	// none). SLOWeight scales the price of a missed SLO (0: 1).
	SLOTTFT, SLOWeight float64
	// SLOTPOT is the time-per-output-token objective kvmesh's choice
	// prices (seconds; 0: none).
	SLOTPOT float64
	// Costs, when set, is the cost model's per-engine rates (the ingress's
	// or the benchmark's online learner, scheduler/learn); nil: Cost's.
	Costs policies.CostModel
	// NonCachedTokens is llm-d's decider threshold; 0: 16.
	NonCachedTokens int
	// MixedPrefill lets kvmesh's choice send prefill legs to mixed-role
	// engines too (KVMesh.MixedPrefill; the engines must accept both legs,
	// vLLM's kv_role "kv_both"). The emulations ignore it.
	MixedPrefill bool
	// Outputs, when set, is the output-length distribution kvmesh's
	// choice prices the running streams' TPOT risk over (KVMesh.Outputs).
	Outputs *OutputDist
}

// Defaults fills unset fields.
func (c *Config) Defaults() {
	if c.Policy == "" {
		c.Policy = "kvmesh"
	}
	if c.Cost == nil {
		d := policies.DefaultKVMeshConfig()
		c.Cost = &d
	}
	if c.KVBytesPerToken == 0 {
		c.KVBytesPerToken = 131072
	}
	if c.TransferGbps == 0 {
		c.TransferGbps = 100
	}
	if c.TransferSetup == 0 {
		c.TransferSetup = 0.002
	}
	if c.NonCachedTokens == 0 {
		c.NonCachedTokens = 16
	}
}

// Validate lists every problem (call Defaults first).
func (c *Config) Validate() error {
	var errs []error
	if !slices.Contains(Names, c.Policy) {
		errs = append(errs, fmt.Errorf("policy %q: want one of %v", c.Policy, Names))
	}
	bad := func(v float64) bool { return math.IsNaN(v) || math.IsInf(v, 0) }
	if bad(c.KVBytesPerToken) || c.KVBytesPerToken < 0 {
		errs = append(errs, fmt.Errorf("kvBytesPerToken %v: want a finite value ≥ 0", c.KVBytesPerToken))
	}
	if bad(c.TransferGbps) || c.TransferGbps <= 0 {
		errs = append(errs, fmt.Errorf("transferGbps %v: want a finite value > 0", c.TransferGbps))
	}
	if bad(c.TransferSetup) {
		errs = append(errs, fmt.Errorf("transferSetup %v: want a finite value", c.TransferSetup))
	}
	if c.NonCachedTokens < 0 {
		errs = append(errs, fmt.Errorf("nonCachedTokens %d: want ≥ 0", c.NonCachedTokens))
	}
	if len(errs) == 0 {
		return nil
	}
	return fmt.Errorf("pd config: %w: %w", scheduler.ErrConfig, errors.Join(errs...))
}

// New builds the configured policy (Defaults and Validate included).
func New(c Config) (Policy, error) {
	c.Defaults()
	if err := c.Validate(); err != nil {
		return nil, err
	}
	switch c.Policy {
	case "kvmesh", "kvmesh-always":
		k := NewKVMesh(policies.KVMeshFrom(*c.Cost))
		k.KVBytesPerToken, k.TransferBandwidth = c.KVBytesPerToken, c.TransferGbps*1e9/8
		k.TransferSetup = max(c.TransferSetup, 0)
		k.Always = c.Policy == "kvmesh-always"
		k.MixedPrefill, k.Outputs = c.MixedPrefill, c.Outputs
		k.SLOTTFT, k.SLOTPOT = c.SLOTTFT, c.SLOTPOT
		k.Cost.Costs = c.Costs
		if c.SLOWeight > 0 {
			k.SLOWeight = c.SLOWeight
		}
		if err := k.Validate(); err != nil {
			return nil, err
		}
		if k.Always {
			return always{k}, nil
		}
		return k, nil
	case "kthena":
		return NewKthena(), nil
	case "llmd":
		l := NewLLMD()
		l.NonCachedTokens = c.NonCachedTokens
		return l, nil
	case "dynamo":
		return NewDynamo(), nil
	case "sglang":
		return NewSGLang(), nil
	default: // "aibrix"; Validate rejected the rest
		return AIBrix{}, nil
	}
}

// always is KVMesh with Always set, under its own name.
type always struct{ KVMesh }

func (always) Name() string { return "kvmesh-always" }

// CostFrom is the kvmesh cost model a scheduler config carries (its kvmesh
// block, or the defaults), so the P/D step prices with the same numbers as
// the aggregated policy.
func CostFrom(sc scheduler.Config) (*policies.KVMeshConfig, error) {
	d := policies.DefaultKVMeshConfig()
	n, ok := sc.Params["kvmesh"]
	if !ok {
		return &d, nil
	}
	k, err := scheduler.ParseParams("kvmesh", &n, d)
	if err != nil {
		return nil, err
	}
	return &k, nil
}
