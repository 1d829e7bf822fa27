package main

import (
	"bytes"
	"context"
	"encoding/csv"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
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
		// Before, -limit -1 was taken as "all" for shared-prefix (mooncake refused it).
		{[]string{"-limit", "-1"}, []string{"-limit -1 (want ≥ 0; 0 = all)"}, runLoadtest},
		{[]string{"-workload", "mooncake", "-limit", "-1"}, []string{"-limit -1 (want ≥ 0; 0 = all)"}, runLoadtest},
		{[]string{"-engines", " , "}, []string{"-engines \" , \" names no engine"}, runLoadtest},
		{[]string{"-rate", "NaN"}, []string{"rate NaN"}, runLoadtest},
		{[]string{"-rate", "1e-12"}, []string{"rate 1e-12 req/s: request 1 would arrive", "past the 292 years"}, runLoadtest},
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

// fakeOpenAI is a completions server on loopback that answers request n
// (from 1) with body(n): "429" for an OpenAI-shaped rate-limit error,
// anything else written as the response's event stream.
func fakeOpenAI(t *testing.T, body func(n int) string) *httptest.Server {
	t.Helper()
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b := body(int(n.Add(1)))
		if b == "429" {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusTooManyRequests)
			w.Write(openai.AppendError(nil, "slow down", "rate_limit_exceeded", "", ""))
			return
		}
		openai.SetHeaders(w.Header())
		w.Write([]byte(b))
	}))
	t.Cleanup(srv.Close)
	return srv
}

const fakeStream = "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}]}\n\n" +
	"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":8,\"completion_tokens\":1}}\n\ndata: [DONE]\n\n"

// TestLoadtestMaxFailedRatio: a run with more failures than
// -max-failed-ratio allows (default 1 %) prints its report and fails
// (before: exit 0 with 85 % of the requests failed); at or under the
// ratio it succeeds; a ratio outside [0, 1] is a usage error.
func TestLoadtestMaxFailedRatio(t *testing.T) {
	srv := fakeOpenAI(t, func(n int) string {
		if n%4 == 0 {
			return "429"
		}
		return fakeStream
	})
	args := []string{"-url", srv.URL, "-model", "m", "-groups", "2", "-prompts", "4", "-shared", "4", "-question", "4",
		"-output", "1", "-concurrency", "1", "-rate", "-1", "-quiet"}
	for _, c := range []struct {
		extra []string
		fail  bool
	}{
		{nil, true},
		{[]string{"-max-failed-ratio", "0.2"}, true},
		{[]string{"-max-failed-ratio", "0.25"}, false},
		{[]string{"-max-failed-ratio", "1"}, false},
	} {
		var out, errOut bytes.Buffer
		err := runLoadtest(context.Background(), append(append([]string{}, args...), c.extra...), &out, &errOut)
		if !strings.Contains(out.String(), "8 sent, 6 completed, 2 failed") {
			t.Errorf("%v: no report on stdout: %q", c.extra, out.String())
		}
		if c.fail != (err != nil) || errors.Is(err, errUsage) {
			t.Errorf("%v: err %v, want failure %v", c.extra, err, c.fail)
		} else if c.fail && !strings.Contains(err.Error(), "2 of 8 requests failed (25.0 %), more than -max-failed-ratio") ||
			c.fail && !strings.Contains(err.Error(), "http_429 2 (first: slow down)") {
			t.Errorf("%v: %v does not say how many failed, the ratio and why", c.extra, err)
		}
	}
	for _, bad := range []string{"-0.1", "1.5", "NaN"} {
		var out, errOut bytes.Buffer
		err := runLoadtest(context.Background(), append(append([]string{}, args...), "-max-failed-ratio", bad), &out, &errOut)
		if !errors.Is(err, errUsage) || !strings.Contains(err.Error(), "-max-failed-ratio") || out.Len() > 0 {
			t.Errorf("-max-failed-ratio %s: err %v, stdout %q; want a usage error before any request", bad, err, out.String())
		}
	}
}

