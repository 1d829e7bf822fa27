package main

import (
	"io"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/sidecar"
)

// TestSidecarStreamReplicasFlag: --stream-replicas defaults to auto, takes
// auto or a count, defaults to $KVMESH_STREAM_REPLICAS, and a bad
// environment value is a usage error only when no flag replaces it.
func TestSidecarStreamReplicasFlag(t *testing.T) {
	parse := func(args ...string) (int, error) {
		t.Helper()
		opts := sidecar.DefaultOptions()
		fs := newFlagSet("sidecar", io.Discard)
		var probs flagProblems
		sidecarFlags(fs, &opts, &probs)
		if err := parseFlags(fs, args, 0); err != nil {
			return 0, err
		}
		return opts.Config.NATS.Stream.Replicas, probs.err()
	}
	cases := []struct {
		env  string
		args []string
		want int
		bad  string
	}{
		{"", nil, natsutil.AutoReplicas, ""},
		{"", []string{"--stream-replicas", "3"}, 3, ""},
		{"", []string{"--stream-replicas", "auto"}, natsutil.AutoReplicas, ""},
		{"", []string{"--stream-replicas", "0"}, 0, "want auto or 1..5"},
		{"3", nil, 3, ""},
		{"AUTO", nil, natsutil.AutoReplicas, ""},
		{"3", []string{"--stream-replicas", "1"}, 1, ""},
		{"seven", nil, 0, "from the environment"},
		{"seven", []string{"--stream-replicas", "5"}, 5, ""},
	}
	for _, c := range cases {
		t.Setenv("KVMESH_STREAM_REPLICAS", c.env)
		got, err := parse(c.args...)
		switch {
		case c.bad != "" && (err == nil || !strings.Contains(err.Error(), c.bad)):
			t.Errorf("env %q args %v: err %v, want one naming %q", c.env, c.args, err, c.bad)
		case c.bad == "" && (err != nil || got != c.want):
			t.Errorf("env %q args %v: %d, %v; want %d", c.env, c.args, got, err, c.want)
		}
	}
}
