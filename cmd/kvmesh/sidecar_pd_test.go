package main

import (
	"errors"
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

// A sidecar flag whose feature is off is refused by name: the one-engine
// flags beside DaemonSet-mode specs and without their engine, gossip's without --gossip-bind,
// the NATS connection's without --nats; with the feature on they are read.
func TestSidecarFlagsNotRead(t *testing.T) {
	spec := "--engine=id=a,model=m,url=http://127.0.0.1:1,events=tcp://127.0.0.1:1"
	one := []string{"--model", "m", "--engine-url", "http://127.0.0.1:1", "--events", "tcp://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--role", "prefill", "--dp-size", "2"},
			[]string{"--dp-size is not read without --model, --engine-url or --events", "--role is not read without --model"}},
		// The one-engine form beside DaemonSet specs: refused by name, flag
		// by flag, where --model alone failed as a nameless engine and a
		// whole one-engine set ran beside the specs.
		{[]string{spec, "--role", "prefill", "--dp-size", "2"},
			[]string{"--dp-size is not read beside DaemonSet --engine specs", "--role is not read beside DaemonSet --engine specs"}},
		{[]string{spec, "--model", "m"}, []string{"--model is not read beside DaemonSet --engine specs"}},
		{append([]string{spec}, one...), []string{"--model is not read beside", "--engine-url is not read beside", "--events is not read beside"}},
		{[]string{spec, "--engine-host", "10.0.0.1", "--engine-port", "8000", "--engine-id", "x"},
			[]string{"--engine-host is not read beside", "--engine-port is not read beside", "--engine-id is not read beside"}},
		{[]string{spec, "--engine", "id=b,model=m,url=http://127.0.0.1:2,events=tcp://127.0.0.1:2,role=prefill,dp=2"}, nil},
		{append([]string{"--role", "prefill", "--dp-size", "2"}, one...), nil},
		{append([]string{"--tokenizer-revision", "r1"}, one...), []string{"--tokenizer-revision is not read without --tokenizer-dir"}},
		{append([]string{"--gossip-advertise", "10.0.0.1", "--node-name", "n"}, one...),
			[]string{"--gossip-advertise is not read without --gossip-bind", "--node-name is not read without --gossip-bind"}},
		{append([]string{"--gossip-bind", "127.0.0.1:0", "--gossip-advertise", "10.0.0.1", "--node-name", "n"}, one...), nil},
		{append([]string{"--nats-user", "u", "--nats-creds", "/c"}, one...),
			[]string{"--nats-creds is not read without --nats", "--nats-user is not read without --nats"}},
		{append([]string{"--nats", "nats://127.0.0.1:1", "--nats-user", "u"}, one...), nil},
		{append([]string{"--nats", "nats://127.0.0.1:1", "--embedded-nats-port", "4333"}, one...),
			[]string{"--embedded-nats-port is not read with --nats"}},
		{append([]string{"--embedded-nats-port", "4333"}, one...), nil},
	} {
		_, err := sidecarOptions(c.args, io.Discard)
		checkRefused(t, c.args, err, c.want)
	}

	// The embedded server's port, for the ingresses of one machine; a
	// bad one is a usage error.
	o, err := sidecarOptions(append([]string{"--embedded-nats-port", "4333"}, one...), io.Discard)
	if err != nil || o.Config.NATS.Embedded.Port != 4333 {
		t.Fatalf("--embedded-nats-port 4333: port %d, %v", o.Config.NATS.Embedded.Port, err)
	}
	if o, err := sidecarOptions(one, io.Discard); err != nil || o.Config.NATS.Embedded.Port != -1 {
		t.Fatalf("no --embedded-nats-port: port %d (want -1, a free one), %v", o.Config.NATS.Embedded.Port, err)
	}
	for _, bad := range []string{"0", "65536", "x"} {
		if _, err := sidecarOptions(append([]string{"--embedded-nats-port", bad}, one...), io.Discard); !errors.Is(err, errUsage) {
			t.Errorf("--embedded-nats-port %s: %v, want a usage error", bad, err)
		}
	}
}
