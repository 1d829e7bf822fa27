package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/kvmesh/kvmesh/orchestrator/local"
)

// localMode reports whether args ask for the local backend (--local FILE).
func localMode(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "-local" || a == "--local" || strings.HasPrefix(a, "-local=") || strings.HasPrefix(a, "--local=") {
			return true
		}
	}
	return false
}

// runLocalOrchestrator is `kvmesh orchestrator --local FILE`: the file's
// ModelDeployments and AutoscalingPolicies run as `kvmesh sim` + `kvmesh
// sidecar` children of this process on loopback (orchestrator/local).
func runLocalOrchestrator(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	cfg := local.DefaultConfig()
	fs := newFlagSet("orchestrator --local", stderr)
	var probs flagProblems
	fs.StringVar(&cfg.File, "local", "", "YAML file with ModelDeployments and AutoscalingPolicies (multi-document); re-read when it changes")
	fs.StringVar(&cfg.NATSURL, "nats-url", "", "NATS URL for the sidecars and the ingress (empty: an embedded server)")
	fs.BoolVar(&cfg.Ingress, "ingress", false, "also run an ingress in front of the engines (or annotate a ModelDeployment kvmesh.io/local-ingress: \"true\")")
	fs.StringVar(&cfg.IngressListen, "ingress-listen", cfg.IngressListen, "the ingress's client address (port 0: a free port)")
	fs.StringVar(&cfg.PDPolicy, "pd-policy", cfg.PDPolicy, "the ingress's --pd-policy when roles are prefill/decode")
	fs.DurationVar(&cfg.Interval, "interval", cfg.Interval, "how often policies are stepped, crashed children restarted and the status written")
	fs.DurationVar(&cfg.DrainTimeout, "drain-timeout", cfg.DrainTimeout, "how long a scaled-down engine may finish its requests")
	fs.StringVar(&cfg.StatusFile, "status-file", "", "rewrite this JSON file with the status after every step")
	secretEnvFlag(fs, &cfg.GossipKey, "gossip-key", "KVMESH_GOSSIP_KEY", "comma-separated base64 gossip `keys`, the first encrypting (a rotation list), given to the children through their environment")
	exe := fs.String("exe", "", "kvmesh binary the children run (default: this one)")
	childLogs := fs.Bool("child-logs", false, "pass the children's logs through to stderr")
	quiet := fs.Bool("quiet", false, "no status lines on stdout")
	level := slog.LevelInfo
	probs.LogLevel(fs, &level)
	if err := parseFlags(fs, args, 0); err != nil {
		return err
	}
	if err := probs.err(); err != nil {
		return err
	}
	cfg.Exe = *exe
	cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *childLogs {
		cfg.ChildStderr = stderr
	}
	if !*quiet {
		var last []byte
		cfg.OnStatus = func(s local.Status) {
			var b bytes.Buffer
			_ = s.WriteText(&b)
			if bytes.Equal(b.Bytes(), last) { // print changes only
				return
			}
			last = b.Bytes()
			fmt.Fprintf(stdout, "--- %s gossip %s, nats %s%s\n", s.Time.Format("15:04:05"), s.Gossip, s.NATS, ingressNote(s))
			_, _ = stdout.Write(b.Bytes())
		}
	}
	o, err := local.New(cfg)
	if err != nil {
		return fmt.Errorf("%w: %w", errUsage, err)
	}
	return o.Run(ctx)
}

func ingressNote(s local.Status) string {
	if s.Ingress == "" {
		return ""
	}
	return ", ingress " + s.Ingress
}
