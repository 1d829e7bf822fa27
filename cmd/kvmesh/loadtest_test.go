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
