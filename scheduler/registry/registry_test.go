package registry

import (
	"errors"
	"math"
	"reflect"
	"testing"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

// defaultPolicies are the policies' built-in defaults, by name.
func defaultPolicies() map[string]scheduler.Policy {
	llmd, _ := policies.NewLLMDApproximate(policies.DefaultLLMDWeights())
	return map[string]scheduler.Policy{
		"kvmesh": policies.NewKVMesh(), "sglang": policies.NewSGLang(), "ray": policies.NewRay(),
		"dynamo": policies.NewDynamo(), "kthena": policies.NewKthena(), "llmd": llmd,
	}
}

// TestExampleMatchesDefaults: the example file spells out the policies'
// built-in defaults; building from it must give the same policies.
func TestExampleMatchesDefaults(t *testing.T) {
	cfg, err := LoadConfig("../testdata/scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	checkDefaults(t, cfg, "the example")
}

// checkDefaults builds every policy from cfg and compares it with the
// policy's built-in default.
func checkDefaults(t *testing.T, cfg scheduler.Config, from string) {
	t.Helper()
	for name, w := range defaultPolicies() {
		cfg.Policy = name
		p, err := Policy(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p, w) {
			t.Errorf("%s from %s = %+v, built-in default %+v", name, from, p, w)
		}
	}
}

// TestDefaultBlocksMatchPolicies: the config's Default*Config blocks (what a
// partial YAML block is completed from) are the policies' built-in defaults.
func TestDefaultBlocksMatchPolicies(t *testing.T) {
	cfg := DefaultConfig()
	for name, block := range map[string]any{
		"kvmesh": policies.DefaultKVMeshConfig(), "kthena": policies.DefaultKthenaConfig(), "sglang": policies.DefaultSGLangConfig(),
		"ray": policies.DefaultRayConfig(), "dynamo": policies.DefaultDynamoConfig(), "llmd": policies.DefaultLLMDConfig(),
	} {
		if err := cfg.SetParams(name, block); err != nil {
			t.Fatal(err)
		}
	}
	checkDefaults(t, cfg, "Default*Config")
}

// TestPartialBlocks: a partial YAML block builds the default policy with
// only the given fields changed.
func TestPartialBlocks(t *testing.T) {
	cfg, err := ParseConfig([]byte(`apiVersion: kvmesh.io/v1alpha1
kind: SchedulerConfig
kthena: {leastRequestWeight: 2}
ray: {matchRateThreshold: 0.2}
kvmesh: {missPenalty: 0}
llmd: {prefixWeight: 5}
`))
	if err != nil {
		t.Fatal(err)
	}
	kt, ray, kv := policies.NewKthena(), policies.NewRay(), policies.NewKVMesh()
	kt.LeastRequestWeight, ray.MatchRateThreshold, kv.MissPenalty = 2, 0.2, 0
	llmd, err := policies.NewLLMDApproximate(policies.LLMDWeights{Queue: 2, KVUtilization: 2, Prefix: 5})
	if err != nil {
		t.Fatal(err)
	}
	for name, w := range map[string]scheduler.Policy{"kthena": kt, "ray": ray, "kvmesh": kv, "llmd": llmd} {
		cfg.Policy = name
		p, err := Policy(&cfg)
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(p, w) {
			t.Errorf("%s = %+v, want %+v", name, p, w)
		}
	}
}

// TestNewValidatesLLMD: New rejects llmd weights the policy cannot use.
func TestNewValidatesLLMD(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = "llmd"
	setParams(t, &cfg, "llmd", policies.LLMDConfig{})
	if _, err := New(cfg, nil, nil); !errors.Is(err, scheduler.ErrConfig) {
		t.Fatalf("all-zero llmd weights: %v", err)
	}
	setParams(t, &cfg, "llmd", policies.LLMDConfig{QueueWeight: math.NaN(), PrefixWeight: 1})
	if _, err := New(cfg, nil, nil); !errors.Is(err, scheduler.ErrConfig) {
		t.Fatalf("NaN llmd weight: %v", err)
	}
	if _, err := Policy(&cfg); err == nil {
		t.Fatal("Policy built llmd with a NaN weight")
	}
}

func TestUnknownScorer(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Policy = "weighted"
	setParams(t, &cfg, "weighted", scheduler.WeightedConfig{{Name: "nope", Weight: 1}})
	if _, err := New(cfg, nil, nil); err == nil {
		t.Fatal("unknown scorer accepted")
	}
	for _, name := range ScorerNames() {
		setParams(t, &cfg, "weighted", scheduler.WeightedConfig{{Name: name, Weight: 1}})
		if _, err := New(cfg, nil, nil); err != nil {
			t.Errorf("scorer %s listed but not usable: %v", name, err)
		}
	}
}

func setParams(t *testing.T, cfg *scheduler.Config, name string, v any) {
	t.Helper()
	if err := cfg.SetParams(name, v); err != nil {
		t.Fatal(err)
	}
}
