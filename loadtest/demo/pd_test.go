package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// TestRunPD runs `kvmesh demo --pd` small: every mode serves every request
// through the ingress and real NIXL side channels, and the table lists
// each mode.
func TestRunPD(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cfg := PDConfig{Workload: workload.SharedPrefix{Groups: 4, Prompts: 4, Shared: 512, Question: 256, Output: 8, Seed: 1},
		Concurrency: 4, TimeScale: 20}
	res, err := RunPD(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range PDModes {
		r := res.Runs[m]
		if r == nil || r.Completed != 16 || r.Failed != 0 {
			t.Fatalf("%s: %+v", m, r)
		}
	}
	var b bytes.Buffer
	if err := res.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	for _, m := range PDModes {
		if !strings.Contains(b.String(), m) {
			t.Fatalf("table lacks %s:\n%s", m, b.String())
		}
	}
	if _, err := RunPD(ctx, PDConfig{Modes: []string{"nope"}}); err == nil {
		t.Fatal("unknown mode accepted")
	}
}
