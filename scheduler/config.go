package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// APIVersion and Kind identify a scheduler config file.
const (
	APIVersion = "kvmesh.io/v1alpha1"
	Kind       = "SchedulerConfig"
)

// PolicyNames lists every policy the registry builds, in display order.
var PolicyNames = []string{"random", "round-robin", "least-request", "kthena", "ray", "sglang", "dynamo", "llmd", "kvmesh", "weighted"}

// ScorerNames lists every scorer a "weighted" policy may use.
var ScorerNames = []string{"prefix", "load", "queue", "kv-usage", "latency", "lora-affinity", "session-affinity"}

// Config is the SchedulerConfig file: which policy, its parameters, the
// filters and tier weights. Zero values mean "default" (see Defaults).
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Policy is one of PolicyNames. Default "kvmesh".
	Policy string `yaml:"policy"`
	// Seed seeds the random tie-breaks and the random policy (0 is a valid
	// seed; runs are deterministic for a given seed and request order).
	Seed uint64 `yaml:"seed"`
	// TierWeights weigh matched blocks by tier. Default GPU 1, CPU 0.8,
	// other 0.5, speculative 0.9.
	TierWeights *TierWeightsConfig `yaml:"tierWeights"`
	Filters     FiltersConfig      `yaml:"filters"`
	// Weighted configures policy "weighted": scorer names and weights.
	Weighted []ScorerConfig `yaml:"weighted"`
	// Per-policy parameters; nil means the policy's published defaults.
	KVMesh *KVMeshConfig `yaml:"kvmesh"`
	Kthena *KthenaConfig `yaml:"kthena"`
	SGLang *SGLangConfig `yaml:"sglang"`
	Ray    *RayConfig    `yaml:"ray"`
	Dynamo *DynamoConfig `yaml:"dynamo"`
}

// TierWeightsConfig is TierWeights in the file.
type TierWeightsConfig struct {
	GPU         float64 `yaml:"gpu"`
	CPU         float64 `yaml:"cpu"`
	Other       float64 `yaml:"other"`
	Speculative float64 `yaml:"speculative"`
}

// FiltersConfig configures the filters (health, model and role always run).
type FiltersConfig struct {
	// MaxWaiting drops engines with more waiting requests; 0 disables.
	MaxWaiting int `yaml:"maxWaiting"`
	// StrictLoRA keeps only engines with the request's adapter loaded.
	StrictLoRA bool `yaml:"strictLoRA"`
}

// ScorerConfig is one scorer of a weighted policy.
type ScorerConfig struct {
	Name   string  `yaml:"name"`
	Weight float64 `yaml:"weight"`
}

// KVMeshConfig are the kvmesh policy's cost-model parameters.
type KVMeshConfig struct {
	PrefillRate         float64 `yaml:"prefillRate"`
	StepBase            float64 `yaml:"stepBase"`
	DecodeSecPerToken   float64 `yaml:"decodeSecPerToken"`
	DecodeWeight        float64 `yaml:"decodeWeight"`
	DefaultOutputTokens int     `yaml:"defaultOutputTokens"`
	ExternalityWeight   float64 `yaml:"externalityWeight"`
	MissPenalty         float64 `yaml:"missPenalty"`
}

// KthenaConfig are the kthena emulation's plugin weights.
type KthenaConfig struct {
	LeastRequestWeight float64 `yaml:"leastRequestWeight"`
	KVCacheWeight      float64 `yaml:"kvCacheWeight"`
}

// SGLangConfig are sgl-router cache_aware's thresholds.
type SGLangConfig struct {
	CacheThreshold      float64 `yaml:"cacheThreshold"`
	BalanceAbsThreshold float64 `yaml:"balanceAbsThreshold"`
	BalanceRelThreshold float64 `yaml:"balanceRelThreshold"`
}

// RayConfig are PrefixCacheAffinityRouter's thresholds.
type RayConfig struct {
	ImbalancedThreshold float64 `yaml:"imbalancedThreshold"`
	MatchRateThreshold  float64 `yaml:"matchRateThreshold"`
}

// DynamoConfig is the Dynamo KV router's overlap weight.
type DynamoConfig struct {
	OverlapWeight float64 `yaml:"overlapWeight"`
}

// DefaultConfig is the configuration used when no file is given.
func DefaultConfig() Config {
	var c Config
	c.Defaults()
	return c
}

