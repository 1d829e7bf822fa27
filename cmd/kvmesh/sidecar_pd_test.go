package main

import (
	"io"
	"testing"

	"github.com/kvmesh/kvmesh/sidecar"
)

// TestSidecarPDFlags: the P/D group defaults to $KVMESH_PD_GROUP (the
// orchestrator's), and --pd-group, --pd-protocol and --bootstrap-port set
// the engine's P/D state.
func TestSidecarPDFlags(t *testing.T) {
	t.Setenv("KVMESH_PD_GROUP", "llama-3")
	parse := func(args ...string) sidecar.Options {
		t.Helper()
		opts := sidecar.DefaultOptions()
		fs := newFlagSet("sidecar", io.Discard)
		var probs flagProblems
		sidecarFlags(fs, &opts, &probs)
		if err := parseFlags(fs, args, 0); err != nil {
			t.Fatal(err)
		}
		if err := probs.err(); err != nil {
			t.Fatal(err)
		}
		return opts
	}
	if o := parse("--role", "decode"); o.Engine.PDGroup != "llama-3" || o.Engine.PDProtocol != "" {
		t.Fatalf("defaults: %+v", o.Engine)
	}
	o := parse("--role", "prefill", "--engine-url", "http://10.0.0.5:30000", "--pd-group", "g", "--pd-protocol", "sglang", "--bootstrap-port", "8995")
	if o.Engine.PDGroup != "g" || o.Engine.Bootstrap() != "10.0.0.5:8995" {
		t.Fatalf("flags: %+v, bootstrap %q", o.Engine, o.Engine.Bootstrap())
	}
}
