package scheduler

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"slices"

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
// filters and tier weights.
//
// Defaults. In a YAML file every block (tierWeights, kvmesh, kthena,
// sglang, ray, dynamo, llmd) is decoded onto its published defaults (the
// Default*Config functions): a field the block omits keeps its default and
// a field it gives is kept as given, an explicit 0 included. A block that is
// omitted (or null) stays nil and means the policy's published defaults;
// Defaults then fills Policy and TierWeights. In Go the fields are taken
// literally: a block built in code is used as it is, so start from its
// Default*Config to change one field. A file must name its apiVersion and
// kind (ParseConfig); Defaults fills them for a Config built in code.
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
	// Weighted configures policy "weighted": scorer names and weights
	// (each weight > 0).
	Weighted []ScorerConfig `yaml:"weighted"`
	// Per-policy parameters; nil means the policy's published defaults.
	KVMesh *KVMeshConfig `yaml:"kvmesh"`
	Kthena *KthenaConfig `yaml:"kthena"`
	SGLang *SGLangConfig `yaml:"sglang"`
	Ray    *RayConfig    `yaml:"ray"`
	Dynamo *DynamoConfig `yaml:"dynamo"`
	LLMD   *LLMDConfig   `yaml:"llmd"`
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

// KVMeshConfig are the kvmesh policy's cost-model parameters; policies.KVMesh
// documents each (its field of the same name) and the cost they weigh.
type KVMeshConfig struct {
	PrefillRate         float64 `yaml:"prefillRate"`
	StepBase            float64 `yaml:"stepBase"`
	DecodeSecPerToken   float64 `yaml:"decodeSecPerToken"`
	DecodeWeight        float64 `yaml:"decodeWeight"`
	DefaultOutputTokens int     `yaml:"defaultOutputTokens"`
	ExternalityWeight   float64 `yaml:"externalityWeight"`
	MissPenalty         float64 `yaml:"missPenalty"`
	WaitingWeight       float64 `yaml:"waitingWeight"`
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

// LLMDConfig are the llm-d emulation's scorer weights (queue-scorer,
// kv-cache-utilization-scorer, prefix-cache-scorer).
type LLMDConfig struct {
	QueueWeight         float64 `yaml:"queueWeight"`
	KVUtilizationWeight float64 `yaml:"kvUtilizationWeight"`
	PrefixWeight        float64 `yaml:"prefixWeight"`
}

// DefaultTierWeightsConfig is DefaultTierWeights as a config block.
func DefaultTierWeightsConfig() TierWeightsConfig {
	w := DefaultTierWeights()
	return TierWeightsConfig{GPU: w.GPU, CPU: w.CPU, Other: w.Other, Speculative: w.Speculative}
}

// DefaultKVMeshConfig is the kvmesh policy's default cost model (a 7B model
// on an H100; policies.NewKVMesh builds from it).
func DefaultKVMeshConfig() KVMeshConfig {
	return KVMeshConfig{PrefillRate: 30000, StepBase: 0.007, DecodeSecPerToken: 1.9e-7, DecodeWeight: 0.15,
		DefaultOutputTokens: 128, ExternalityWeight: 1, MissPenalty: 1, WaitingWeight: 2}
}

// DefaultKthenaConfig is Kthena's published default (policies.NewKthena).
func DefaultKthenaConfig() KthenaConfig {
	return KthenaConfig{LeastRequestWeight: 1, KVCacheWeight: 1}
}

// DefaultSGLangConfig is sgl-router's published default (policies.NewSGLang).
func DefaultSGLangConfig() SGLangConfig {
	return SGLangConfig{CacheThreshold: 0.5, BalanceAbsThreshold: 32, BalanceRelThreshold: 1.1}
}

// DefaultRayConfig is Ray Serve's published default (policies.NewRay).
func DefaultRayConfig() RayConfig {
	return RayConfig{ImbalancedThreshold: 10, MatchRateThreshold: 0.1}
}

// DefaultDynamoConfig is Dynamo's published default (policies.NewDynamo).
func DefaultDynamoConfig() DynamoConfig {
	return DynamoConfig{OverlapWeight: 1}
}

// DefaultLLMDConfig is llm-d's documented default profile (policies.LLMD):
// queue 2, kv-cache utilization 2, prefix cache 3.
func DefaultLLMDConfig() LLMDConfig {
	return LLMDConfig{QueueWeight: 2, KVUtilizationWeight: 2, PrefixWeight: 3}
}

// The UnmarshalYAML methods below decode a block onto its defaults. Each
// declares a local type with the block's name (so strict-decoding errors
// still read "not found in type scheduler.KthenaConfig") but without its
// methods (so decoding does not recurse). They use yaml's func-style
// Unmarshaler because it decodes with the caller's decoder, keeping
// KnownFields; a *yaml.Node's Decode would not. The block is kept even when
// decoding reports an error, so that validation sees what was given.

// UnmarshalYAML decodes tierWeights onto DefaultTierWeightsConfig.
func (t *TierWeightsConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = TierWeightsConfig
	type TierWeightsConfig fields
	v := TierWeightsConfig(DefaultTierWeightsConfig())
	err := unmarshal(&v)
	*t = fields(v)
	return err
}

// UnmarshalYAML decodes kvmesh onto DefaultKVMeshConfig.
func (k *KVMeshConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = KVMeshConfig
	type KVMeshConfig fields
	v := KVMeshConfig(DefaultKVMeshConfig())
	err := unmarshal(&v)
	*k = fields(v)
	return err
}

// UnmarshalYAML decodes kthena onto DefaultKthenaConfig.
func (k *KthenaConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = KthenaConfig
	type KthenaConfig fields
	v := KthenaConfig(DefaultKthenaConfig())
	err := unmarshal(&v)
	*k = fields(v)
	return err
}

// UnmarshalYAML decodes sglang onto DefaultSGLangConfig.
func (s *SGLangConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = SGLangConfig
	type SGLangConfig fields
	v := SGLangConfig(DefaultSGLangConfig())
	err := unmarshal(&v)
	*s = fields(v)
	return err
}

// UnmarshalYAML decodes ray onto DefaultRayConfig.
func (r *RayConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = RayConfig
	type RayConfig fields
	v := RayConfig(DefaultRayConfig())
	err := unmarshal(&v)
	*r = fields(v)
	return err
}

// UnmarshalYAML decodes dynamo onto DefaultDynamoConfig.
func (d *DynamoConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = DynamoConfig
	type DynamoConfig fields
	v := DynamoConfig(DefaultDynamoConfig())
	err := unmarshal(&v)
	*d = fields(v)
	return err
}

// UnmarshalYAML decodes llmd onto DefaultLLMDConfig.
func (l *LLMDConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = LLMDConfig
	type LLMDConfig fields
	v := LLMDConfig(DefaultLLMDConfig())
	err := unmarshal(&v)
	*l = fields(v)
	return err
}

// DefaultConfig is the configuration used when no file is given.
func DefaultConfig() Config {
	var c Config
	c.Defaults()
	return c
}

// Defaults fills unset fields: apiVersion, kind, policy and tier weights.
// Per-policy blocks stay nil (the registry uses the published defaults for
// a nil block); a block's own fields are defaulted when it is decoded.
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
		w := DefaultTierWeightsConfig()
		c.TierWeights = &w
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

// Validate lists every problem with c, joined in a stable order, each
// wrapping ErrConfig.
func (c *Config) Validate() error {
	return errors.Join(c.problems()...)
}

// checker collects problems, each wrapping ErrConfig.
type checker struct{ errs []error }

func (k *checker) bad(format string, a ...any) {
	k.errs = append(k.errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, a...)...))
}

