package main

import (
	"flag"
	"io"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// TestListFlagsAdd: a list flag's first use replaces its default (or a
// config file's list), a repeat adds to it, as --engine does. Before, each
// use replaced the last, so "--join a --join b" kept b alone (a seed list
// become one point of failure) and "--nats a --nats b" one server.
func TestListFlagsAdd(t *testing.T) {
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	seeds := []string{"from-config:7946"}
	urls := []string{"nats://from-config:4222"}
	List(fs, &seeds, "join", "seeds")
	natsutil.BindFlags(fs, &urls, &natsutil.Auth{}, "servers")
	if err := fs.Parse([]string{"--join", "a:1", "--join", "b:2,c:3", "--nats", "nats://x:1", "--nats", "nats://y:2"}); err != nil {
		t.Fatal(err)
	}
	if want := []string{"a:1", "b:2", "c:3"}; !slices.Equal(seeds, want) {
		t.Errorf("--join = %q, want %q", seeds, want)
	}
	if want := []string{"nats://x:1", "nats://y:2"}; !slices.Equal(urls, want) {
		t.Errorf("--nats = %q, want %q", urls, want)
	}

	// Not given: the default (the config's list) stays.
	fs = flag.NewFlagSet("t", flag.ContinueOnError)
	seeds = []string{"from-config:7946"}
	List(fs, &seeds, "join", "seeds")
	if err := fs.Parse(nil); err != nil || !slices.Equal(seeds, []string{"from-config:7946"}) {
		t.Errorf("no --join: %q, %v", seeds, err)
	}
}