// TestLoadtestStrictSSE: by default a stream in a framing the SSE standard
// allows but vLLM does not write completes and is counted; -strict-sse
// makes it a stream error.
func TestLoadtestStrictSSE(t *testing.T) {
	srv := fakeOpenAI(t, func(int) string { return strings.ReplaceAll(fakeStream, "data: ", "data:") })
	args := []string{"-url", srv.URL, "-model", "m", "-groups", "1", "-prompts", "2", "-shared", "4", "-question", "4",
		"-output", "1", "-rate", "-1", "-quiet", "-json"}
	var out, errOut bytes.Buffer
	if err := runLoadtest(context.Background(), args, &out, &errOut); err != nil {
		t.Fatalf("lenient: %v", err)
	}
	var rep struct {
		Completed       int            `json:"completed"`
		NonCanonicalSSE int            `json:"non_canonical_sse"`
		Errors          map[string]int `json:"errors"`
	}
	if err := json.Unmarshal(out.Bytes(), &rep); err != nil || rep.Completed != 2 || rep.NonCanonicalSSE != 2 {
		t.Fatalf("lenient: %v %+v", err, rep)
	}
	out.Reset()
	err := runLoadtest(context.Background(), append(args, "-strict-sse"), &out, &errOut)
	rep.Errors = nil
	if jerr := json.Unmarshal(out.Bytes(), &rep); err == nil || jerr != nil || rep.Errors["stream"] != 2 {
		t.Fatalf("-strict-sse: err %v, report %+v (%v)", err, rep, jerr)
	}
}

// TestLoadtestEnginesAndFailedRows: through a router whose every answer
// names engine e1, the load imbalance is null over the one engine that
// answered (before: 1, a perfect balance, with e2 down and ejected) and
// says so; -engines e1,e2 counts e2's 0 (imbalance 2). -requests-csv
// writes the failed requests too, with their error kind (before, left
// out: a reader of the CSV saw only the successes).
func TestLoadtestEnginesAndFailedRows(t *testing.T) {
	var n atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Kvmesh-Engine", "e1")
		if n.Add(1)%4 == 0 {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusInternalServerError)
			w.Write(openai.AppendError(nil, "engine fell over", "server_error", "", ""))
			return
		}
		openai.SetHeaders(w.Header())
		w.Write([]byte(fakeStream))
	}))
	t.Cleanup(srv.Close)
	csvPath := filepath.Join(t.TempDir(), "r.csv")
	args := []string{"-url", srv.URL, "-model", "m", "-groups", "1", "-prompts", "4", "-shared", "4", "-question", "4",
		"-output", "1", "-concurrency", "1", "-rate", "-1", "-quiet", "-json", "-max-failed-ratio", "1"}
	run := func(extra ...string) map[string]any {
		t.Helper()
		var out, errOut bytes.Buffer
		if err := runLoadtest(context.Background(), append(append([]string{}, args...), extra...), &out, &errOut); err != nil {
			t.Fatalf("%v: %v\n%s", extra, err, errOut.String())
		}
		var m map[string]any
		if err := json.Unmarshal(out.Bytes(), &m); err != nil {
			t.Fatalf("%v: %s", err, out.String())
		}
		return m
	}
	if m := run("-requests-csv", csvPath); m["load_imbalance"] != nil || m["load_imbalance_engines"] != "answered" {
		t.Errorf("without -engines: load_imbalance %v over %v, want null over answered", m["load_imbalance"], m["load_imbalance_engines"])
	}
	f, err := os.Open(csvPath)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rows, err := csv.NewReader(f).ReadAll()
	if err != nil || len(rows) != 5 {
		t.Fatalf("CSV %d rows (want a header and 4), %v: %q", len(rows), err, rows)
	}
	if col := len(rows[0]) - 1; rows[0][col] != "error" || rows[1][col] != "" || rows[4][col] != "http_500" || rows[4][1] != "e1" || rows[4][4] != "" {
		t.Errorf("CSV rows %q: want an error column, empty for the completed, http_500 on the failed one", rows)
	}
	m := run("-engines", "e1,e2")
	per, _ := m["per_engine"].(map[string]any)
	if m["load_imbalance"] != 2.0 || m["load_imbalance_engines"] != "given" || per["e2"] != 0.0 {
		t.Errorf("-engines e1,e2: load_imbalance %v over %v, per engine %v; want 2 over given, e2=0", m["load_imbalance"], m["load_imbalance_engines"], per)
	}
}