// finite reports a NaN or infinite v at path and says whether v is finite;
// the range checks below run only on finite values.
func (k *checker) finite(path string, v float64) bool {
	switch {
	case math.IsNaN(v):
		k.bad("%s: NaN is not a number", path)
	case math.IsInf(v, 0):
		k.bad("%s: %v is not a finite number", path, v)
	default:
		return true
	}
	return false
}

// nonNegative checks that v is finite and ≥ 0.
func (k *checker) nonNegative(path string, v float64) {
	if k.finite(path, v) && v < 0 {
		k.bad("%s: %v is negative", path, v)
	}
}

// positive checks that v is finite and > 0.
func (k *checker) positive(path string, v float64) {
	if k.finite(path, v) && v <= 0 {
		k.bad("%s: %v must be > 0", path, v)
	}
}

// within checks that v is finite and in [lo, hi].
func (k *checker) within(path string, v, lo, hi float64) {
	if k.finite(path, v) && (v < lo || v > hi) {
		k.bad("%s: %v is outside [%v,%v]", path, v, lo, hi)
	}
}

// atLeast checks that v is finite and ≥ lo.
func (k *checker) atLeast(path string, v, lo float64) {
	if k.finite(path, v) && v < lo {
		k.bad("%s: %v must be ≥ %v", path, v, lo)
	}
}

