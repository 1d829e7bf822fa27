package registry

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/filters"
	"github.com/kvmesh/kvmesh/scheduler/policies"
)

func TestParseConfigDefaults(t *testing.T) {
	c, err := ParseConfig([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "kvmesh" || c.Weights() != scheduler.DefaultTierWeights() {
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
	if c.Seed != 7 || c.Weights().CPU != 0.5 || len(block(t, c, "weighted", scheduler.WeightedConfig(nil))) != 2 ||
		block(t, c, "filters", filters.Config{}).MaxWaiting != 10 || block(t, c, "sglang", policies.DefaultSGLangConfig()).CacheThreshold != 0.4 {
		t.Fatalf("decoded %+v", c)
	}
}

func TestParseConfigStrict(t *testing.T) {
	_, err := ParseConfig([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicyy: kvmesh\n"))
	if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), "policyy") {
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
	for _, want := range []string{"apiVersion", "kind", "policy: \"nope\"", "tierWeights.gpu", "maxWaiting", "weighted[0].name", "weighted[0].weight", "prefillRate", "cacheThreshold", "balanceRelThreshold"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not mention %s:\n%v", want, err)
		}
	}
}

// TestParseConfigNeedsAPIVersionAndKind: a file must say what it is, even
// though Defaults fills both in for a Config built in code.
func TestParseConfigNeedsAPIVersionAndKind(t *testing.T) {
	missingAPI := `apiVersion: missing, want "kvmesh.io/v1alpha1"`
	missingKind := `kind: missing, want "SchedulerConfig"`
	for _, tc := range []struct {
		src  string
		want []string
	}{
		{"", []string{missingAPI, missingKind}},
		{"policy: kvmesh\n", []string{missingAPI, missingKind}},
		{"kind: SchedulerConfig\n", []string{missingAPI}},
		{"apiVersion: kvmesh.io/v1alpha1\n", []string{missingKind}},
		{"apiVersion: \"\"\nkind: SchedulerConfig\n", []string{missingAPI}},
	} {
		_, err := ParseConfig([]byte(tc.src))
		if !errors.Is(err, scheduler.ErrConfig) {
			t.Errorf("%q accepted: %v", tc.src, err)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%q: error does not say %s:\n%v", tc.src, w, err)
			}
		}
		if got := strings.Count(err.Error(), "\n") + 1; got != len(tc.want) {
			t.Errorf("%q: %d errors, want %d:\n%v", tc.src, got, len(tc.want), err)
		}
	}
	if c := DefaultConfig(); c.Validate() != nil {
		t.Fatalf("DefaultConfig: %v", c.Validate())
	}
}

// TestParseConfigListsDecodeAndValidationErrors: an unknown field does not
// hide the validation problems; each problem is listed once, in a stable
// order (decoding first, in file order, then validation).
func TestParseConfigListsDecodeAndValidationErrors(t *testing.T) {
	src := `apiVersion: v2
kind: SchedulerConfig
policy: nope
bogus: 1
seed: [1]
ray: {imbalancedThreshold: 10, typo: 1}
tierWeights: {cpu: .nan}
`
	_, err := ParseConfig([]byte(src))
	if !errors.Is(err, scheduler.ErrConfig) {
		t.Fatalf("accepted: %v", err)
	}
	lines := strings.Split(err.Error(), "\n")
	want := []string{
		"line 4: field bogus not found in type scheduler.Config",
		"line 5: cannot unmarshal !!seq into uint64",
		"line 6: field typo not found in type policies.RayConfig",
		`apiVersion: "v2", want "kvmesh.io/v1alpha1"`,
		`policy: "nope" is unknown`,
		"tierWeights.cpu: NaN is not a number",
	}
	if len(lines) != len(want) {
		t.Fatalf("%d errors, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("error %d = %q, want it to mention %q", i, lines[i], w)
		}
	}
	for i := 0; i < 5; i++ {
		if _, again := ParseConfig([]byte(src)); again.Error() != err.Error() {
			t.Fatalf("order changed:\n%v\nthen\n%v", err, again)
		}
	}
	// A syntax error leaves nothing to validate: it is the one error.
	if _, err := ParseConfig([]byte("{]")); !errors.Is(err, scheduler.ErrConfig) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("syntax error: %v", err)
	}
}

const header = "apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\n"

// TestParseConfigPartialBlocks: a block's omitted fields keep their
// defaults, its explicit values (0 included) are kept, an omitted or null
// block stays nil, and unknown fields inside a block are still errors.
func TestParseConfigPartialBlocks(t *testing.T) {
	c, err := ParseConfig([]byte(header + `tierWeights: {gpu: 1, other: 0}
kthena: {leastRequestWeight: 2}
ray: {matchRateThreshold: 0.2}
kvmesh: {prefillRate: 1000, missPenalty: 0}
sglang: {cacheThreshold: 0}
dynamo: {}
llmd: {prefixWeight: 0}
`))
	if err != nil {
		t.Fatal(err)
	}
	if w := (scheduler.TierWeights{GPU: 1, CPU: 0.8, Other: 0, Speculative: 0.9}); c.Weights() != w {
		t.Errorf("tierWeights = %+v, want %+v", c.Weights(), w)
	}
	kw := policies.DefaultKthenaConfig()
	kw.LeastRequestWeight = 2
	if w, got := kw, block(t, c, "kthena", policies.DefaultKthenaConfig()); got != w {
		t.Errorf("kthena = %+v, want %+v", got, w)
	}
	if w, got := (policies.RayConfig{ImbalancedThreshold: 10, MatchRateThreshold: 0.2}), block(t, c, "ray", policies.DefaultRayConfig()); got != w {
		t.Errorf("ray = %+v, want %+v", got, w)
	}
	w := policies.DefaultKVMeshConfig()
	w.PrefillRate, w.MissPenalty = 1000, 0
	if got := block(t, c, "kvmesh", policies.DefaultKVMeshConfig()); got != w {
		t.Errorf("kvmesh = %+v, want %+v", got, w)
	}
	if w, got := (policies.SGLangConfig{CacheThreshold: 0, BalanceAbsThreshold: 64, BalanceRelThreshold: 1.5, MaxTreeSize: 1 << 26}), block(t, c, "sglang", policies.DefaultSGLangConfig()); got != w {
		t.Errorf("sglang = %+v, want %+v", got, w)
	}
	if got := block(t, c, "dynamo", policies.DefaultDynamoConfig()); got != policies.DefaultDynamoConfig() {
		t.Errorf("dynamo = %+v", got)
	}
	if w, got := (policies.LLMDConfig{QueueWeight: 2, KVUtilizationWeight: 2, PrefixWeight: 0}), block(t, c, "llmd", policies.DefaultLLMDConfig()); got != w {
		t.Errorf("llmd = %+v, want %+v", got, w)
	}

	c, err = ParseConfig([]byte(header + "kthena:\nray: null\n"))
	if err != nil || c.HasParams("kthena") || c.HasParams("ray") || c.HasParams("llmd") {
		t.Errorf("omitted or null blocks: %+v, %v", c, err)
	}

	_, err = ParseConfig([]byte(header + "kthena: {leastRequestWeight: 2, kvCacheWeigth: 1}\n"))
	if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), "field kvCacheWeigth not found in type policies.KthenaConfig") {
		t.Errorf("unknown field in a block: %v", err)
	}
}

