package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// --state-over-nats defaults to on, turns the lane off with =false, and is
// refused by name where there is no lane to turn off.
func TestStateOverNATSFlag(t *testing.T) {
	base := []string{"--engine", "m=http://127.0.0.1:1"}
	for _, c := range []struct {
		args []string
		want []string
	}{
		{[]string{"--state-over-nats=false"}, []string{"--state-over-nats is not read without --nats"}},
		{[]string{"--nats", "nats://127.0.0.1:1", "--state-over-nats=false"}, []string{"--state-over-nats is not read without --gossip-bind"}},
		{[]string{"--nats", "nats://127.0.0.1:1", "--gossip-bind", "127.0.0.1:0", "--state-over-nats=false"}, nil},
	} {
		_, err := ingressOptions(ingressArgs(base, c.args), io.Discard)
		checkRefused(t, c.args, err, c.want)
	}
	for _, c := range []struct {
		args []string
		off  bool
	}{
		{nil, false},
		{[]string{"--state-over-nats=false"}, true},
		{[]string{"--state-over-nats"}, false},
	} {
		args := append([]string{"--nats", "nats://127.0.0.1:1", "--gossip-bind", "127.0.0.1:0"}, c.args...)
		o, err := ingressOptions(ingressArgs(base, args), io.Discard)
		if err != nil || o.Config.Cluster.StateOverNATSOff != c.off {
			t.Errorf("ingress %v: off %v, err %v; want off %v", c.args, o.Config.Cluster.StateOverNATSOff, err, c.off)
		}
		so, err := sidecarOptions(append([]string{"--model", "m", "--engine-url", "http://127.0.0.1:1", "--events", "tcp://127.0.0.1:1"}, args...), io.Discard)
		if err != nil || so.Config.StateOverNATSOff != c.off {
			t.Errorf("sidecar %v: off %v, err %v; want off %v", c.args, so.Config.StateOverNATSOff, err, c.off)
		}
	}
	_, err := sidecarOptions([]string{"--model", "m", "--state-over-nats=false"}, io.Discard)
	checkRefused(t, []string{"--state-over-nats=false"}, err, []string{"--state-over-nats is not read without --gossip-bind"})
}

// $KVMESH_STATE_OVER_NATS sets the default (an older kvmesh ignores the
// variable, where it exits on the flag); the flag wins over it, and a bad
// value is refused unless the flag replaces it.
func TestStateOverNATSEnv(t *testing.T) {
	args := []string{"--nats", "nats://127.0.0.1:1", "--gossip-bind", "127.0.0.1:0"}
	for _, c := range []struct {
		env  string
		args []string
		off  bool
		want string
	}{
		{"false", nil, true, ""},
		{"0", nil, true, ""},
		{"true", nil, false, ""},
		{"false", []string{"--state-over-nats=true"}, false, ""},
		{"true", []string{"--state-over-nats=false"}, true, ""},
		{"nope", nil, false, `KVMESH_STATE_OVER_NATS="nope": not a boolean (from the environment)`},
		{"nope", []string{"--state-over-nats=false"}, true, ""},
	} {
		t.Setenv(stateLaneEnv, c.env)
		o, err := ingressOptions(append(append([]string(nil), args...), c.args...), io.Discard)
		badEnv(t, c.env, err, c.want)
		if c.want == "" && o.Config.Cluster.StateOverNATSOff != c.off {
			t.Errorf("ingress env %q %v: off %v; want %v", c.env, c.args, o.Config.Cluster.StateOverNATSOff, c.off)
		}
		so, err := sidecarOptions(append([]string{"--model", "m", "--engine-url", "http://127.0.0.1:1", "--events", "tcp://127.0.0.1:1", "--gossip-bind", "127.0.0.1:0", "--nats", "nats://127.0.0.1:1"}, c.args...), io.Discard)
		badEnv(t, c.env, err, c.want)
		if c.want == "" && so.Config.StateOverNATSOff != c.off {
			t.Errorf("sidecar env %q %v: off %v; want %v", c.env, c.args, so.Config.StateOverNATSOff, c.off)
		}
	}
	// Set in the environment of a member without a lane: not refused (the
	// variable is for every pod; the flag is what is refused by name).
	t.Setenv(stateLaneEnv, "false")
	if _, err := ingressOptions([]string{"--engine", "m=http://127.0.0.1:1"}, io.Discard); err != nil {
		t.Errorf("env without a lane refused: %v", err)
	}
}

func badEnv(t *testing.T, env string, err error, want string) {
	t.Helper()
	switch {
	case want == "" && err != nil:
		t.Errorf("env %q: %v", env, err)
	case want != "" && (!errors.Is(err, errUsage) || !strings.Contains(err.Error(), want)):
		t.Errorf("env %q: err %v; want a usage error with %q", env, err, want)
	}
}