// Defaults fills unset fields. Per-policy blocks stay nil (the registry
// uses the published defaults for a nil block).
func (c *Config) Defaults() {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
	}
	if c.Policy == "" {
		c.Policy = "kvmesh"
	}
	if c.TierWeights == nil {
		w := DefaultTierWeights()
		c.TierWeights = &TierWeightsConfig{GPU: w.GPU, CPU: w.CPU, Other: w.Other, Speculative: w.Speculative}
	}
}

// Weights returns the tier weights (defaults when unset).
func (c *Config) Weights() TierWeights {
	if c.TierWeights == nil {
		return DefaultTierWeights()
	}
	t := c.TierWeights
	return TierWeights{GPU: t.GPU, CPU: t.CPU, Other: t.Other, Speculative: t.Speculative}
}

// Validate lists every problem with c, joined, each wrapping ErrConfig.
func (c *Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
	}
	if c.APIVersion != APIVersion {
		bad("apiVersion %q, want %q", c.APIVersion, APIVersion)
	}
	if c.Kind != Kind {
		bad("kind %q, want %q", c.Kind, Kind)
	}
	if !contains(PolicyNames, c.Policy) {
		bad("policy %q unknown (one of %v)", c.Policy, PolicyNames)
	}
	if t := c.TierWeights; t != nil {
		for name, v := range map[string]float64{"gpu": t.GPU, "cpu": t.CPU, "other": t.Other, "speculative": t.Speculative} {
			if v < 0 || v > 1 {
				bad("tierWeights.%s %v outside [0,1]", name, v)
			}
		}
	}
	if c.Filters.MaxWaiting < 0 {
		bad("filters.maxWaiting %d is negative", c.Filters.MaxWaiting)
	}
	if c.Policy == "weighted" && len(c.Weighted) == 0 {
		bad("policy weighted needs at least one scorer under weighted:")
	}
	for i, s := range c.Weighted {
		if !contains(ScorerNames, s.Name) {
			bad("weighted[%d].name %q unknown (one of %v)", i, s.Name, ScorerNames)
		}
		if s.Weight < 0 {
			bad("weighted[%d].weight %v is negative", i, s.Weight)
		}
	}
	if k := c.KVMesh; k != nil {
		if k.PrefillRate <= 0 {
			bad("kvmesh.prefillRate %v must be > 0", k.PrefillRate)
		}
		if k.StepBase < 0 || k.DecodeSecPerToken < 0 || k.DecodeWeight < 0 || k.DefaultOutputTokens < 0 || k.ExternalityWeight < 0 || k.MissPenalty < 0 {
			bad("kvmesh: stepBase, decodeSecPerToken, decodeWeight, defaultOutputTokens, externalityWeight, missPenalty must be ≥ 0")
		}
	}
	if k := c.Kthena; k != nil && (k.LeastRequestWeight < 0 || k.KVCacheWeight < 0) {
		bad("kthena weights must be ≥ 0")
	}
	if s := c.SGLang; s != nil {
		if s.CacheThreshold < 0 || s.CacheThreshold > 1 {
			bad("sglang.cacheThreshold %v outside [0,1]", s.CacheThreshold)
		}
		if s.BalanceAbsThreshold < 0 || s.BalanceRelThreshold < 1 {
			bad("sglang: balanceAbsThreshold must be ≥ 0 and balanceRelThreshold ≥ 1")
		}
	}
	if r := c.Ray; r != nil {
		if r.ImbalancedThreshold < 0 || r.MatchRateThreshold < 0 || r.MatchRateThreshold > 1 {
			bad("ray: imbalancedThreshold must be ≥ 0 and matchRateThreshold in [0,1]")
		}
	}
	if d := c.Dynamo; d != nil && d.OverlapWeight < 0 {
		bad("dynamo.overlapWeight %v is negative", d.OverlapWeight)
	}
	return errors.Join(errs...)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ParseConfig decodes a SchedulerConfig strictly (unknown fields are
// errors), applies defaults and validates it.
func ParseConfig(data []byte) (Config, error) {
	var c Config
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&c); err != nil && !errors.Is(err, io.EOF) {
		return Config{}, fmt.Errorf("decode scheduler config: %w: %w", ErrConfig, err)
	}
	c.Defaults()
	if err := c.Validate(); err != nil {
		return Config{}, fmt.Errorf("validate scheduler config: %w", err)
	}
	return c, nil
}

// LoadConfig reads and parses a SchedulerConfig file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read scheduler config: %w", err)
	}
	return ParseConfig(b)
}