// TestParseConfigRejectsNonFinite: NaN and ±Inf are rejected wherever a
// float is configured, and reported as such (not as out of range).
func TestParseConfigRejectsNonFinite(t *testing.T) {
	fields := map[string]string{
		"tierWeights": "gpu cpu other speculative",
		"kvmesh":      "prefillRate stepBase decodeSecPerToken decodeWeight externalityWeight stallWeight missPenalty waitingWeight",
		"kthena":      "leastRequestWeight kvCacheWeight",
		"sglang":      "cacheThreshold balanceAbsThreshold balanceRelThreshold",
		"ray":         "imbalancedThreshold matchRateThreshold",
		"dynamo":      "overlapWeight",
		"llmd":        "queueWeight kvUtilizationWeight prefixWeight",
	}
	check := func(src, path, want string) {
		t.Helper()
		_, err := ParseConfig([]byte(header + src))
		if !errors.Is(err, scheduler.ErrConfig) {
			t.Errorf("%s accepted", src)
			return
		}
		if msg := path + ": " + want; err.Error() != scheduler.ErrConfig.Error()+": "+msg {
			t.Errorf("%s: got\n%v\nwant only %q", src, err, msg)
		}
	}
	for block, names := range fields {
		for _, name := range strings.Fields(names) {
			path := block + "." + name
			check(fmt.Sprintf("%s: {%s: .nan}\n", block, name), path, "NaN is not a number")
			check(fmt.Sprintf("%s: {%s: .inf}\n", block, name), path, "+Inf is not a finite number")
			check(fmt.Sprintf("%s: {%s: -.inf}\n", block, name), path, "-Inf is not a finite number")
		}
	}
	check("policy: weighted\nweighted: [{name: prefix, weight: .nan}]\n", "weighted[0].weight", "NaN is not a number")
	check("policy: weighted\nweighted: [{name: prefix, weight: .Inf}]\n", "weighted[0].weight", "+Inf is not a finite number")
}

