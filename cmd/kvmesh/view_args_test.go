package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestViewArgsKubectlSpellings: kvmesh get/describe take -n and -A as kubectl
// does, flags before or after the names, and without -n use the kubeconfig's
// current context's namespace (else "default").
func TestViewArgsKubectlSpellings(t *testing.T) {
	dir := t.TempDir()
	write := func(name, ctxNS string) string {
		p := filepath.Join(dir, name)
		ns := ""
		if ctxNS != "" {
			ns = "\n    namespace: " + ctxNS
		}
		cfg := `apiVersion: v1
kind: Config
clusters:
- name: c
  cluster: {server: "https://127.0.0.1:1"}
users:
- name: u
  user: {token: t}
contexts:
- name: x
  context:
    cluster: c
    user: u` + ns + `
current-context: x
`
		if err := os.WriteFile(p, []byte(cfg), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	withNS, withoutNS := write("with", "models"), write("without", "")
	for _, c := range []struct {
		verb string
		args []string
		pos  []string
		ns   string
		all  bool
	}{
		{"get", []string{"md", "-n", "team-a", "--kubeconfig", withNS}, []string{"md"}, "team-a", false},
		{"get", []string{"-n", "team-a", "md", "x", "--kubeconfig", withNS}, []string{"md", "x"}, "team-a", false},
		{"get", []string{"md", "--namespace", "team-b", "--kubeconfig", withNS}, []string{"md"}, "team-b", false},
		{"get", []string{"md", "-A", "--kubeconfig", withNS}, []string{"md"}, "models", true},
		{"get", []string{"asp", "--all-namespaces", "--kubeconfig", withoutNS}, []string{"asp"}, "default", true},
		{"describe", []string{"md", "x", "--kubeconfig", withNS}, []string{"md", "x"}, "models", false},
		{"describe", []string{"md", "x", "--kubeconfig", withoutNS}, []string{"md", "x"}, "default", false},
	} {
		o, err := parseViewArgs(c.verb, c.args, io.Discard)
		if err != nil {
			t.Errorf("%s %q: %v", c.verb, c.args, err)
			continue
		}
		if !slices.Equal(o.pos, c.pos) || o.namespace != c.ns || o.all != c.all {
			t.Errorf("%s %q: names %q namespace %q all %v, want %q %q %v", c.verb, c.args, o.pos, o.namespace, o.all, c.pos, c.ns, c.all)
		}
	}
}

// TestViewArgsAllNamespacesWithName: -A lists; with a name (get NAME, or
// describe, which always names one) it would be ignored, so it is refused.
func TestViewArgsAllNamespacesWithName(t *testing.T) {
	for _, c := range []struct {
		verb string
		args []string
	}{
		{"get", []string{"md", "x", "-A"}},
		{"describe", []string{"md", "x", "--all-namespaces"}},
	} {
		if _, err := parseViewArgs(c.verb, c.args, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "--all-namespaces") {
			t.Errorf("%s %q: %v, want a usage error naming --all-namespaces", c.verb, c.args, err)
		}
	}
}

// TestViewArgsNamespaceAndAll: -n with -A named a namespace -A then
// ignored; refused, in either order and spelling.
func TestViewArgsNamespaceAndAll(t *testing.T) {
	for _, args := range [][]string{{"md", "-A", "-n", "foo"}, {"md", "--namespace", "foo", "--all-namespaces"}, {"-n", "foo", "md", "-A"}} {
		if _, err := parseViewArgs("get", args, io.Discard); !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "not both") {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}

// TestBootstrapNamespaces: an empty namespace (every path then
// cluster-scoped) or one the API server would refuse, and an unknown flag,
// are usage errors found before any API call.
func TestBootstrapNamespaces(t *testing.T) {
	for _, args := range [][]string{{"--namespace", ""}, {"--engine-namespaces", "ok,Not_OK"}, {"--bogus"}} {
		err := runBootstrap(context.Background(), append([]string{"--kubeconfig", "/nonexistent"}, args...), io.Discard, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Errorf("%q: %v, want a usage error", args, err)
		}
	}
}
