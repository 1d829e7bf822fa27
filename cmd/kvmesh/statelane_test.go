package main

import (
	"io"
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
		_, err := ingressOptions(append(append([]string(nil), base...), c.args...), io.Discard)
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
		o, err := ingressOptions(append(append([]string(nil), base...), args...), io.Discard)
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