// TestParseConfigOneDocument: a second YAML document is an error, not
// silently ignored; a trailing empty one ("---" alone) is harmless.
func TestParseConfigOneDocument(t *testing.T) {
	_, err := ParseConfig([]byte(header + "policy: kvmesh\n---\n" + header + "policy: random\n"))
	if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), "line 4: a second YAML document is not allowed") {
		t.Errorf("second document: %v", err)
	}
	_, err = ParseConfig([]byte(header + "---\n{]\n"))
	if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), "second YAML document") {
		t.Errorf("broken second document: %v", err)
	}
	_, err = ParseConfig([]byte(header + "policy: nope\n---\npolicy: random\n"))
	if err == nil || !strings.Contains(err.Error(), "second YAML document") || !strings.Contains(err.Error(), `policy: "nope"`) {
		t.Errorf("second document hides the first's problems: %v", err)
	}
	if _, err := ParseConfig([]byte("---\n" + header + "---\n")); err != nil {
		t.Errorf("one document between separators: %v", err)
	}
}

// TestWeightedScorersNeedPositiveWeights: a scorer of the weighted policy
// with weight 0 (or none) would silently do nothing.
func TestWeightedScorersNeedPositiveWeights(t *testing.T) {
	for src, want := range map[string]string{
		"weighted: [{name: prefix, weight: 1}, {name: load, weight: 0}]\n": "weighted[1].weight: 0 must be > 0",
		"weighted: [{name: prefix}]\n":                                     "weighted[0].weight: 0 must be > 0",
		"weighted: [{name: prefix, weight: -2}]\n":                         "weighted[0].weight: -2 must be > 0",
	} {
		_, err := ParseConfig([]byte(header + "policy: weighted\n" + src))
		if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", src, err, want)
		}
	}
	if _, err := ParseConfig([]byte(header + "policy: weighted\nweighted: [{name: prefix, weight: 0.5}]\n")); err != nil {
		t.Fatal(err)
	}
}

func TestLLMDConfigValidation(t *testing.T) {
	for src, want := range map[string]string{
		"llmd: {queueWeight: 0, kvUtilizationWeight: 0, prefixWeight: 0}\n": "llmd: queueWeight, kvUtilizationWeight and prefixWeight are all 0",
		"llmd: {queueWeight: -1}\n":                                         "llmd.queueWeight: -1 is negative",
	} {
		_, err := ParseConfig([]byte(header + src))
		if !errors.Is(err, scheduler.ErrConfig) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", src, err, want)
		}
	}
	c, err := ParseConfig([]byte(header + "policy: llmd\nllmd: {queueWeight: 0, kvUtilizationWeight: 0}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if got := block(t, c, "llmd", policies.DefaultLLMDConfig()); got != (policies.LLMDConfig{PrefixWeight: 3}) {
		t.Fatalf("prefix only: %+v", got)
	}
}

