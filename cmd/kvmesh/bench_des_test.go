package main

import (
	"bytes"
	"encoding/csv"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// benchIssueFlags is the scenario of the issue, tiny enough to run in well
// under a second.
var benchIssueFlags = []string{"bench", "--mode", "des", "--engines", "3",
	"--policies", "random,kthena,ray,sglang,dynamo,llmd,kvmesh", "--profile", "8b-h100", "--gpu-blocks", "3000",
	"--seed", "1", "--workload", "shared-prefix", "--groups", "4", "--prompts", "4", "--shared", "256",
	"--question", "32", "--output", "16", "--rate", "50", "--concurrency", "8"}

var benchIssuePolicies = []string{"random", "kthena", "ray", "sglang", "dynamo", "llmd", "kvmesh"}

// benchRunCLI runs the kvmesh binary's entry point.
func benchRunCLI(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errOut bytes.Buffer
	code = run(args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// checkBenchJSON decodes `kvmesh bench --json` output and checks its exact
// shape and that every number is sane; it returns the oracle hit rate.
func checkBenchJSON(t *testing.T, out string, policies []string) float64 {
	t.Helper()
	var top map[string]json.RawMessage
	if err := json.Unmarshal([]byte(out), &top); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if keys := benchSortedKeys(top); !slices.Equal(keys, []string{"oracle_hit_rate", "policies", "run"}) {
		t.Fatalf("top-level keys %v, want exactly run, policies and oracle_hit_rate", keys)
	}
	var oracle float64
	if err := json.Unmarshal(top["oracle_hit_rate"], &oracle); err != nil {
		t.Fatalf("oracle_hit_rate: %v", err)
	}
	if math.IsNaN(oracle) || oracle < 0 || oracle > 1 {
		t.Fatalf("oracle_hit_rate %v outside [0,1]", oracle)
	}
	var pols map[string]map[string]json.RawMessage
	if err := json.Unmarshal(top["policies"], &pols); err != nil {
		t.Fatalf("policies: %v", err)
	}
	if got, want := benchSortedKeys(pols), slices.Sorted(slices.Values(policies)); !slices.Equal(got, want) {
		t.Fatalf("policies %v, want %v", got, want)
	}
	wantKeys := []string{"completed", "e2e_mean_s", "e2e_p99_s", "failed", "load_imbalance", "offered_hit_rate", "preemptions",
		"prefix_hit_rate", "queue_mean_s", "throughput_rps", "tpot_mean_s", "tpot_p99_s", "ttft_mean_s", "ttft_p50_s",
		"ttft_p90_s", "ttft_p99_s"}
	for name, obj := range pols {
		if keys := benchSortedKeys(obj); !slices.Equal(keys, wantKeys) {
			t.Fatalf("%s: keys %v, want exactly %v", name, keys, wantKeys)
		}
		v := make(map[string]float64, len(obj))
		for k, raw := range obj {
			var f float64
			if err := json.Unmarshal(raw, &f); err != nil {
				t.Fatalf("%s.%s = %s: %v", name, k, raw, err)
			}
			if math.IsNaN(f) || math.IsInf(f, 0) || f < 0 {
				t.Fatalf("%s.%s = %v", name, k, f)
			}
			v[k] = f
		}
		switch {
		case v["throughput_rps"] <= 0:
			t.Errorf("%s: throughput %v", name, v["throughput_rps"])
		case v["ttft_mean_s"] <= 0 || v["ttft_p50_s"] <= 0:
			t.Errorf("%s: TTFT mean %v, p50 %v: a prefill takes time", name, v["ttft_mean_s"], v["ttft_p50_s"])
		case v["ttft_p50_s"] > v["ttft_p90_s"] || v["ttft_p90_s"] > v["ttft_p99_s"]:
			t.Errorf("%s: TTFT p50 %v, p90 %v, p99 %v not ordered", name, v["ttft_p50_s"], v["ttft_p90_s"], v["ttft_p99_s"])
		case v["e2e_mean_s"] < v["ttft_mean_s"] || v["e2e_p99_s"] < v["ttft_p99_s"]:
			t.Errorf("%s: e2e mean %v, p99 %v < TTFT mean %v, p99 %v", name, v["e2e_mean_s"], v["e2e_p99_s"], v["ttft_mean_s"], v["ttft_p99_s"])
		case v["tpot_mean_s"] <= 0 || v["tpot_mean_s"] > v["tpot_p99_s"]:
			t.Errorf("%s: TPOT mean %v, p99 %v", name, v["tpot_mean_s"], v["tpot_p99_s"])
		case v["queue_mean_s"] > v["ttft_mean_s"]:
			t.Errorf("%s: queue mean %v above the TTFT mean %v it is part of", name, v["queue_mean_s"], v["ttft_mean_s"])
		case v["offered_hit_rate"] > oracle+1e-9:
			t.Errorf("%s: offered hit rate %v above the oracle's %v", name, v["offered_hit_rate"], oracle)
		case v["prefix_hit_rate"] > oracle+1e-9:
			t.Errorf("%s: hit rate %v above the oracle's %v", name, v["prefix_hit_rate"], oracle)
		case v["load_imbalance"] < 1:
			t.Errorf("%s: load imbalance (max/mean) %v < 1", name, v["load_imbalance"])
		}
	}
	return oracle
}

func benchSortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

func TestBenchDESJSON(t *testing.T) {
	code, out, errOut := benchRunCLI(t, append(slices.Clone(benchIssueFlags), "--json")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	oracle := checkBenchJSON(t, out, benchIssuePolicies)
	// 16 prompts of 288 tokens; each group's 3 later prompts can reuse its
	// 256 shared tokens (16 full blocks): 12·256 / (16·288).
	if want := 12.0 * 256 / (16 * 288); math.Abs(oracle-want) > 1e-12 {
		t.Fatalf("oracle hit rate %v, want %v", oracle, want)
	}
}

func TestBenchDESTable(t *testing.T) {
	code, out, errOut := benchRunCLI(t, benchIssueFlags...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.HasPrefix(out, "workload shared-prefix: 16 requests, 4608 prompt + 256 output tokens") ||
		!strings.Contains(out, "; 3 engines (8b-h100)\n") {
		t.Fatalf("header:\n%s", out)
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(out, "\n") {
		if f := strings.Fields(line); len(f) > 0 {
			rows[f[0]] = true
		}
	}
	for _, p := range benchIssuePolicies {
		if !rows[p] {
			t.Errorf("no table row for %s:\n%s", p, out)
		}
	}
	if !strings.Contains(out, "oracle (infinite shared cache) hit rate: 0.667") {
		t.Errorf("no oracle line:\n%s", out)
	}
}

// TestBenchDESTrace runs a Mooncake trace: a tiny one written here (its
// oracle hit rate worked out by hand) and the repository's synthetic trace
// cut to 100 requests (the whole trace on 2 engines takes ~6 s).
func TestBenchDESTrace(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	// Blocks of 512 tokens. Line 2 repeats line 1's two blocks (1,024
	// tokens hit); line 3 shares only block 0 (512); line 4 is new.
	trace := `{"timestamp": 0, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}
{"timestamp": 100, "input_length": 1024, "output_length": 4, "hash_ids": [0, 1]}
{"timestamp": 200, "input_length": 700, "output_length": 4, "hash_ids": [0, 2]}
{"timestamp": 300, "input_length": 512, "output_length": 4, "hash_ids": [3]}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--workload", "trace", "--trace", path,
		"--rate-scale", "4", "--engines", "2", "--policies", "kvmesh", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if oracle, want := checkBenchJSON(t, out, []string{"kvmesh"}), (1024.0+512)/(1024+1024+700+512); oracle != want {
		t.Fatalf("oracle hit rate %v, want %v", oracle, want)
	}

	code, out, errOut = benchRunCLI(t, "bench", "--mode", "des", "--workload", "trace",
		"--trace", filepath.Join("..", "..", "testdata", "traces", "mooncake_synthetic_trace.jsonl"),
		"--rate-scale", "4", "--engines", "2", "--policies", "kvmesh", "--limit", "100", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	checkBenchJSON(t, out, []string{"kvmesh"})

	// aiperf's forms: absolute (epoch ms) timestamps, a multi-turn row
	// (session_id + delay), 64-token blocks, a row without output_length.
	// Arrival order: line 1, line 3 (10 ms), line 2 (50 ms). Line 3 hits
	// block 0 (64 tokens), line 2 blocks 0 and 1 (128).
	trace = `{"timestamp": 1700000000000, "session_id": "s", "input_length": 128, "output_length": 2, "hash_ids": [0, 1]}
{"session_id": "s", "delay": 50, "input_length": 192, "hash_ids": [0, 1, 2]}
{"timestamp": 1700000000010, "input_length": 100, "output_length": 2, "hash_ids": [0, 9]}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "--mode", "des", "--workload", "trace", "--trace", path, "--engines", "2",
		"--policies", "kvmesh,sglang", "--output", "3", "--json"}
	code, _, errOut = benchRunCLI(t, args...)
	if code != 2 || !strings.Contains(errOut, "--trace-block-size 64") {
		t.Fatalf("64-token blocks read as 512: exit %d, %s", code, errOut)
	}
	code, out, errOut = benchRunCLI(t, append(args, "--trace-block-size", "64")...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if oracle, want := checkBenchJSON(t, out, []string{"kvmesh", "sglang"}), (64.0+128)/(128+100+192); oracle != want {
		t.Fatalf("oracle hit rate %v, want %v", oracle, want)
	}

	// Bailian's form (--workload bailian): seconds, 16-token blocks, turns
	// linked by parent_chat_id. Turn 2 hits turn 1's 32 tokens.
	trace = `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 1700000000.5, "input_length": 32, "output_length": 2, "hash_ids": [4, 5]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 1700000003.5, "input_length": 48, "output_length": 2, "hash_ids": [4, 5, 6]}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = benchRunCLI(t, "bench", "--mode", "des", "--workload", "bailian", "--trace", path, "--engines", "2",
		"--policies", "kvmesh", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if oracle, want := checkBenchJSON(t, out, []string{"kvmesh"}), 32.0/(32+48); oracle != want {
		t.Fatalf("oracle hit rate %v, want %v", oracle, want)
	}
}

// TestBenchDESSeedZero: --seed 0 means the default seed, 1, for the
// workload and the schedulers alike (des.Config turns a zero seed into 1).
func TestBenchDESSeedZero(t *testing.T) {
	args := []string{"bench", "--engines", "2", "--policies", "random", "--groups", "2", "--prompts", "3",
		"--shared", "64", "--question", "16", "--output", "4", "--rate", "20", "--json"}
	outs := map[string]string{}
	for _, seed := range []string{"0", "1", "2"} {
		code, out, errOut := benchRunCLI(t, append(slices.Clone(args), "--seed", seed)...)
		if code != 0 {
			t.Fatalf("--seed %s: exit %d: %s", seed, code, errOut)
		}
		outs[seed] = out
	}
	if outs["0"] != outs["1"] {
		t.Fatalf("--seed 0 differs from the default --seed 1:\n%s\n%s", outs["0"], outs["1"])
	}
	if outs["1"] == outs["2"] {
		t.Fatal("--seed 2 gives the same run as --seed 1: the seed is not used")
	}
	code, _, help := benchRunCLI(t, "bench", "-h")
	if code != 0 || !strings.Contains(help, "0 means the default, 1") {
		t.Fatalf("bench -h (exit %d) does not document --seed 0:\n%s", code, help)
	}
}

func TestBenchDESUsageErrors(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--engines", "0"}, []string{"--engines 0"}},
		{[]string{"--engines", "-3"}, []string{"--engines -3"}},
		{[]string{"--rate", "-1"}, []string{"--rate -1"}},
		{[]string{"--rate", "NaN"}, []string{"--rate NaN"}},
		{[]string{"--rate", "+Inf"}, []string{"--rate +Inf"}},
		// Arrivals past the largest time.Duration wrapped to −9.2e9 s.
		{[]string{"--rate", "1e-12"}, []string{"rate 1e-12: request 0 would arrive", "unit mistake"}},
		{[]string{"--workload", "chat", "--rate-scale", "0"}, []string{"--rate-scale 0"}},
		{[]string{"--workload", "chat", "--rate-scale", "-2"}, []string{"--rate-scale -2"}},
		{[]string{"--workload", "chat", "--rate-scale", "NaN"}, []string{"--rate-scale NaN"}},
		{[]string{"--groups", "0"}, []string{"--groups 0"}},
		{[]string{"--prompts", "0"}, []string{"--prompts 0"}},
		{[]string{"--shared", "-1"}, []string{"--shared -1"}},
		{[]string{"--question", "-1"}, []string{"--question -1"}},
		{[]string{"--output", "-1"}, []string{"--output -1"}},
		{[]string{"--concurrency", "-1"}, []string{"--concurrency -1"}},
		{[]string{"--gpu-blocks", "-1"}, []string{"--gpu-blocks -1"}},
		{[]string{"--workload", "tool-agent", "--limit", "-1"}, []string{"--limit -1"}},
		{[]string{"--max-running", "-1"}, []string{"--max-running -1"}},
		{[]string{"--max-batch-tokens", "-1"}, []string{"--max-batch-tokens -1"}},
		{[]string{"--policies", "kvmesh,nope"}, []string{`unknown policy "nope"`}},
		{[]string{"--policies", "kvmesh,kvmesh"}, []string{`"kvmesh" given twice`}},
		{[]string{"--policies", " , "}, []string{"--policies is empty"}},
		{[]string{"--policies", "weighted"}, []string{"weighted needs a --config"}},
		{[]string{"--workload", "trace"}, []string{"--workload trace needs --trace"}},
		{[]string{"--workload", "bogus"}, []string{`--workload "bogus"`}},
		{[]string{"--profile", "bogus"}, []string{`--profile "bogus"`, "8b-h100"}},
		{[]string{"--mode", "bogus"}, []string{`--mode "bogus"`}},
		{[]string{"--mode", "live", "--time-scale", "0"}, []string{"--time-scale 0"}},
		{[]string{"--config", filepath.Join(t.TempDir(), "missing.yaml")}, []string{"--config"}},
		// A block size vLLM refuses cannot be the engine simulated (before:
		// 7 and 1024 ran).
		{[]string{"--block-size", "7"}, []string{"--block-size 7: want one of 1, 8, 16, 32, 64, 128, 256 (vLLM's"}},
		{[]string{"--block-size", "1024"}, []string{"--block-size 1024: want one of"}},
		// Every problem at once is named at once (a workload's flags with
		// that workload: the others are refused before any value is read).
		{[]string{"--engines", "0", "--rate", "NaN", "--groups", "0", "--prompts", "0",
			"--shared", "-1", "--question", "-1", "--output", "-1", "--concurrency", "-1", "--gpu-blocks", "-1",
			"--policies", "foo,kvmesh,bar", "--profile", "bogus"},
			[]string{"--engines 0", "--rate NaN", "--groups 0", "--prompts 0", "--shared -1",
				"--question -1", "--output -1", "--concurrency -1", "--gpu-blocks -1", `unknown policy "foo"`,
				`unknown policy "bar"`, `--profile "bogus"`}},
		{[]string{"--engines", "0", "--rate-scale", "0", "--output", "-1", "--workload", "trace", "--profile", "bogus"},
			[]string{"--engines 0", "--rate-scale 0", "--output -1", "--workload trace needs --trace", `--profile "bogus"`}},
	} {
		args := []string{"bench", "--mode", "des", "--engines", "2", "--policies", "random"}
		if !slices.Contains(tc.args, "--workload") {
			args = append(args, "--groups", "1", "--prompts", "1")
		}
		args = append(args, tc.args...)
		code, out, errOut := benchRunCLI(t, args...)
		if code != 2 {
			t.Errorf("%v: exit %d, want 2 (stderr %q)", tc.args, code, errOut)
			continue
		}
		if out != "" {
			t.Errorf("%v: printed %q before failing", tc.args, out)
		}
		if !strings.HasPrefix(errOut, "kvmesh bench: usage: ") {
			t.Errorf("%v: stderr %q", tc.args, errOut)
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr does not name %q: %s", tc.args, w, errOut)
			}
		}
	}
}

// TestBenchDESNoneCompleted: a policy none of whose requests completed
// (every prompt longer than the KV cache) has no throughput, TTFT, E2E,
// hit rate or imbalance: the table says n/a and why, the JSON null
// (before: 0.00, which ranked it fastest; the hit rates 0); a policy with
// fewer completions than engines has no imbalance (before: 2,000 engines,
// 64 requests printed 156.25). The JSON says why they failed (errors and
// first_errors, as `kvmesh loadtest -json`), and with --json the reason
// is on stderr too (before: only under the table, so a CI job reading
// the JSON could not tell).
func TestBenchDESNoneCompleted(t *testing.T) {
	args := []string{"bench", "--mode", "des", "--engines", "2", "--policies", "random", "--groups", "1", "--prompts", "2",
		"--profile", "tiny", "--gpu-blocks", "10", "--block-size", "8"}
	code, out, errOut := benchRunCLI(t, args...)
	row := regexp.MustCompile(`(?m)^ *random +n/a +n/a +n/a +n/a +n/a +n/a +n/a +n/a +n/a +0 +2 `)
	// The report, then exit 1 (before: exit 0 with every request failed;
	// live mode ended the run with no report).
	const note = "random: 2 of 2 requests failed: too_long 2 (first: "
	if code != 1 || errOut != "kvmesh bench: no request succeeded for random (2 failed): the report above shows n/a\n" || !row.MatchString(out) ||
		!strings.Contains(out, note) || !strings.Contains(out, "longer than the KV cache") ||
		!strings.Contains(out, "none completed, so its throughput, latencies, hit rate and imbalance are n/a") {
		t.Fatalf("exit %d, stderr %q, table:\n%s", code, errOut, out)
	}
	code, out, errOut = benchRunCLI(t, append(args, "--json")...)
	var rep struct {
		Policies map[string]map[string]any `json:"policies"`
	}
	if err := json.Unmarshal([]byte(out), &rep); code != 1 || err != nil {
		t.Fatalf("exit %d, %v, JSON:\n%s", code, err, out)
	}
	if !strings.HasPrefix(errOut, note) || !strings.Contains(errOut, "kvmesh bench: no request succeeded for random") {
		t.Errorf("--json: stderr %q, want the failure line first", errOut)
	}
	p := rep.Policies["random"]
	for _, k := range []string{"throughput_rps", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "e2e_mean_s", "load_imbalance",
		"e2e_p99_s", "tpot_mean_s", "tpot_p99_s", "queue_mean_s", "prefix_hit_rate", "offered_hit_rate"} {
		if v, ok := p[k]; !ok || v != nil {
			t.Errorf("%s: %v (present %v), want null", k, v, ok)
		}
	}
	if p["completed"] != 0.0 || p["failed"] != 2.0 {
		t.Errorf("counts: %v", p)
	}
	errs, _ := p["errors"].(map[string]any)
	first, _ := p["first_errors"].(map[string]any)
	if len(errs) != 1 || errs["too_long"] != 2.0 || len(first) != 1 || !strings.Contains(fmt.Sprint(first["too_long"]), "longer than the KV cache") {
		t.Errorf("errors %v, first_errors %v", p["errors"], p["first_errors"])
	}

	// 2 requests on 3 engines: they complete, the imbalance is n/a.
	args = []string{"bench", "--mode", "des", "--engines", "3", "--policies", "random", "--groups", "1", "--prompts", "2", "--profile", "tiny"}
	code, out, errOut = benchRunCLI(t, args...)
	row = regexp.MustCompile(`(?m)^ *random +[0-9.]+ .* +n/a +2 +0 `)
	if code != 0 || !row.MatchString(out) || !strings.Contains(out, "imbalance n/a (random): fewer requests completed than there are engines") {
		t.Fatalf("exit %d, stderr %q, table:\n%s", code, errOut, out)
	}
	if p := benchJSONPolicies(t, append(args, "--json")...)["random"]; p["load_imbalance"] != nil || p["throughput_rps"] == nil {
		t.Fatalf("JSON: %v", p)
	}
}

// benchJSONPolicies runs a bench command with --json and returns its
// policies' JSON objects.
func benchJSONPolicies(t *testing.T, args ...string) map[string]map[string]any {
	t.Helper()
	return benchJSONPoliciesExit(t, 0, args...)
}

// benchJSONPoliciesExit is benchJSONPolicies for a command that exits
// with code (1: a policy completed nothing, after the report).
func benchJSONPoliciesExit(t *testing.T, code int, args ...string) map[string]map[string]any {
	t.Helper()
	got, out, errOut := benchRunCLI(t, args...)
	var rep struct {
		Policies map[string]map[string]any `json:"policies"`
	}
	if got != code || json.Unmarshal([]byte(out), &rep) != nil {
		t.Fatalf("exit %d, stderr %q, JSON:\n%s", code, errOut, out)
	}
	return rep.Policies
}

// TestBenchDESTraceSpanWarning: a trace whose arrivals span more than 30
// days (here a relative row among epoch-ms ones: 45 days) runs, and a
// warning on stderr says what is likely wrong; a trace of hours does not
// warn.
func TestBenchDESTraceSpanWarning(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	trace := `{"timestamp": 0, "input_length": 100, "output_length": 5}
{"timestamp": 3888000000, "input_length": 100, "output_length": 5}
{"timestamp": 3888000100, "input_length": 100, "output_length": 5}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"bench", "--mode", "des", "--workload", "trace", "--trace", path, "--engines", "2", "--policies", "random"}
	code, out, errOut := benchRunCLI(t, args...)
	want := "warning: --trace " + path + ": arrivals span 45 days, 45 of them a gap before request 1 (in arrival order): mixed relative and epoch timestamps?\n"
	if code != 0 || !strings.Contains(out, "random ") || !strings.Contains(errOut, want) {
		t.Fatalf("exit %d, stderr %q (want %q), stdout:\n%s", code, errOut, want, out)
	}
	if err := os.WriteFile(path, []byte(strings.ReplaceAll(trace, "3888000", "3600")), 0o644); err != nil {
		t.Fatal(err)
	}
	if code, _, errOut := benchRunCLI(t, args...); code != 0 || strings.Contains(errOut, "warning") {
		t.Fatalf("a trace of an hour: exit %d, stderr %q", code, errOut)
	}
}

// TestBenchZeroOutputNote: rows with output_length 0 run as 1 output token
// and the report says how many, under the workload line (aggregated and
// --roles runs).
func TestBenchZeroOutputNote(t *testing.T) {
	path := filepath.Join(t.TempDir(), "trace.jsonl")
	trace := `{"timestamp": 0, "input_length": 100, "output_length": 0, "hash_ids": [1]}
{"timestamp": 10, "input_length": 100, "output_length": 3, "hash_ids": [1]}
{"timestamp": 20, "input_length": 100, "output_length": 0, "hash_ids": [1]}
`
	if err := os.WriteFile(path, []byte(trace), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, run := range [][]string{{"--engines", "2", "--policies", "random"}, {"--roles", "prefill=1,decode=1", "--policies", "kvmesh"}} {
		args := append([]string{"bench", "--mode", "des", "--workload", "trace", "--trace", path}, run...)
		code, out, errOut := benchRunCLI(t, args...)
		lines := strings.SplitN(out, "\n", 3)
		if code != 0 || len(lines) < 3 || !strings.Contains(lines[0], "3 requests, 300 prompt + 5 output tokens") ||
			lines[1] != "2 trace rows with output_length 0 sent as 1 output token" {
			t.Fatalf("%v: exit %d, stderr %q, stdout:\n%s", run, code, errOut, out)
		}
	}
}

// TestBenchDESQuiet: --quiet is read by DES runs (aggregated and --roles),
// which report progress on stderr without it; with it stderr stays empty.
func TestBenchDESQuiet(t *testing.T) {
	for _, args := range [][]string{
		{"bench", "--mode", "des", "--engines", "2", "--policies", "random", "--groups", "2", "--prompts", "2", "--quiet"},
		append(slices.Clone(pdTiny), "--quiet"),
	} {
		if code, out, errOut := benchRunCLI(t, args...); code != 0 || errOut != "" || !strings.Contains(out, "policy") {
			t.Errorf("%v: exit %d, stderr %q, stdout:\n%s", args, code, errOut, out)
		}
	}
}

var updateDESGolden = flag.Bool("update-des-golden", false, "rewrite testdata/bench-des-golden.txt from TestBenchDESGolden's run")

const desGolden = "testdata/bench-des-golden.txt"

// desGoldenArgs is a small headline-shaped DES run: every default policy
// on 4 engines of the default 7b-l40s profile, 80 shared-prefix requests
// at 25 req/s and GPU caches small enough to evict and preempt (under a
// second of simulation, a few seconds with -race).
var desGoldenArgs = []string{"bench", "--mode", "des", "--engines", "4", "--seed", "1", "--workload", "shared-prefix",
	"--groups", "8", "--prompts", "10", "--shared", "2048", "--question", "64", "--output", "32", "--rate", "25",
	"--gpu-blocks", "700", "--json", "--quiet"}

// TestBenchDESGolden pins the DES's summary numbers per policy (mean and
// p99 TTFT, throughput, prefix hit rate, completions, preemptions) for
// desGoldenArgs to testdata/bench-des-golden.txt: the DES is deterministic
// for a seed, so a change to the scheduler, a policy's emulation, the
// engine model or the DES shows up here as a golden diff to review and
// commit (-update-des-golden rewrites the file; say why in the commit).
//
// Floats are written in full (shortest round-trip) and compared with a
// relative tolerance of 1e-9, not bit for bit: compiled Go fuses x*y+z
// into one FMA on arm64, ppc64le, s390x and riscv64 but not on amd64, and
// math.Exp/Log take an FMA assembly path on amd64 CPUs that have it, so
// the last bits may differ across GOARCH and machines. 1e-9 absorbs that
// and nothing else: a different routing decision moves these numbers by
// far more and fails.
func TestBenchDESGolden(t *testing.T) {
	code, out, errOut := benchRunCLI(t, desGoldenArgs...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep struct {
		Run struct {
			Policies []string `json:"policies"`
		} `json:"run"`
		Policies map[string]struct {
			TTFTMean      float64 `json:"ttft_mean_s"`
			TTFTP99       float64 `json:"ttft_p99_s"`
			Throughput    float64 `json:"throughput_rps"`
			PrefixHitRate float64 `json:"prefix_hit_rate"`
			Completed     int     `json:"completed"`
			Preemptions   int     `json:"preemptions"`
		} `json:"policies"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Run.Policies) < 10 || len(rep.Policies) != len(rep.Run.Policies) {
		t.Fatalf("policies %v, results for %d: want every default policy", rep.Run.Policies, len(rep.Policies))
	}
	g := func(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
	var b strings.Builder
	b.WriteString("# kvmesh " + strings.Join(desGoldenArgs, " ") + "\n")
	b.WriteString("# policy ttft_mean_s ttft_p99_s throughput_rps prefix_hit_rate completed preemptions (TestBenchDESGolden; -update-des-golden rewrites it)\n")
	for _, p := range rep.Run.Policies {
		r := rep.Policies[p]
		fmt.Fprintf(&b, "%s %s %s %s %s %d %d\n", p, g(r.TTFTMean), g(r.TTFTP99), g(r.Throughput), g(r.PrefixHitRate), r.Completed, r.Preemptions)
	}
	got := b.String()
	if *updateDESGolden {
		if err := os.WriteFile(desGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	wantB, err := os.ReadFile(desGolden)
	if err != nil {
		t.Fatalf("%v (-update-des-golden writes it)", err)
	}
	want := string(wantB)
	if got == want {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	same := len(gl) == len(wl)
	for i := 0; same && i < len(gl); i++ {
		same = desGoldenLineClose(gl[i], wl[i])
	}
	if !same {
		t.Errorf("the DES's summary differs from %s (review; -update-des-golden rewrites it):\n%s", desGolden, lineDiff(want, got))
	}
}

// desGoldenLineClose reports whether two golden lines match: the same
// words, numbers within a relative 1e-9.
func desGoldenLineClose(a, b string) bool {
	af, bf := strings.Fields(a), strings.Fields(b)
	if len(af) != len(bf) {
		return false
	}
	for i := range af {
		if af[i] == bf[i] {
			continue
		}
		x, err1 := strconv.ParseFloat(af[i], 64)
		y, err2 := strconv.ParseFloat(bf[i], 64)
		if err1 != nil || err2 != nil || math.Abs(x-y) > 1e-9*math.Max(math.Abs(x), math.Abs(y)) {
			return false
		}
	}
	return true
}

// TestBenchDESHeldOutShapes: --workload coding, rag and mix run their
// generators (--limit and --rate-scale read, the shared-prefix and trace
// flags refused as unread), and each is the shape it names: coding's
// prompts hold a 20k+-token repository, rag's 3+ documents after the
// system prompt, mix's a share of long summaries.
func TestBenchDESHeldOutShapes(t *testing.T) {
	for _, tc := range []struct {
		wl               string
		minMean, maxMean float64 // mean prompt tokens of the first 40
	}{
		{"coding", 20000, 60000},
		{"rag", 320 + 3*512, 320 + 6*1536 + 160},
		{"mix", 700, 8000},
	} {
		path := filepath.Join(t.TempDir(), "r.csv")
		code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--engines", "4", "--gpu-blocks", "30000", "--workload", tc.wl,
			"--limit", "40", "--rate-scale", "2", "--policies", "round-robin", "--json", "--requests-csv", path)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", tc.wl, code, errOut)
		}
		var rep struct {
			Policies map[string]struct {
				Completed int `json:"completed"`
			} `json:"policies"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil || rep.Policies["round-robin"].Completed != 40 {
			t.Fatalf("%s: %v: %s", tc.wl, err, out)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(f).ReadAll()
		f.Close()
		if err != nil || len(rows) != 41 {
			t.Fatalf("%s: %v, %d rows", tc.wl, err, len(rows))
		}
		col := slices.Index(rows[0], "prompt_tokens")
		if col < 0 {
			t.Fatalf("%s: no prompt_tokens column in %q", tc.wl, rows[0])
		}
		sum := 0
		for _, r := range rows[1:] {
			n, _ := strconv.Atoi(r[col])
			sum += n
		}
		if mean := float64(sum) / 40; mean < tc.minMean || mean > tc.maxMean {
			t.Errorf("%s: mean prompt %.0f tokens, want %.0f..%.0f", tc.wl, mean, tc.minMean, tc.maxMean)
		}
		code, _, errOut = benchRunCLI(t, "bench", "--mode", "des", "--workload", tc.wl, "--trace", "x.jsonl", "--groups", "3")
		if code != 2 || !strings.Contains(errOut, "--trace is not read by a --workload "+tc.wl+" run") || !strings.Contains(errOut, "--groups is not read") {
			t.Errorf("%s with --trace --groups: exit %d: %s", tc.wl, code, errOut)
		}
	}
}