func (c *Config) problems() []error {
	var k checker
	switch c.APIVersion {
	case APIVersion:
	case "":
		k.bad("apiVersion: missing, want %q", APIVersion)
	default:
		k.bad("apiVersion: %q, want %q", c.APIVersion, APIVersion)
	}
	switch c.Kind {
	case Kind:
	case "":
		k.bad("kind: missing, want %q", Kind)
	default:
		k.bad("kind: %q, want %q", c.Kind, Kind)
	}
	if !slices.Contains(PolicyNames, c.Policy) {
		k.bad("policy: %q is unknown (one of %v)", c.Policy, PolicyNames)
	}
	if t := c.TierWeights; t != nil {
		k.within("tierWeights.gpu", t.GPU, 0, 1)
		k.within("tierWeights.cpu", t.CPU, 0, 1)
		k.within("tierWeights.other", t.Other, 0, 1)
		k.within("tierWeights.speculative", t.Speculative, 0, 1)
	}
	if c.Filters.MaxWaiting < 0 {
		k.bad("filters.maxWaiting: %d is negative", c.Filters.MaxWaiting)
	}
	if c.Policy == "weighted" && len(c.Weighted) == 0 {
		k.bad("weighted: policy weighted needs at least one scorer")
	}
	for i, s := range c.Weighted {
		if !slices.Contains(ScorerNames, s.Name) {
			k.bad("weighted[%d].name: %q is unknown (one of %v)", i, s.Name, ScorerNames)
		}
		k.positive(fmt.Sprintf("weighted[%d].weight", i), s.Weight)
	}
	if m := c.KVMesh; m != nil {
		k.positive("kvmesh.prefillRate", m.PrefillRate)
		k.nonNegative("kvmesh.stepBase", m.StepBase)
		k.nonNegative("kvmesh.decodeSecPerToken", m.DecodeSecPerToken)
		k.nonNegative("kvmesh.decodeWeight", m.DecodeWeight)
		if m.DefaultOutputTokens < 0 {
			k.bad("kvmesh.defaultOutputTokens: %d is negative", m.DefaultOutputTokens)
		}
		k.nonNegative("kvmesh.externalityWeight", m.ExternalityWeight)
		k.nonNegative("kvmesh.missPenalty", m.MissPenalty)
		k.nonNegative("kvmesh.waitingWeight", m.WaitingWeight)
	}
	if t := c.Kthena; t != nil {
		k.nonNegative("kthena.leastRequestWeight", t.LeastRequestWeight)
		k.nonNegative("kthena.kvCacheWeight", t.KVCacheWeight)
	}
	if s := c.SGLang; s != nil {
		k.within("sglang.cacheThreshold", s.CacheThreshold, 0, 1)
		k.nonNegative("sglang.balanceAbsThreshold", s.BalanceAbsThreshold)
		k.atLeast("sglang.balanceRelThreshold", s.BalanceRelThreshold, 1)
	}
	if r := c.Ray; r != nil {
		k.nonNegative("ray.imbalancedThreshold", r.ImbalancedThreshold)
		k.within("ray.matchRateThreshold", r.MatchRateThreshold, 0, 1)
	}
	if d := c.Dynamo; d != nil {
		k.nonNegative("dynamo.overlapWeight", d.OverlapWeight)
	}
	if l := c.LLMD; l != nil {
		n := len(k.errs)
		k.nonNegative("llmd.queueWeight", l.QueueWeight)
		k.nonNegative("llmd.kvUtilizationWeight", l.KVUtilizationWeight)
		k.nonNegative("llmd.prefixWeight", l.PrefixWeight)
		if len(k.errs) == n && l.QueueWeight+l.KVUtilizationWeight+l.PrefixWeight == 0 {
			k.bad("llmd: queueWeight, kvUtilizationWeight and prefixWeight are all 0")
		}
	}
	return k.errs
}