func FuzzParseConfig(f *testing.F) {
	f.Add([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicy: kvmesh\n"))
	f.Add([]byte("weighted: [{name: prefix, weight: 1}]\npolicy: weighted\n"))
	f.Add([]byte("{]"))
	f.Add([]byte(header + "kvmesh: {prefillRate: 1, bogus: 2}\nweighted: [{name: x}]\nfilters: {maxWaiting: -1}\nrandom: {}\n"))
	f.Add([]byte(header + "kthena: &a {leastRequestWeight: *a}\nray: *a\n"))
	f.Add([]byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\nkthena: {kvCacheWeight: 0}\nllmd: {prefixWeight: .nan}\n---\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		c, err := ParseConfig(b)
		if err == nil {
			if verr := Validate(&c); verr != nil {
				t.Fatalf("parsed config fails validation: %v", verr)
			}
		}
	})
}

// TestExampleConfig keeps the documented example file valid and equal to
// the built-in defaults it claims to spell out.
func TestExampleConfig(t *testing.T) {
	c, err := LoadConfig("../testdata/scheduler.yaml")
	if err != nil {
		t.Fatal(err)
	}
	framework, want := c, DefaultConfig()
	framework.Params = nil
	if !reflect.DeepEqual(framework, want) {
		t.Fatalf("example decoded to\n%+v %+v\nwant\n%+v %+v", framework, framework.TierWeights, want, want.TierWeights)
	}
	for name, got := range map[string]any{
		"kvmesh": block(t, c, "kvmesh", policies.DefaultKVMeshConfig()), "kthena": block(t, c, "kthena", policies.DefaultKthenaConfig()),
		"sglang": block(t, c, "sglang", policies.DefaultSGLangConfig()), "ray": block(t, c, "ray", policies.DefaultRayConfig()),
		"dynamo": block(t, c, "dynamo", policies.DefaultDynamoConfig()), "llmd": block(t, c, "llmd", policies.DefaultLLMDConfig()),
		"filters": block(t, c, "filters", filters.Config{}), "weighted": block(t, c, "weighted", scheduler.WeightedConfig(nil)),
	} {
		want := map[string]any{
			"kvmesh": policies.DefaultKVMeshConfig(), "kthena": policies.DefaultKthenaConfig(), "sglang": policies.DefaultSGLangConfig(),
			"ray": policies.DefaultRayConfig(), "dynamo": policies.DefaultDynamoConfig(), "llmd": policies.DefaultLLMDConfig(), "filters": filters.Config{},
			"weighted": scheduler.WeightedConfig{{Name: "prefix", Weight: 3}, {Name: "load", Weight: 2}, {Name: "session-affinity", Weight: 1}},
		}[name]
		if !reflect.DeepEqual(got, want) {
			t.Errorf("example's %s block = %+v, want %+v", name, got, want)
		}
	}
	if len(c.Params) != 8 {
		t.Errorf("example has %d blocks, want 8", len(c.Params))
	}
	if _, err := LoadConfig("../testdata/missing.yaml"); err == nil {
		t.Fatal("missing file accepted")
	}
}

// block decodes c's block for name onto def, as the plugin's factory does.
func block[C any](t *testing.T, c scheduler.Config, name string, def C) C {
	t.Helper()
	n, ok := c.Params[name]
	if !ok {
		t.Fatalf("no %s block in %+v", name, c)
	}
	if err := scheduler.DecodeParams(&n, &def); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return def
}

// TestNestedConfig: a SchedulerConfig inside another file (the ingress's
// `scheduler:` block) decodes with that file's strict decoder; unknown
// keys and block problems are then reported by Validate, with their lines.
func TestNestedConfig(t *testing.T) {
	var outer struct {
		Scheduler scheduler.Config `yaml:"scheduler"`
	}
	dec := yaml.NewDecoder(strings.NewReader("scheduler:\n  policy: sglang\n  bogus: 1\n  sglang: {cacheThreshold: 2, typo: 1}\n"))
	dec.KnownFields(true)
	if err := dec.Decode(&outer); err != nil {
		t.Fatal(err)
	}
	sc := outer.Scheduler
	sc.Defaults()
	err := Validate(&sc)
	for _, want := range []string{"line 3: field bogus not found in type scheduler.Config",
		"line 4: field typo not found in type policies.SGLangConfig", "sglang.cacheThreshold: 2 is outside [0,1]"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("nested config: %v, want %q", err, want)
		}
	}
}
