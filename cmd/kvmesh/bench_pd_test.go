package main

import (
	"encoding/csv"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// pdBenchArgs is a P/D run small enough for a unit test: the chat workload's
// first 12 requests on 1 prefill + 1 decode engine.
var pdBenchArgs = []string{"bench", "--mode", "des", "--roles", "prefill=1,decode=1", "--profile", "8b-h100",
	"--gpu-blocks", "4000", "--workload", "chat", "--limit", "12", "--policies", "kvmesh,aggregated,kthena"}

// TestBenchPDWorkload: --roles runs the workload --workload names (every
// generator and trace reader of the aggregated benchmark), not the
// shared-prefix default.
func TestBenchPDWorkload(t *testing.T) {
	for _, wl := range []string{"chat", "tool-agent"} {
		args := append([]string{}, pdBenchArgs...)
		args[len(args)-5] = wl
		code, out, errOut := benchRunCLI(t, append(args, "--json")...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s", wl, code, errOut)
		}
		var rep struct {
			Policies map[string]struct {
				Completed int `json:"completed"`
				Failed    int `json:"failed"`
			} `json:"policies"`
		}
		if err := json.Unmarshal([]byte(out), &rep); err != nil {
			t.Fatalf("%s: %v\n%s", wl, err, out)
		}
		if len(rep.Policies) != 3 {
			t.Fatalf("%s: policies %v", wl, rep.Policies)
		}
		for p, r := range rep.Policies {
			if r.Completed+r.Failed != 12 {
				t.Errorf("%s: %s ran %d + %d requests, want the workload's 12", wl, p, r.Completed, r.Failed)
			}
		}
	}
}

// TestBenchPDHTML: --html with --roles writes the report (before, the flag
// was accepted and nothing written): a plot line per policy, each policy's
// goodput, and the table still on stdout.
func TestBenchPDHTML(t *testing.T) {
	path := filepath.Join(t.TempDir(), "pd.html")
	code, out, errOut := benchRunCLI(t, append(pdBenchArgs, "--html", path)...)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	if !strings.Contains(out, "goodput rps") {
		t.Errorf("no table on stdout: %s", out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	page := string(b)
	for _, p := range []string{"kvmesh", "aggregated", "kthena"} {
		if n := strings.Count(page, `data-policy="`+p+`"`); n < 5 {
			t.Errorf("%s: %d plot lines, want one on each of the 5 line plots", p, n)
		}
		if !strings.Contains(page, "<p class=\"note\">"+p+": goodput ") {
			t.Errorf("%s: no goodput note", p)
		}
	}
	for _, w := range []string{"<svg id=\"ttft-cdf\"", "<svg id=\"tpot-cdf\"", "<svg id=\"engine-load\"", "roles prefill=1,decode=1"} {
		if !strings.Contains(page, w) {
			t.Errorf("page lacks %q", w)
		}
	}
}

// pdTiny is a --roles run of one request.
var pdTiny = []string{"bench", "--mode", "des", "--roles", "prefill=1,decode=1", "--groups", "1", "--prompts", "1", "--policies", "kvmesh-always"}

// TestBenchPDTransferHeader: the table's header gives the transfer the run
// used: a bandwidth below 1 Gbit/s as it is (it printed "%.0f": 0), and a
// zero setup as the 1 ns the config takes for it.
func TestBenchPDTransferHeader(t *testing.T) {
	code, out, errOut := benchRunCLI(t, append(slices.Clone(pdTiny), "--transfer-gbps", "0.5", "--transfer-setup", "0")...)
	if code != 0 || !strings.Contains(out, "; 2 engines (7b-l40s), transfer 0.5 Gbit/s + 1ns setup\n") {
		t.Fatalf("exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
	code, out, errOut = benchRunCLI(t, pdTiny...)
	if code != 0 || !strings.Contains(out, "transfer 100 Gbit/s + 2ms setup\n") {
		t.Fatalf("defaults: exit %d, stderr %q, stdout:\n%s", code, errOut, out)
	}
}

// TestBenchPDUsage: combinations that would run something other than what
// was asked are refused, naming why.
func TestBenchPDUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--mode", "live", "--roles", "prefill=1,decode=1"}, "--roles runs in --mode des only"},
		// A zero bandwidth ran at the default 100 Gbit/s (the header said
		// 0), a negative setup at 1 ns; a transfer past ~292 years wrapped
		// to a negative TTFT that met the SLO.
		{append(slices.Clone(pdTiny), "--transfer-gbps", "0"), "--transfer-gbps 0: want a finite bandwidth > 0, in Gbit/s"},
		{append(slices.Clone(pdTiny), "--transfer-gbps", "-1"), "--transfer-gbps -1: want"},
		{append(slices.Clone(pdTiny), "--transfer-setup", "-1s"), "--transfer-setup -1s: want ≥ 0"},
		{append(slices.Clone(pdTiny), "--transfer-gbps", "1e-10"),
			"transfer 1e-10 Gbit/s with 2ms setup: the largest prompt's KV (2176 tokens, 0.125 GB) would take 9.98e+09 s (1.16e+05 days), over 24h0m0s: a unit mistake?"},
		{append(slices.Clone(pdTiny), "--transfer-setup", "100000h"), "with 100000h0m0s setup"},
		{[]string{"bench", "--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--transfer-gbps", "0"},
			"--transfer-gbps 0: want"},
		{[]string{"bench", "--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--transfer-gbps", "1e-9"},
			"a unit mistake?"},
	} {
		code, out, errOut := benchRunCLI(t, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 naming %q", tc.args, code, out, errOut, tc.want)
		}
	}
}

// TestBenchFlagsNotRead: a flag the kind of run does not read is refused
// by name (each kind: aggregated DES, live, --roles, --autoscale; and a
// workload's own flags outside its workload), every one at once, as is a
// report file that cannot be written; the same flags are accepted by runs that read them (the
// other tests here and in bench_des_test.go, bench_autoscale_test.go).
func TestBenchFlagsNotRead(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want []string
	}{
		{[]string{"--mode", "des", "--engines", "2", "--time-scale", "5", "--ingresses", "2", "--roles", "", "--slo-ttft", "1s",
			"--peak-rate", "3", "--mixed-prefill=false"},
			[]string{"--time-scale is not read by a --mode des run", "--ingresses is not read", "--roles is not read",
				"--slo-ttft is not read", "--peak-rate is not read", "--mixed-prefill is not read"}},
		{[]string{"--mode", "live", "--engines", "2", "--event-delay", "0s", "--learn-shared", "--parallel", "2", "--snapshot-interval", "1s"},
			[]string{"--event-delay is not read by a --mode live run", "--learn-shared is not read", "--parallel is not read",
				"--snapshot-interval is not read"}},
		{[]string{"--mode", "des", "--roles", "prefill=1,decode=1", "--engines", "4", "--event-delay", "1s", "--shape", "bursty"},
			[]string{"--engines is not read by a --roles run", "--event-delay is not read", "--shape is not read"}},
		{[]string{"--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--workload", "chat", "--policies", "kvmesh",
			"--groups", "3", "--engines", "2", "--mixed-prefill=false", "--parallel", "2"},
			[]string{"--workload is not read by a --autoscale run", "--policies is not read", "--groups is not read",
				"--engines is not read", "--mixed-prefill is not read", "--parallel is not read"}},
		// A workload's own flags outside its runs (before: `--trace FILE`
		// alone ran the shared-prefix workload, the trace unread).
		{[]string{"--engines", "2", "--trace", "t.jsonl", "--rate-scale", "3", "--limit", "2", "--trace-block-size", "64"},
			[]string{"--trace is not read by a --workload shared-prefix run", "--rate-scale is not read",
				"--limit is not read", "--trace-block-size is not read"}},
		{[]string{"--engines", "2", "--workload", "trace", "--trace", "t.jsonl", "--rate", "5", "--groups", "2", "--shared", "100"},
			[]string{"--rate is not read by a --workload trace run", "--groups is not read", "--shared is not read"}},
		{[]string{"--mode", "live", "--engines", "2", "--workload", "chat", "--output", "9", "--trace", "t.jsonl"},
			[]string{"--output is not read by a --workload chat run", "--trace is not read"}},
		// The learner's flags with no policy that learns (--policies without
		// kvmesh), and the two P/D's learner always has (pd.LearnConfig).
		// (--quiet is every run's since the DES reports progress too.)
		{[]string{"--mode", "des", "--engines", "2", "--quiet", "--policies", "random,sglang", "--learn-shared", "--learn-unpooled",
			"--learn-free-intercept", "--groups", "2", "--workload", "chat"},
			[]string{"--groups is not read by a --workload chat run",
				"--learn-shared is not read by a --policies random,sglang (no kvmesh learner) run",
				"--learn-unpooled is not read by a --policies random,sglang", "--learn-free-intercept is not read by a --policies random,sglang"}},
		{[]string{"--mode", "des", "--roles", "prefill=1,decode=1", "--policies", "llmd,sglang", "--learn-shared", "--learn-unpooled",
			"--learn-free-intercept", "--quiet"},
			[]string{"--learn-unpooled is not read by a --roles run", "--learn-free-intercept is not read by a --roles run",
				"--learn-shared is not read by a --policies llmd,sglang (no kvmesh learner) run"}},
		// Report files that cannot be written are refused before the run.
		{[]string{"--engines", "2", "--html", "/nonexistent-dir/x.html", "--requests-csv", "/"},
			[]string{"--html /nonexistent-dir/x.html: cannot create the file", "--requests-csv /: not a regular file"}},
	} {
		code, out, errOut := benchRunCLI(t, append([]string{"bench"}, tc.args...)...)
		if code != 2 || out != "" {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2", tc.args, code, out, errOut)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(errOut, w) {
				t.Errorf("%v: stderr does not say %q: %s", tc.args, w, errOut)
			}
		}
	}
}

// TestBenchRequestsCSV: --requests-csv writes one row per finished request
// of every policy, for the aggregated DES and for --roles (where a split
// request names its prefill engine, a prefill-role one, and an aggregated
// one none); the table is still printed.
func TestBenchRequestsCSV(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		n    int
	}{
		{"des", []string{"bench", "--mode", "des", "--engines", "2", "--workload", "chat", "--limit", "12", "--policies", "kvmesh,random"}, 12},
		{"roles", pdBenchArgs, 12},
	} {
		path := filepath.Join(t.TempDir(), "r.csv")
		code, out, errOut := benchRunCLI(t, append(append([]string{}, tc.args...), "--requests-csv", path)...)
		if code != 0 || !strings.Contains(out, "policy") {
			t.Fatalf("%s: exit %d: %s%s", tc.name, code, out, errOut)
		}
		f, err := os.Open(path)
		if err != nil {
			t.Fatal(err)
		}
		rows, err := csv.NewReader(f).ReadAll()
		f.Close()
		if err != nil {
			t.Fatal(err)
		}
		per := map[string]int{}
		split := 0
		for _, r := range rows[1:] {
			per[r[0]]++
			if r[2] != "" {
				split++
				if !strings.HasPrefix(r[2], "prefill-") || r[0] == "aggregated" {
					t.Errorf("%s: row %q: split by a policy or onto an engine that cannot", tc.name, r)
				}
			}
		}
		for p, n := range per {
			if n != tc.n {
				t.Errorf("%s: %s has %d rows, want %d", tc.name, p, n, tc.n)
			}
		}
		if want := strings.Count(tc.args[len(tc.args)-1], ",") + 1; len(per) != want {
			t.Errorf("%s: policies %v, want %d", tc.name, per, want)
		}
		if tc.name == "roles" && split < tc.n { // kthena always splits
			t.Errorf("roles: %d split rows, want at least kthena's %d", split, tc.n)
		}
	}
}

