package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestLoadtestCommand points `kvmesh loadtest` at a real simulator on loopback.
func TestLoadtestCommand(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	prof, err := engine.LookupProfile("tiny")
	if err != nil {
		t.Fatal(err)
	}
	s, err := sim.Start(ctx, sim.Config{Model: "m", HTTPAddr: "127.0.0.1:0", TimeScale: 50,
		Engine: engine.Config{BlockSize: 16, GPUBlocks: 1024, Profile: prof}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var out, errOut bytes.Buffer
	err = runLoadtest(ctx, []string{"-url", s.URL(), "-model", "m", "-groups", "2", "-prompts", "4", "-shared", "64",
		"-question", "16", "-output", "4", "-concurrency", "1", "-json"}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	var rep struct {
		Completed     int     `json:"completed"`
		PromptTokens  int     `json:"prompt_tokens"`
		OutputTokens  int     `json:"output_tokens"`
		PrefixHitRate float64 `json:"prefix_hit_rate"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil {
		t.Fatalf("%v: %s", err, out.String())
	}
	// One request at a time: each group's first prompt misses, the next three hit the
	// 64 shared tokens (4 full blocks).
	if rep.Completed != 8 || rep.PromptTokens != 8*80 || rep.OutputTokens != 8*4 {
		t.Fatalf("report %+v", rep)
	}
	if want := float64(6*64) / float64(8*80); rep.PrefixHitRate != want {
		t.Fatalf("hit rate %v, want %v", rep.PrefixHitRate, want)
	}
	if !strings.Contains(errOut.String(), "8/8 done") {
		t.Fatalf("no final progress line: %q", errOut.String())
	}
}

func TestLoadtestAndDemoUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		run  func(context.Context, []string, io.Writer, io.Writer) error
		args []string
	}{
		{runLoadtest, []string{"-workload", "nope"}},
		{runLoadtest, []string{"-url", "ftp://x"}},
		{runLoadtest, []string{"extra"}},
		{runLoadtest, []string{"-no-such-flag"}},
		{runLoadtest, []string{"-workload", "mooncake", "-trace-rate-scale", "0"}},
		{runLoadtest, []string{"-workload", "mooncake", "-trace-rate-scale", "-2"}},
		{runLoadtest, []string{"-workload", "mooncake", "-trace-rate-scale", "NaN"}},
		{runDemo, []string{"-engines", "0"}},
		{runDemo, []string{"-policies", "random,random"}},
		{runDemo, []string{"-no-such-flag"}},
	} {
		var out, errOut bytes.Buffer
		if err := tc.run(context.Background(), tc.args, &out, &errOut); !errors.Is(err, errUsage) {
			t.Errorf("%v: err = %v, want a usage error", tc.args, err)
		}
	}
}

// TestDemoAndLoadtestFlagsNotRead: each kind of demo, and the load
// generator for each workload, refuses by name the flags it would ignore
// (before: `kvmesh demo --pd --engines 8` ran 2 + 2 engines, `kvmesh
// loadtest -trace t.jsonl` sent the shared-prefix workload).
func TestDemoAndLoadtestFlagsNotRead(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
		run  func(context.Context, []string, io.Writer, io.Writer) error
	}{
		{[]string{"-trace", "t.jsonl", "-trace-rate-scale", "2"},
			[]string{"--trace is not read by a -workload shared-prefix run", "--trace-rate-scale is not read"}, runLoadtest},
		{[]string{"-workload", "sharegpt", "-groups", "3", "-output", "4", "-trace-block-size", "2"},
			[]string{"--groups is not read by a -workload sharegpt run", "--output is not read", "--trace-block-size is not read"}, runLoadtest},
		{[]string{"-workload", "mooncake", "-shared", "3"}, []string{"--shared is not read by a -workload mooncake run"}, runLoadtest},
		// Bad values and unwritable report files, before anything is sent.
		{[]string{"-rate", "-2"}, []string{"rate -2 (want requests/s ≥ 0, or -1 for a closed loop)"}, runLoadtest},
		{[]string{"-rate", "NaN"}, []string{"rate NaN"}, runLoadtest},
		{[]string{"-html", "/nonexistent-dir/r.html"}, []string{"-html /nonexistent-dir/r.html: cannot create the file"}, runLoadtest},
		{[]string{"--pd", "--engines", "8", "--policies", "random", "--rate", "3", "--peak-rate", "2"},
			[]string{"--engines is not read by a --pd run", "--policies is not read", "--rate is not read", "--peak-rate is not read"}, nil},
		{[]string{"--autoscale", "--groups", "3", "--json", "--pd-prefill", "1"},
			[]string{"--groups is not read by a --autoscale run", "--json is not read", "--pd-prefill is not read"}, nil},
		{[]string{"--pd-decode", "3", "--duration", "1s"},
			[]string{"--pd-decode is not read by a demo run", "--duration is not read"}, nil},
	} {
		if tc.run == nil {
			tc.run = runDemo
		}
		var out, errOut bytes.Buffer
		err := tc.run(context.Background(), tc.args, &out, &errOut)
		if !errors.Is(err, errUsage) || out.Len() > 0 {
			t.Errorf("%v: err %v, stdout %q; want a usage error and nothing run", tc.args, err, out.String())
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: %v does not say %q", tc.args, err, w)
			}
		}
	}
}
