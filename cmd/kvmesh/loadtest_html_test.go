package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/sim"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// TestLoadtestHTML: `kvmesh loadtest -html FILE` writes a self-contained
// report of the run (plots and table), without the command line (which
// may hold -api-key), and the progress written to a non-terminal stderr is
// plain lines.
func TestLoadtestHTML(t *testing.T) {
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
	path, csvPath := filepath.Join(t.TempDir(), "run.html"), filepath.Join(t.TempDir(), "run.csv")
	var out, errOut bytes.Buffer
	err = runLoadtest(ctx, []string{"-url", s.URL(), "-model", "m", "-api-key", "sekrit", "-groups", "2", "-prompts", "4",
		"-shared", "64", "-question", "16", "-output", "4", "-html", path, "-requests-csv", csvPath}, &out, &errOut)
	if err != nil {
		t.Fatalf("%v\n%s", err, errOut.String())
	}
	page, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{"<!DOCTYPE html>", `id="ttft-cdf"`, `id="engine-load"`, "<td>run</td>", "8 requests sent, 8 completed"} {
		if !strings.Contains(string(page), w) {
			t.Errorf("page lacks %q", w)
		}
	}
	if strings.Contains(string(page), "sekrit") {
		t.Error("the API key is in the page")
	}
	// -requests-csv: the 8 requests, each with a TTFT within its E2E, the
	// prompt's 80 tokens and 4 output tokens (no engine: the sim is not
	// behind an ingress, which names it).
	b, err := os.ReadFile(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := csv.NewReader(bytes.NewReader(b)).ReadAll()
	if err != nil || len(rows) != 9 {
		t.Fatalf("csv: %d rows, %v:\n%s", len(rows), err, b)
	}
	for _, r := range rows[1:] {
		ttft, _ := strconv.ParseFloat(r[4], 64)
		e2e, _ := strconv.ParseFloat(r[5], 64)
		if r[0] != "run" || r[1] != "" || !(ttft > 0 && ttft <= e2e) || r[7] != "80" || r[9] != "4" {
			t.Errorf("csv row %q", r)
		}
	}
	if p := errOut.String(); strings.Contains(p, "\r") || !strings.Contains(p, "8/8 done") {
		t.Errorf("progress on a buffer: %q", p)
	}
}
