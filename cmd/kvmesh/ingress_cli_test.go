package main

import (
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Secrets from the environment are read but never shown: not by -h, not
// in the usage dump a mistyped flag prints (a pod's logs), for ingress,
// epp, sidecar and inspect stream alike.
func TestSecretsFromEnvNotShown(t *testing.T) {
	t.Setenv("KVMESH_NATS_PASSWORD", "pw-s3cret")
	t.Setenv("KVMESH_NATS_TOKEN", "tok-s3cret")
	t.Setenv("KVMESH_ADMIN_TOKEN", "admin-s3cret")
	for _, args := range [][]string{
		{"ingress", "--lisen", ":1"}, {"ingress", "-h"}, {"epp", "--lisen", ":1"}, {"epp", "-h"},
		{"sidecar", "--typo"}, {"sidecar", "-h"}, {"inspect", "stream", "--typo"}, {"inspect", "stream", "-h"},
	} {
		var out, errOut testutil.SyncBuffer
		run(args, &out, &errOut)
		all := out.String() + errOut.String()
		help := args[len(args)-1] == "-h"
		if strings.Contains(all, "s3cret") || help && !strings.Contains(all, "(env KVMESH_NATS_PASSWORD; set)") {
			t.Errorf("%v: output shows a secret or not that it is set:\n%s", args, all)
		}
	}
	o, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--admin", "127.0.0.1:0"}, io.Discard)
	if err != nil || o.Config.AdminToken != "admin-s3cret" || o.Config.Cluster.NATSAuth.Password != "pw-s3cret" {
		t.Fatalf("from the environment: %v", err)
	}
	o, err = ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--admin", "127.0.0.1:0", "--admin-token", "flag"}, io.Discard)
	if err != nil || o.Config.AdminToken != "flag" {
		t.Fatalf("the flag does not replace the environment: %v", err)
	}
}

// Token-rate flags take a whole decimal number: "100k" used to be read
// as 100, "0x10" as 16.
func TestTokenRateFlagsWholeNumber(t *testing.T) {
	for _, v := range []string{"100k", "1e3", "5.5", "12abc", "0x10", " 7", "", "99999999999999999999"} {
		_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--key-input-tpm", v}, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--key-input-tpm") {
			t.Errorf("--key-input-tpm %q: %v, want a usage error", v, err)
		}
	}
	o, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--model-output-tpm", "100000", "--key-input-tpm=0"}, io.Discard)
	if err != nil || o.ModelLimits.OutputTokens != 100000 || o.KeyLimits.InputTokens != 0 {
		t.Fatalf("%+v, %v", o.ModelLimits, err)
	}
}

// Fair-queue weights must be finite, from --tenant and from the config's
// fairQueue: NaN passed "<= 0" and broke the queue's order and
// /debug/config's JSON.
func TestTenantWeightFinite(t *testing.T) {
	for _, w := range []string{"NaN", "Inf", "+Inf", "-Inf", "0", "-1"} {
		_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--tenant", "a=" + w}, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--tenant") {
			t.Errorf("--tenant a=%s: %v, want a usage error", w, err)
		}
	}
	for _, w := range []string{".nan", ".inf"} {
		path := filepath.Join(t.TempDir(), "c.yaml")
		if err := os.WriteFile(path, []byte("fairQueue:\n  maxConcurrent: 4\n  tenants:\n    a: {weight: "+w+"}\n"), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--config", path}, io.Discard)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `tenant "a"`) {
			t.Errorf("fairQueue weight %s: %v, want a usage error", w, err)
		}
	}
	if _, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--tenant", "a=2.5:1"}, io.Discard); err != nil {
		t.Fatal(err)
	}
}

// --chat-template for a model without --tokenizer is a usage error (it was
// ignored, its path never checked).
func TestChatTemplateWithoutTokenizer(t *testing.T) {
	_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--chat-template", "m=/nonexist"}, io.Discard)
	if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), `chat template for "m" is not read without a tokenizer`) {
		t.Fatalf("%v, want a usage error", err)
	}
}

