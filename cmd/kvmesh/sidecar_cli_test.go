package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// TestSidecarEveryProblemAtOnce: `kvmesh sidecar` lists the flags'
// problems and the configuration's in one usage error, as the ingress
// does. It used to stop at the flags' (a bad --stream-replicas or
// --gossip-key hid a bad --role and --resync-policy until the next run).
func TestSidecarEveryProblemAtOnce(t *testing.T) {
	one := []string{"--admin", "127.0.0.1:0", "--model", "m", "--engine-url", "http://127.0.0.1:1", "--events", "tcp://127.0.0.1:2"}
	for _, flagProblem := range [][]string{
		{"--stream-replicas", "7"},
		{"--gossip-bind", "127.0.0.1:0", "--gossip-key", "abc"},
	} {
		args := append(append(append([]string(nil), one...), "--role", "bogus", "--resync-policy", "x"), flagProblem...)
		_, err := sidecarOptions(args, io.Discard)
		if !errors.Is(err, errUsage) {
			t.Fatalf("%q: %v, want a usage error", args, err)
		}
		for _, want := range []string{flagProblem[len(flagProblem)-2], `role "bogus"`, `resync policy "x"`} {
			if !strings.Contains(err.Error(), want) {
				t.Errorf("%q: %q lacks %q", args, err, want)
			}
		}
		if strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %q spans lines", args, err)
		}
	}
	if _, err := sidecarOptions(one, io.Discard); err != nil {
		t.Errorf("%q: %v", one, err)
	}
}
