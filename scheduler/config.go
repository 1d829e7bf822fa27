package scheduler

import (
	"fmt"
	"maps"

	"go.yaml.in/yaml/v3"
)

// APIVersion and Kind identify a scheduler config file.
const (
	APIVersion = "kvmesh.io/v1alpha1"
	Kind       = "SchedulerConfig"
)

// Config is the SchedulerConfig file: the framework's own fields, and
// every plugin's parameter block by the name the plugin is registered
// under. The framework decodes only its own fields; each block is decoded
// and validated by its plugin's factory (Plugins), so adding a plugin never
// touches this type.
//
// Defaults. A block a file omits (or gives as null) means the plugin's
// published defaults; a block's omitted fields keep their defaults and a
// field it gives is kept as given, an explicit 0 included. In Go, set a
// block with SetParams (the plugin's config struct, usually its Default*
// value with one field changed). A file must name its apiVersion and kind
// (ParseConfig); Defaults fills them for a Config built in code.
type Config struct {
	APIVersion string `yaml:"apiVersion"`
	Kind       string `yaml:"kind"`
	// Policy names the routing policy, one the plugin set registers. ""
	// means the set's default policy (Plugins.DefaultPolicy).
	Policy string `yaml:"policy"`
	// Seed seeds the random tie-breaks and the random policy (0 is a valid
	// seed; runs are deterministic for a given seed and request order). An
	// ingress mixes its replica id into it, so replicas draw different
	// streams.
	Seed uint64 `yaml:"seed"`
	// TierWeights weigh matched blocks by tier. Default GPU 1, CPU 0.8,
	// other 0.5, speculative 0.9.
	TierWeights *TierWeightsConfig `yaml:"tierWeights"`
	// Params holds every other top-level block by key: a plugin's
	// parameters ("kvmesh", "sglang", "weighted", "filters", ...), as
	// decoded from the file. A key no plugin is registered under is an
	// error (Plugins.Validate). Treat the map as read-only; SetParams
	// copies it.
	Params map[string]yaml.Node `yaml:",inline"`
}

// TierWeightsConfig is TierWeights in the file.
type TierWeightsConfig struct {
	GPU         float64 `yaml:"gpu"`
	CPU         float64 `yaml:"cpu"`
	Other       float64 `yaml:"other"`
	Speculative float64 `yaml:"speculative"`
}

// DefaultTierWeightsConfig is DefaultTierWeights as a config block.
func DefaultTierWeightsConfig() TierWeightsConfig {
	return TierWeightsConfig(DefaultTierWeights())
}

// UnmarshalYAML decodes tierWeights onto DefaultTierWeightsConfig. It
// declares a local type with the block's name (so strict-decoding errors
// still read "not found in type scheduler.TierWeightsConfig") but without
// its methods (so decoding does not recurse), and uses yaml's func-style
// Unmarshaler because it decodes with the caller's decoder, keeping
// KnownFields. The block is kept even when decoding reports an error, so
// that validation sees what was given.
func (t *TierWeightsConfig) UnmarshalYAML(unmarshal func(any) error) error {
	type fields = TierWeightsConfig
	type TierWeightsConfig fields
	v := TierWeightsConfig(DefaultTierWeightsConfig())
	err := unmarshal(&v)
	*t = fields(v)
	return err
}

// DefaultConfig is the framework's part of the configuration used when no
// file is given; Plugins.DefaultConfig also names the default policy.
func DefaultConfig() Config {
	var c Config
	c.Defaults()
	return c
}

// Defaults fills unset framework fields: apiVersion, kind and tier
// weights. Policy "" keeps meaning the plugin set's default, and absent
// blocks the plugins' defaults.
func (c *Config) Defaults() {
	if c.APIVersion == "" {
		c.APIVersion = APIVersion
	}
	if c.Kind == "" {
		c.Kind = Kind
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

// SetParams sets the block for the plugin registered as name from v, the
// plugin's config struct (encoded as the file would spell it, so the
// plugin decodes and validates it like a block read from a file). The
// Params map is copied first: a Config copied by value never shares a
// change.
func (c *Config) SetParams(name string, v any) error {
	var n yaml.Node
	if err := n.Encode(v); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrConfig, name, err)
	}
	c.Params = maps.Clone(c.Params)
	if c.Params == nil {
		c.Params = make(map[string]yaml.Node, 1)
	}
	c.Params[name] = n
	return nil
}

// HasParams reports whether the config holds a (non-null) block for name.
func (c *Config) HasParams(name string) bool { return c.params(name) != nil }

// params returns the block for name, nil when absent or null.
func (c *Config) params(name string) *yaml.Node {
	n, ok := c.Params[name]
	if !ok || isNull(&n) {
		return nil
	}
	return &n
}

// Validate lists every problem with the framework's own fields, each
// wrapping ErrConfig. Plugins.Validate also checks the policy name and
// every block.
func (c *Config) Validate() error {
	var p Problems
	c.problems(&p)
	c.tierProblems(&p)
	return joinErrs(p.Errs())
}

// problems checks the framework's fields (the policy name needs the
// plugin set: Plugins.check).
func (c *Config) problems(p *Problems) {
	switch c.APIVersion {
	case APIVersion:
	case "":
		p.Addf("apiVersion", "missing, want %q", APIVersion)
	default:
		p.Addf("apiVersion", "%q, want %q", c.APIVersion, APIVersion)
	}
	switch c.Kind {
	case Kind:
	case "":
		p.Addf("kind", "missing, want %q", Kind)
	default:
		p.Addf("kind", "%q, want %q", c.Kind, Kind)
	}
}

// tierProblems checks the tier weights.
func (c *Config) tierProblems(p *Problems) {
	if t := c.TierWeights; t != nil {
		p.Within("tierWeights.gpu", t.GPU, 0, 1)
		p.Within("tierWeights.cpu", t.CPU, 0, 1)
		p.Within("tierWeights.other", t.Other, 0, 1)
		p.Within("tierWeights.speculative", t.Speculative, 0, 1)
	}
}

// isNull reports whether a node holds nothing (an empty document or a
// bare null).
func isNull(n *yaml.Node) bool {
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return true
		}
		n = n.Content[0]
	}
	return n.Kind == 0 || n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}