// ParseConfig decodes a SchedulerConfig strictly (unknown fields, a second
// YAML document and a missing apiVersion or kind are errors), applies
// defaults and validates it. Every problem is listed: when strict decoding
// fails, the file is also decoded leniently, defaulted and validated, and
// all the errors are joined (each once, decoding problems first, in file
// order, then validation problems), each wrapping ErrConfig.
func ParseConfig(data []byte) (Config, error) {
	c, errs, ok := decodeConfig(data, true)
	if len(errs) > 0 {
		var lenient []error
		c, lenient, ok = decodeConfig(data, false)
		errs = append(errs, lenient...)
	}
	if ok { // else a syntax error left nothing to validate
		// A file must say what it is: only the other fields are defaulted.
		apiVersion, kind := c.APIVersion, c.Kind
		c.Defaults()
		c.APIVersion, c.Kind = apiVersion, kind
		errs = append(errs, c.problems()...)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(uniqueErrors(errs)...)
	}
	return c, nil
}

// decodeConfig decodes the first YAML document of data (strictly: unknown
// fields are errors) and checks that no second one follows. ok is false
// when data is not YAML at all, so c holds nothing worth validating.
func decodeConfig(data []byte, strict bool) (c Config, errs []error, ok bool) {
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(strict)
	err := dec.Decode(&c)
	var te *yaml.TypeError
	switch {
	case err == nil, errors.Is(err, io.EOF):
	case errors.As(err, &te):
		for _, e := range te.Errors {
			errs = append(errs, fmt.Errorf("%w: yaml: %s", ErrConfig, e))
		}
	default:
		return Config{}, []error{fmt.Errorf("%w: %w", ErrConfig, err)}, false
	}
	var next yaml.Node
	switch err := dec.Decode(&next); {
	case errors.Is(err, io.EOF):
	case err != nil:
		errs = append(errs, fmt.Errorf("%w: second YAML document: %w (one SchedulerConfig per file)", ErrConfig, err))
	case !emptyDocument(&next):
		errs = append(errs, fmt.Errorf("%w: yaml: line %d: a second YAML document is not allowed (one SchedulerConfig per file)", ErrConfig, next.Line))
	}
	return c, errs, true
}

// emptyDocument reports whether a document holds nothing (a trailing "---"
// or a bare null).
func emptyDocument(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// uniqueErrors drops errors whose message an earlier one already has,
// keeping the order.
func uniqueErrors(errs []error) []error {
	seen := make(map[string]bool, len(errs))
	out := errs[:0:0]
	for _, e := range errs {
		if msg := e.Error(); !seen[msg] {
			seen[msg] = true
			out = append(out, e)
		}
	}
	return out
}

// LoadConfig reads and parses a SchedulerConfig file.
func LoadConfig(path string) (Config, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return Config{}, fmt.Errorf("read scheduler config: %w", err)
	}
	return ParseConfig(b)
}