// TestBenchLearnFlagsRead: the learner's flags are read where a policy
// learns: --learn-shared in a --roles run with kvmesh (the default P/D
// policies), all three in a DES run whose --policies has kvmesh among
// others (TestBenchFlagsNotRead: refused without).
func TestBenchLearnFlagsRead(t *testing.T) {
	for _, args := range [][]string{
		{"--policies", "random,kvmesh", "--engines", "2", "--groups", "1", "--prompts", "2", "--profile", "tiny",
			"--learn-shared", "--learn-unpooled", "--learn-free-intercept"},
		{"--roles", "prefill=1,decode=1", "--policies", "sglang,aggregated", "--workload", "chat", "--limit", "4", "--profile", "tiny",
			"--learn-shared"},
	} {
		if code, _, errOut := benchRunCLI(t, append([]string{"bench", "--mode", "des"}, args...)...); code != 0 {
			t.Errorf("%v: exit %d: %s", args, code, errOut)
		}
	}
}

// TestBenchPDImbalanceFewRequests: a --roles run's HTML table has no
// imbalance with fewer completions than decoding engines (2 on 3), as the
// aggregated run's (TestBenchDESNoneCompleted).
func TestBenchPDImbalanceFewRequests(t *testing.T) {
	path := filepath.Join(t.TempDir(), "r.html")
	code, _, errOut := benchRunCLI(t, "bench", "--mode", "des", "--roles", "prefill=1,decode=3", "--policies", "kvmesh",
		"--workload", "chat", "--limit", "2", "--profile", "tiny", "--html", path)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	page, err := os.ReadFile(path)
	if err != nil || !strings.Contains(string(page), "imbalance n/a (kvmesh): fewer requests completed than there are engines") {
		t.Errorf("HTML lacks the imbalance n/a note (%v)", err)
	}
}