// Configuration mistakes that used to exit 1 after start-up began are usage
// errors found before anything starts.
func TestIngressConfigMistakesAreUsageErrors(t *testing.T) {
	jwks := filepath.Join(t.TempDir(), "jwks.json")
	if err := os.WriteFile(jwks, []byte(`{"keys":[]}`), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"--jwks-file", jwks}, "an audience is required"},
		{[]string{"--nats", "127.0.0.1:1"}, "has no scheme"},
		{[]string{"--nats", "http://127.0.0.1:1"}, `scheme "http"`},
		{[]string{"--nats", "nats://127.0.0.1:1", "--nats-ping-interval", "-1s"}, "ping interval -1s"},
	} {
		args := append([]string{"--engine", "m=http://127.0.0.1:1"}, c.args...)
		_, ierr := ingressOptions(args, io.Discard) // what run checks before it starts anything
		_, eerr := eppOptions(args, io.Discard)
		for _, err := range []error{ierr, eerr} {
			if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want) {
				t.Errorf("%v: %v; want a usage error naming %q", c.args, err, c.want)
			}
		}
	}
}

// A bad environment value for a feature that is off does not stop the
// ingress (the value is not read), and a flag given to replace it is taken
// even then; with the feature on, the bad value is still refused.
func TestBadEnvForFeatureOff(t *testing.T) {
	base := []string{"--engine", "m=http://127.0.0.1:1"}
	gossip := []string{"--gossip-bind", "127.0.0.1:0"}
	nats := []string{"--nats", "nats://127.0.0.1:1"}
	for _, c := range []struct {
		env, val string
		args     []string
		want     string // "": accepted
	}{
		{"KVMESH_GOSSIP_KEY", "bad", nil, ""},
		{"KVMESH_GOSSIP_KEY", "bad", []string{"--gossip-key", ""}, ""},
		{"KVMESH_GOSSIP_KEY", "bad", gossip, "--gossip-key"},
		{"KVMESH_GOSSIP_KEY", "bad", append(gossip, "--gossip-key", "MDEyMzQ1Njc4OWFiY2RlZg=="), ""},
		{"KVMESH_GOSSIP_KEY", "", []string{"--gossip-key", ""}, "--gossip-key is not read without --gossip-bind"}, // nothing to replace
		{stateLaneEnv, "maybe", nil, ""},
		{stateLaneEnv, "maybe", nats, ""}, // no gossip: no lane
		{stateLaneEnv, "maybe", []string{"--state-over-nats=false"}, ""},
		{stateLaneEnv, "maybe", append(append([]string{}, nats...), gossip...), "KVMESH_STATE_OVER_NATS"},
	} {
		t.Setenv(c.env, c.val)
		_, err := ingressOptions(ingressArgs(base, c.args), io.Discard)
		if c.want == "" && err != nil || c.want != "" && (!errors.Is(err, errUsage) || !strings.Contains(err.Error(), c.want)) {
			t.Errorf("%s=%q %v: %v; want %q", c.env, c.val, c.args, err, c.want)
		}
		os.Unsetenv(c.env)
	}
}

