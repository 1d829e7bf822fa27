package main

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// checkUsage asserts err is one usage error, on one line, naming every
// want.
func checkUsage(t *testing.T, args []string, err error, want ...string) {
	t.Helper()
	if !errors.Is(err, errUsage) {
		t.Errorf("%q: %v, want a usage error", args, err)
		return
	}
	if strings.Contains(err.Error(), "\n") {
		t.Errorf("%q: %q spans lines", args, err)
	}
	for _, w := range want {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%q: %q lacks %q", args, err, w)
		}
	}
}

// TestRoutesFileIsUsage: a routes file missing or invalid is a usage
// error naming --routes and the file, every problem of it listed on one
// line; it was an exit 1 at start-up, the message broken by a newline.
func TestRoutesFileIsUsage(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "routes.yaml")
	if err := os.WriteFile(bad, []byte(`apiVersion: kvmesh.io/v1alpha1
kind: RouteConfig
routes:
- name: a
  match: {model: "x*y"}
  backends: [{model: m, weight: -1}]
`), 0o600); err != nil {
		t.Fatal(err)
	}
	typo := filepath.Join(dir, "typo.yaml")
	if err := os.WriteFile(typo, []byte("apiVersion: kvmesh.io/v1alpha1\nkind: RouteConfig\nroutez: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing.yaml")
	base := []string{"--engine", "m=http://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--routes", missing}, []string{"--routes", missing, "no such file"}},
		{[]string{"--routes", bad}, []string{"--routes", bad, "'*' is allowed only at the end", "weight must be in"}},
		{[]string{"--routes", typo}, []string{"--routes", typo, "line 3", "routez"}},
		{[]string{"--routes", missing, "--listen", "127.0.0.1:70000", "--admin", "127.0.0.1:abc"}, []string{missing, "--listen", "--admin"}},
	} {
		args := append(append([]string(nil), base...), c.args...)
		_, err := ingressOptions(args, io.Discard)
		checkUsage(t, args, err, c.want...)
	}
	// Optional: a missing file is no routes yet; an invalid one is refused still.
	if _, err := ingressOptions(append(append([]string(nil), base...), "--routes", missing, "--routes-optional"), io.Discard); err != nil {
		t.Errorf("optional, missing: %v", err)
	}
	_, err := ingressOptions(append(append([]string(nil), base...), "--routes", bad, "--routes-optional"), io.Discard)
	checkUsage(t, []string{"--routes", bad, "--routes-optional"}, err, bad)
}

// TestIngressNeedsAnEngineSource: an empty --config (a template's --config
// "$CFG" with CFG unset) and an ingress with no engine source at all (no
// --engine, no config engines, no gossip: it answered every request 503)
// are usage errors; they started on the defaults without a word.
func TestIngressNeedsAnEngineSource(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "ingress.yaml")
	if err := os.WriteFile(cfg, []byte("engines:\n- {id: a, model: m, url: \"http://127.0.0.1:1\"}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string // "": accepted
	}{
		{[]string{"--config", "", "--engine", "m=http://127.0.0.1:1"}, "--config is given an empty path"},
		{[]string{"--config=", "--engine", "m=http://127.0.0.1:1"}, "--config is given an empty path"},
		{[]string{"--listen", "127.0.0.1:0"}, "no engines: give --engine"},
		{[]string{"--engine", "m=http://127.0.0.1:1"}, ""},
		{[]string{"--config", cfg}, ""},
		{[]string{"--gossip-bind", "127.0.0.1:0"}, ""},
		{[]string{"--engine", "only-one-part"}, `engine "only-one-part"`}, // a bad --engine is its own problem, no "no engines" beside it
	} {
		_, err := ingressOptions(c.args, io.Discard)
		if c.want == "" {
			if err != nil {
				t.Errorf("%q: %v", c.args, err)
			}
			continue
		}
		checkUsage(t, c.args, err, c.want)
		if err != nil && c.want == `engine "only-one-part"` && strings.Contains(err.Error(), "no engines") {
			t.Errorf("%q: %v", c.args, err)
		}
	}
	_, err := eppOptions([]string{"--grpc-tls", "off"}, io.Discard)
	checkUsage(t, []string{"epp"}, err, "no engines: give --engine")
}

// TestTenantWeightDefaults: --tenant NAME and NAME=:PRIORITY take weight
// 1, as the help and the config file's fairQueue tenants say; both were
// refused.
func TestTenantWeightDefaults(t *testing.T) {
	o, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--tenant", "a", "--tenant", "b=:2", "--tenant", "c=3", "--tenant", "d=0.5:1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	got := o.Config.FairQueue.Tenants
	for name, want := range map[string][2]float64{"a": {1, 0}, "b": {1, 2}, "c": {3, 0}, "d": {0.5, 1}} {
		if tn := got[name]; tn.Weight != want[0] || float64(tn.Priority) != want[1] {
			t.Errorf("tenant %s: %+v, want weight %v priority %v", name, tn, want[0], want[1])
		}
	}
	for _, bad := range []string{"=2", "a=0", "a=x", "a=:x", "a:1", "a=-1:1"} {
		_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--tenant", bad}, io.Discard)
		checkUsage(t, []string{"--tenant", bad}, err, "--tenant "+strconv.Quote(bad), "NAME[=WEIGHT][:PRIORITY]")
	}
}