// TestBenchPDNoneCompleted: a --roles policy that completed nothing (every
// prompt larger than the engines' KV cache) shows n/a for its throughput
// and latencies, JSON null, as the aggregated run's
// (TestBenchDESNoneCompleted); goodput and SLO attainment stay 0.
func TestBenchPDNoneCompleted(t *testing.T) {
	args := []string{"bench", "--mode", "des", "--roles", "prefill=1,decode=1", "--policies", "kvmesh", "--groups", "1",
		"--prompts", "2", "--profile", "tiny", "--gpu-blocks", "10", "--block-size", "8"}
	code, out, errOut := benchRunCLI(t, args...)
	row := regexp.MustCompile(`(?m)^ *kvmesh +0\.00 +0\.0% +n/a +n/a +n/a +n/a +n/a +n/a +n/a `)
	if code != 1 || errOut != "kvmesh bench: no request succeeded for kvmesh (2 failed): the report above shows n/a\n" || !row.MatchString(out) {
		t.Fatalf("exit %d, stderr %q, table:\n%s", code, errOut, out)
	}
	p := benchJSONPoliciesExit(t, 1, append(args, "--json")...)["kvmesh"]
	for _, k := range []string{"throughput_rps", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tpot_mean_s",
		"tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "e2e_mean_s", "e2e_p99_s", "load_imbalance"} {
		if v, ok := p[k]; !ok || v != nil {
			t.Errorf("%s: %v (present %v), want null", k, v, ok)
		}
	}
	if p["completed"] != 0.0 || p["failed"] != 2.0 || p["goodput_rps"] != 0.0 || p["slo_attainment"] != 0.0 {
		t.Errorf("counts: %v", p)
	}
}
