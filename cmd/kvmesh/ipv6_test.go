package main

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/epp"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sidecar"

	"go.yaml.in/yaml/v3"
)

// --engine-host and --engine-port build the engine URL with the host
// bracketed when it is IPv6, so one manifest serves both kinds of cluster.
func TestEngineHostPort(t *testing.T) {
	base := []string{"--model", "m", "--events", "tcp://127.0.0.1:5557"}
	for _, tc := range []struct {
		args []string
		url  string // "" : refused
		err  string
	}{
		{[]string{"--engine-host", "10.0.0.5", "--engine-port", "8000"}, "http://10.0.0.5:8000", ""},
		{[]string{"--engine-host", "fd00::1", "--engine-port", "8000"}, "http://[fd00::1]:8000", ""},
		{[]string{"--engine-host", "[fd00::1]", "--engine-port", "8000"}, "http://[fd00::1]:8000", ""},
		{[]string{"--engine-host", "engine-0.example", "--engine-port", "8000"}, "http://engine-0.example:8000", ""},
		{[]string{"--engine-url", "http://10.0.0.5:8000"}, "http://10.0.0.5:8000", ""},
		{[]string{"--engine-host", "10.0.0.5"}, "", "--engine-host and --engine-port go together"},
		{[]string{"--engine-port", "8000"}, "", "--engine-host and --engine-port go together"},
		{[]string{"--engine-host", "10.0.0.5", "--engine-port", "8000", "--engine-url", "http://10.0.0.5:8000"}, "", "not both"},
		{[]string{"--engine-host", "10.0.0.5:8000", "--engine-port", "8000"}, "", `--engine-host "10.0.0.5:8000"`},
		{[]string{"--engine-host", "fd00::1:8000:x", "--engine-port", "8000"}, "", "without a port"},
		{[]string{"--engine-host", "10.0.0.5", "--engine-port", "70000"}, "", "--engine-port 70000"},
	} {
		o, err := sidecarOptions(append(append([]string{}, base...), tc.args...), io.Discard)
		switch {
		case tc.url != "" && (err != nil || o.Engine.URL != tc.url):
			t.Errorf("%v: url %q, %v; want %s", tc.args, o.Engine.URL, err, tc.url)
		case tc.url == "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%v: %v, want an error with %q", tc.args, err, tc.err)
		}
	}
}

// TestManifestsOnIPv6: the kvmesh containers of the shipped manifests
// build a valid configuration whether the pod or node IP is IPv4 or IPv6
// (Kubernetes expands $(POD_IP) and $(NODE_IP) into the arguments
// verbatim, and http://fd00::1:8000 or fd00::1:7946 would be no address).
func TestManifestsOnIPv6(t *testing.T) {
	kubectl := testutil.RequireTool(t, "kubectl", "it renders the kustomize overlays")
	envRef := regexp.MustCompile(`\$\(([A-Z_]+)\)`)
	for _, podIP := range []string{"10.0.0.1", "fd00:10:244:1::2a"} {
		for _, dir := range []string{"base", "install", "overlays/sidecar-container", "overlays/daemonset", "gateway/base"} {
			t.Run(podIP+"/"+dir, func(t *testing.T) {
				out, err := exec.Command(kubectl, "kustomize", filepath.Join("..", "..", "manifests", dir)).Output()
				if err != nil {
					t.Fatalf("kubectl kustomize %s: %v", dir, err)
				}
				dec := yaml.NewDecoder(bytes.NewReader(out))
				for {
					var doc map[string]any
					if err := dec.Decode(&doc); errors.Is(err, io.EOF) {
						break
					} else if err != nil {
						t.Fatal(err)
					}
					for _, c := range containers(doc) {
						if image, _ := c["image"].(string); !strings.Contains(image, "kvmesh/kvmesh") {
							continue
						}
						var args []string
						for _, a := range c["args"].([]any) {
							args = append(args, envRef.ReplaceAllStringFunc(a.(string), func(ref string) string {
								if ref == "$(POD_IP)" || ref == "$(NODE_IP)" {
									return podIP
								}
								return "x"
							}))
						}
						if err := buildArgs(args); err != nil {
							t.Errorf("kvmesh %s: %v", strings.Join(args, " "), err)
						}
					}
				}
			})
		}
	}
}

// engineAddrsSplit checks that every engine's URL and tcp:// endpoints
// split into host and port as written: url.Parse and ZMQ take
// http://fd00::1:8000 and tcp://fd00::1:5557 (split at the last colon),
// where the IPv6 address is unbracketed and so the whole of fd00::1:8000.
func engineAddrsSplit(cfg sidecar.Config) error {
	for _, e := range cfg.Engines {
		u, err := url.Parse(e.URL)
		if err != nil {
			return err
		}
		addrs := map[string]string{"url": u.Host}
		for name, ep := range map[string]string{"events": e.Events, "replay": e.Replay} {
			if hp, ok := strings.CutPrefix(ep, "tcp://"); ok {
				addrs[name] = hp
			}
		}
		for name, hp := range addrs {
			if _, _, err := net.SplitHostPort(hp); err != nil {
				return fmt.Errorf("engine %s %s: %w", e.ID, name, err)
			}
		}
	}
	return nil
}

// buildArgs checks a kvmesh container's arguments as far as its command
// does before it connects to anything.
func buildArgs(args []string) error {
	switch args[0] {
	case "sidecar":
		o, err := sidecarOptions(args[1:], io.Discard)
		if err != nil {
			return err
		}
		cfg, err := o.Build(slog.New(slog.DiscardHandler))
		if err == nil {
			err = cfg.Validate()
		}
		if err == nil {
			err = engineAddrsSplit(cfg)
		}
		return err
	case "ingress":
		_, err := ingressOptions(args[1:], io.Discard)
		return err
	case "epp": // runEPP's reading of its flags
		opts := epp.DefaultOptions()
		fs := newFlagSet("epp", io.Discard)
		var probs flagProblems
		ingressFlags(fs, &opts.Ingress, &probs)
		eppFlags(fs, &opts)
		if err := parseFlags(fs, args[1:], 0); err != nil {
			return err
		}
		probs.addErr(opts.Validate())
		return probs.err()
	}
	return nil
}