// Config file and flags: a repeatable flag given replaces the config's
// list (--engine added to it, where --tokenizer replaced), --config is
// given once (the first won, the second never read), and a config is one
// YAML document (later ones were ignored).
func TestConfigAndFlags(t *testing.T) {
	dir := t.TempDir()
	write := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	cfg := write("c.yaml", "engines:\n- {id: a, model: m, url: http://127.0.0.1:1}\ntokenizers: {m: /x}\nfairQueue:\n  maxConcurrent: 4\n  tenants: {x: {weight: 2}}\n")
	o, err := ingressOptions([]string{"--config", cfg}, io.Discard)
	if err != nil || len(o.Config.Engines) != 1 || len(o.Config.FairQueue.Tenants) != 1 {
		t.Fatalf("config alone: %+v, %v", o.Config.Engines, err)
	}
	o, err = ingressOptions([]string{"--config", cfg, "--engine", "b=m=http://127.0.0.1:2", "--engine", "c=m=http://127.0.0.1:3",
		"--tokenizer", "n=/y", "--tenant", "y=1"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if e := o.Config.Engines; len(e) != 2 || e[0].ID != "b" || e[1].ID != "c" {
		t.Errorf("--engine did not replace the config's engines: %+v", e)
	}
	if tk := o.Config.Tokenizers; len(tk) != 1 || tk["n"] != "/y" {
		t.Errorf("--tokenizer did not replace the config's tokenizers: %v", tk)
	}
	if tn := o.Config.FairQueue.Tenants; len(tn) != 1 || tn["y"].Weight != 1 || o.Config.FairQueue.MaxConcurrent != 4 {
		t.Errorf("--tenant did not replace the config's tenants (only them): %+v", o.Config.FairQueue)
	}

	// --fair-max-concurrent 0 turns the config's fair queue off, as its
	// help says; with --tenant (either order) it is a contradiction.
	if o, err = ingressOptions([]string{"--config", cfg, "--fair-max-concurrent", "0"}, io.Discard); err != nil || o.Config.FairQueue != nil {
		t.Errorf("--fair-max-concurrent 0 over the config's fairQueue: %+v, %v; want it off", o.Config.FairQueue, err)
	}
	for _, args := range [][]string{{"--fair-max-concurrent", "0", "--tenant", "y=1"}, {"--tenant", "y=1", "--fair-max-concurrent", "0"}} {
		if _, err := ingressOptions(append([]string{"--config", cfg}, args...), io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "turns fair admission off, which --tenant needs") {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}

	bad := write("bad.yaml", "bogus: 1\n")
	for _, args := range [][]string{{"--config", cfg, "--config", bad}, {"--config=" + cfg, "-config", cfg}} {
		if _, err := ingressOptions(args, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--config given 2 times") {
			t.Errorf("%v: %v, want a usage error", args, err)
		}
	}
	multi := write("multi.yaml", "listen: :1\n---\nbogus: 1\n")
	if _, err := ingressOptions([]string{"--config", multi}, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "more than one YAML document") {
		t.Errorf("two documents: %v, want a usage error", err)
	}
}

// --lora-adapter's error names its own form, not --tokenizer's.
func TestLoRAAdapterForm(t *testing.T) {
	_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--lora-adapter", "a", "--tokenizer", "=x"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), `--lora-adapter "a": want adapter=base-model`) || !strings.Contains(err.Error(), `--tokenizer "=x": want model=path`) {
		t.Fatalf("%v", err)
	}
}

// The simulator's vLLM key and the local orchestrator's gossip keys, from
// the environment, are never shown either.
func TestSimAndLocalSecretsFromEnvNotShown(t *testing.T) {
	t.Setenv("VLLM_API_KEY", "vllm-s3cret")
	t.Setenv("KVMESH_GOSSIP_KEY", "gossip-s3cret")
	for _, tc := range []struct {
		args []string
		env  string
	}{
		{[]string{"sim", "--typo"}, ""}, {[]string{"sim", "-h"}, "VLLM_API_KEY"},
		{[]string{"orchestrator", "--local", "x.yaml", "--typo"}, ""}, {[]string{"orchestrator", "--local", "x.yaml", "-h"}, "KVMESH_GOSSIP_KEY"},
	} {
		var out, errOut testutil.SyncBuffer
		run(tc.args, &out, &errOut)
		all := out.String() + errOut.String()
		if strings.Contains(all, "s3cret") || tc.env != "" && !strings.Contains(all, "(env "+tc.env+"; set)") {
			t.Errorf("%v: output shows a secret or not that it is set:\n%s", tc.args, all)
		}
	}
}

// Every setting of the config file holds unless its flag is given: the
// replica id and the gossip settings were written over by their flags'
// empty defaults, so a replica configured for gossip started without it,
// under a random id, and with gossipSeeds set was refused as having seeds
// without a bind address.
func TestConfigFileGossipAndIDKept(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	doc := "id: ing-7\ncluster:\n  gossipBind: 127.0.0.1:7946\n  gossipAdvertise: 10.0.0.7\n  gossipProfile: local\n  gossipSeeds: [127.0.0.1:7947]\n"
	if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	o, err := ingressOptions([]string{"--config", p}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c := o.Config; c.ID != "ing-7" || c.Cluster.GossipBind != "127.0.0.1:7946" || c.Cluster.GossipAdvertise != "10.0.0.7" || c.Cluster.GossipProfile != "local" {
		t.Fatalf("from the config file: id %q, gossip bind %q, advertise %q, profile %q", c.ID, c.Cluster.GossipBind, c.Cluster.GossipAdvertise, c.Cluster.GossipProfile)
	}
	o, err = ingressOptions([]string{"--config", p, "--id", "ing-8", "--gossip-profile", "wan"}, io.Discard)
	if err != nil || o.Config.ID != "ing-8" || o.Config.Cluster.GossipProfile != "wan" || o.Config.Cluster.GossipBind != "127.0.0.1:7946" {
		t.Fatalf("flags over the file: %+v, %v", o.Config.Cluster, err)
	}
}

// Static engines are not used with gossip (the sidecars list the engines):
// both given is refused by name, where the static ones were dropped and
// every request got 503 "no live engines".
func TestStaticEnginesWithGossipRefused(t *testing.T) {
	_, err := ingressOptions([]string{"--engine", "e=m=http://127.0.0.1:1", "--gossip-bind", "127.0.0.1:0"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "static engines (--engine") {
		t.Fatalf("--engine with --gossip-bind: %v, want refused naming both", err)
	}
	if _, err := ingressOptions([]string{"--engine", "e=m=http://127.0.0.1:1"}, io.Discard); err != nil {
		t.Fatalf("--engine alone: %v", err)
	}
}

// The admin token from the environment is refused without --admin, as the
// flag is: it was believed silently, and /metrics stayed open on the
// client port.
func TestAdminTokenEnvWithoutAdminRefused(t *testing.T) {
	t.Setenv("KVMESH_ADMIN_TOKEN", "s3cret")
	_, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "$KVMESH_ADMIN_TOKEN) is not read without --admin") {
		t.Fatalf("$KVMESH_ADMIN_TOKEN without --admin: %v, want refused", err)
	}
	o, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--admin", "127.0.0.1:0"}, io.Discard)
	if err != nil || o.Config.AdminToken != "s3cret" {
		t.Fatalf("$KVMESH_ADMIN_TOKEN with --admin: %v, token read %v", err, o.Config.AdminToken != "")
	}
}

// --policy and --scheduler-config both given are refused: the later of the
// two won, so the policy depended on the flags' order and, with --policy
// last, ran with the rest of the file's settings.
func TestPolicyWithSchedulerConfigRefused(t *testing.T) {
	p := filepath.Join(t.TempDir(), "s.yaml")
	if err := os.WriteFile(p, []byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\npolicy: kvmesh\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{{"--scheduler-config", p, "--policy", "random"}, {"--policy", "random", "--scheduler-config", p}} {
		_, err := ingressOptions(append([]string{"--engine", "m=http://127.0.0.1:1"}, args...), io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--policy and --scheduler-config are both given") {
			t.Errorf("%v: %v, want refused", args, err)
		}
	}
	o, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1", "--scheduler-config", p}, io.Discard)
	if err != nil || o.Config.Scheduler.Policy != "kvmesh" {
		t.Fatalf("--scheduler-config alone: %v, policy %q", err, o.Config.Scheduler.Policy)
	}
}

// $KVMESH_ENGINE_API_KEY wins over the config file's engineAPIKey, as the
// other settings from the environment do: a rotated Secret under a key left
// in the YAML kept the old key going out.
func TestEngineAPIKeyEnvOverConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.yaml")
	if err := os.WriteFile(p, []byte("engineAPIKey: old\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	args := []string{"--config", p, "--engine", "m=http://127.0.0.1:1"}
	t.Setenv("KVMESH_ENGINE_API_KEY", "new")
	if o, err := ingressOptions(args, io.Discard); err != nil || o.Config.EngineAPIKey != "new" {
		t.Fatalf("env new over config old: %v, the env's key sent %v", err, o.Config.EngineAPIKey == "new")
	}
	t.Setenv("KVMESH_ENGINE_API_KEY", "")
	if o, err := ingressOptions(args, io.Discard); err != nil || o.Config.EngineAPIKey != "old" {
		t.Fatalf("no env: %v, the config's key sent %v", err, o.Config.EngineAPIKey == "old")
	}
}
