package scheduler

import (
	"errors"
	"strings"
	"testing"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "kvmesh" || c.Weights() != DefaultTierWeights() {
		t.Fatalf("defaults not applied: %+v", c)
	}
}

func TestParseConfigFull(t *testing.T) {
	src := `apiVersion: kvmesh.io/v1alpha1
kind: SchedulerConfig
policy: weighted
seed: 7
tierWeights: {gpu: 1, cpu: 0.5, other: 0.25, speculative: 0.75}
filters: {maxWaiting: 10, strictLoRA: true}
weighted:
  - {name: prefix, weight: 3}
  - {name: load, weight: 1}
sglang: {cacheThreshold: 0.4, balanceAbsThreshold: 16, balanceRelThreshold: 1.5}
`
	c, err := ParseConfig([]byte(src))
	if err != nil {
		t.Fatal(err)
	}
	if c.Seed != 7 || c.Weights().CPU != 0.5 || len(c.Weighted) != 2 || c.Filters.MaxWaiting != 10 || c.SGLang.CacheThreshold != 0.4 {
		t.Fatalf("decoded %+v", c)
	}
}

func TestParseConfigStrict(t *testing.T) {
	_, err := ParseConfig([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicyy: kvmesh\n"))
	if !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "policyy") {
		t.Fatalf("unknown field not rejected: %v", err)
	}
}

func TestValidateListsEveryError(t *testing.T) {
	src := `apiVersion: v2
kind: Other
policy: nope
tierWeights: {gpu: 2, cpu: 0.8, other: 0.5, speculative: 0.9}
filters: {maxWaiting: -1}
weighted: [{name: bogus, weight: -1}]
kvmesh: {prefillRate: 0}
sglang: {cacheThreshold: 2, balanceRelThreshold: 0.5}
`
	_, err := ParseConfig([]byte(src))
	if err == nil {
		t.Fatal("accepted")
	}
	for _, want := range []string{"apiVersion", "kind", "policy \"nope\"", "tierWeights.gpu", "maxWaiting", "weighted[0].name", "weighted[0].weight", "prefillRate", "cacheThreshold", "balanceRelThreshold"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicy: kvmesh\n"))
	f.Add([]byte("weighted: [{name: prefix, weight: 1}]\npolicy: weighted\n"))
	f.Add([]byte("{]"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err == nil {
			if verr := c.Validate(); verr != nil {
				t.Fatalf("parsed config fails validation: %v", verr)
			}
		}
	})
}

// TestExampleConfig keeps the documented example file valid and equal to
// the built-in defaults it claims to spell out.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("testdata/scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "kvmesh" || c.Weights() != DefaultTierWeights() || c.KVMesh == nil || c.KVMesh.PrefillRate != 30000 ||
		c.SGLang.BalanceAbsThreshold != 32 || c.Ray.ImbalancedThreshold != 10 || len(c.Weighted) != 3 {
		t.Fatalf("example decoded to %+v", c)
	}
	if _, err := LoadConfig("testdata/missing.yaml"); err == nil {
		t.Fatal("missing file accepted")
	}
}
