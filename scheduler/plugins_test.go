package scheduler_test

import (
	"errors"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

// fixedConfig is the block of a policy only this test registers: the
// framework must decode and validate it without knowing it.
type fixedConfig struct {
	Engine string  `yaml:"engine"`
	Bias   float64 `yaml:"bias"`
}

func (c fixedConfig) Validate(name string) error {
	p := scheduler.NewProblems(name)
	if c.Engine == "" {
		p.Addf("engine", "empty")
	}
	p.NonNegative("bias", c.Bias)
	return errors.Join(p.Errs()...)
}

// fixed picks the engine its block names.
type fixed struct{ cfg fixedConfig }

func (fixed) Name() string { return "fixed" }

func (f fixed) Pick(_ *scheduler.Request, cs []scheduler.Candidate, _ *scheduler.Cycle) (int, string) {
	for i := range cs {
		if cs[i].ID == f.cfg.Engine {
			return i, "configured"
		}
	}
	return 0, "fallback"
}

func fixedFactory(name string, params *yaml.Node) (scheduler.Policy, error) {
	c, err := scheduler.ParseParams(name, params, fixedConfig{Engine: "a"})
	if err != nil {
		return nil, err
	}
	return fixed{c}, nil
}

func testPlugins() *scheduler.Plugins {
	p := &scheduler.Plugins{}
	p.RegisterPolicy("fixed", fixedFactory)
	p.RegisterPolicy("none", scheduler.NoParams(func() scheduler.Policy { return fixed{fixedConfig{Engine: "z"}} }))
	return p
}

const header = "apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\n"

// TestPluginOwnsItsBlock: a policy registered from outside the framework
// gets its block, decoded onto its defaults, and its problems are listed
// with the file's lines and its own type's name.
func TestPluginOwnsItsBlock(t *testing.T) {
	p := testPlugins()
	c, err := p.ParseConfig([]byte(header + "fixed: {engine: b}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c.Policy != "fixed" { // the first registered is the default
		t.Fatalf("policy %q", c.Policy)
	}
	s, err := p.New(c, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	es := []scheduler.Engine{{ID: "a", Healthy: true}, {ID: "b", Healthy: true}}
	var d scheduler.Decision
	if err := s.Schedule(&scheduler.Request{Keys: []uint64{1}, BlockSize: 16, PromptTokens: 16}, es, &d); err != nil || d.Engine != "b" {
		t.Fatalf("picked %q (%v), want the configured b", d.Engine, err)
	}

	_, err = p.ParseConfig([]byte(header + "bogus: 1\nfixed:\n  engine: \"\"\n  bais: 1\n  bias: -1\nnone: {x: 1}\n"))
	want := []string{
		"line 3: field bogus not found in type scheduler.Config",
		"line 6: field bais not found in type scheduler_test.fixedConfig",
		"line 8: policy none takes no parameters",
		"fixed.engine: empty",
		"fixed.bias: -1 is negative",
	}
	if !errors.Is(err, scheduler.ErrConfig) {
		t.Fatalf("accepted: %v", err)
	}
	lines := strings.Split(err.Error(), "\n")
	if len(lines) != len(want) {
		t.Fatalf("%d problems, want %d:\n%v", len(lines), len(want), err)
	}
	for i, w := range want {
		if !strings.Contains(lines[i], w) {
			t.Errorf("problem %d = %q, want %q", i, lines[i], w)
		}
	}
}

// TestSetParams: a block set in code is decoded and validated like one
// read from a file, and a copied Config does not share it.
func TestSetParams(t *testing.T) {
	p := testPlugins()
	c := p.DefaultConfig()
	if err := c.SetParams("fixed", fixedConfig{Engine: "c", Bias: 1}); err != nil {
		t.Fatal(err)
	}
	d := c
	if err := d.SetParams("fixed", fixedConfig{Bias: -2}); err != nil {
		t.Fatal(err)
	}
	if pol, err := p.Policy(&c); err != nil || pol.(fixed).cfg.Engine != "c" {
		t.Fatalf("%+v, %v", pol, err)
	}
	if err := p.Validate(&d); err == nil || !strings.Contains(err.Error(), "fixed.bias: -2 is negative") {
		t.Fatalf("bad block set in code: %v", err)
	}
}

func TestRegisterTwicePanics(t *testing.T) {
	for _, name := range []string{"fixed", "seed", ""} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("registering %q did not panic", name)
				}
			}()
			testPlugins().RegisterPolicy(name, fixedFactory)
		}()
	}
}