// TestFlagTexts: a duration flag without its unit gets the hint a config
// file's duration gets; an --engine URL without its scheme is one problem
// naming --engine (it said "engines[0]: empty id"); -h says "; set" of
// $KVMESH_GOSSIP_KEY as of the other secrets from the environment.
func TestFlagTexts(t *testing.T) {
	for _, cmd := range []func([]string, io.Writer) error{
		func(a []string, w io.Writer) error { _, err := ingressOptions(a, w); return err },
		func(a []string, w io.Writer) error { _, err := eppOptions(a, w); return err },
	} {
		args := []string{"--engine", "m=http://127.0.0.1:1", "--tokenize-budget", "2"}
		checkUsage(t, args, cmd(args, io.Discard), "-tokenize-budget", "a duration takes its unit: 30s")
	}
	args := []string{"--model", "m", "--engine-url", "http://127.0.0.1:1", "--events", "tcp://127.0.0.1:2", "--models-interval", "5"}
	_, err := sidecarOptions(args, io.Discard)
	checkUsage(t, args, err, "-models-interval", "a duration takes its unit")
	args = []string{"--engine", "m=http://127.0.0.1:1", "--max-body", "x"}
	if _, err := ingressOptions(args, io.Discard); err == nil || strings.Contains(err.Error(), "duration") {
		t.Errorf("%q: %v, want no duration hint", args, err)
	}

	args = []string{"--engine", "m=localhost:27002"}
	_, err = ingressOptions(args, io.Discard)
	checkUsage(t, args, err, `--engine: `, `url "localhost:27002": want http(s)://host:port`)
	if err != nil && (strings.Contains(err.Error(), "empty id") || strings.Contains(err.Error(), "engines[0]")) {
		t.Errorf("%q: %v", args, err)
	}

	t.Setenv("KVMESH_GOSSIP_KEY", "MDEyMzQ1Njc4OWFiY2RlZg==")
	var help bytes.Buffer
	ingressOptions([]string{"-h"}, &help)
	if !strings.Contains(help.String(), "(env KVMESH_GOSSIP_KEY; set)") || strings.Contains(help.String(), "MDEyMzQ1Njc4OWFiY2RlZg") {
		t.Errorf("-h with $KVMESH_GOSSIP_KEY set: %s", help.String())
	}
}

// TestSchedulerBlockNamesFile: a problem in --config's scheduler: block
// names the file, as the rest of the file's do; its line numbers are the
// file's.
func TestSchedulerBlockNamesFile(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("scheduler:\n  policy: kvmesh\n  kvmesh:\n    bogusField: 1\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", p, "--engine", "m=http://127.0.0.1:1"}
	_, err := ingressOptions(args, io.Discard)
	checkUsage(t, args, err, p+": invalid ingress config: scheduler:", "line 4", "bogusField")
}

// TestExampleIngressConfig: examples/ingress-config.yaml loads as
// `kvmesh ingress --config` reads it (its example values taken), and every
// flag its comments name beside a key is an ingress flag.
func TestExampleIngressConfig(t *testing.T) {
	const path = "../../examples/ingress-config.yaml"
	o, err := ingressOptions([]string{"--config", path}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.Config; c.ID != "ingress-a" || len(c.Engines) != 2 || c.FairQueue == nil || c.FairQueue.Tenants["interactive"].Weight != 4 {
		t.Errorf("the example's values not read: id %q, %d engines, fairQueue %+v", c.ID, len(c.Engines), c.FairQueue)
	}
	var help bytes.Buffer
	ingressOptions([]string{"-h"}, &help)
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	flagRe := regexp.MustCompile(`--([a-z][a-z0-9-]*)`)
	named := 0
	for i, line := range strings.Split(string(data), "\n") {
		_, comment, ok := strings.Cut(line, "#")
		if !ok || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue // the header's flags are the flag-only ones, checked below too
		}
		for _, m := range flagRe.FindAllStringSubmatch(comment, -1) {
			named++
			if !strings.Contains(help.String(), "  -"+m[1]+" ") && !strings.Contains(help.String(), "  -"+m[1]+"\n") {
				t.Errorf("line %d names --%s, which kvmesh ingress does not have: %s", i+1, m[1], line)
			}
		}
	}
	if named < 40 {
		t.Errorf("%d flags named beside keys; the example lists the common keys with their flags", named)
	}
}
