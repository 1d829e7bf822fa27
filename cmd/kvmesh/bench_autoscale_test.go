package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/loadtest/des"
)

// TestBenchAutoscaleJSON runs every autoscaler on a two-minute trace and
// checks the report: one run per setting, windows, GPU-hours; and the
// --html page: a table row and a line on each of the five charts per run.
func TestBenchAutoscaleJSON(t *testing.T) {
	page := filepath.Join(t.TempDir(), "as.html")
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--autoscale", "static,slo,kthena", "--roles", "prefill=2,decode=1",
		"--initial-roles", "prefill=1,decode=1", "--profile", "7b-l40s", "--gpu-blocks", "8000", "--duration", "2m", "--peak-rate", "2",
		"--prefix-tokens", "128", "--own-tokens", "256", "--output-tokens", "16", "--slo-util", "0.5,0.9:0.6", "--kthena-targets", "2:20", "--json",
		"--html", page)
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep des.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 4 || rep.Requests == 0 || rep.StaticGPUHours <= 0 || rep.StartupDelay != 60 {
		t.Fatalf("report %+v", rep)
	}
	names := []string{"static", "kvmesh-slo", "kvmesh-slo", "kthena"}
	for i, r := range rep.Runs {
		if r.Autoscaler != names[i] || r.GPUHours <= 0 || len(r.Windows) < 2 || r.Completed != rep.Requests || r.Attainment <= 0 {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	if !strings.Contains(rep.Runs[2].Setting, "P 0.90 D 0.60") {
		t.Fatalf("setting %q", rep.Runs[2].Setting)
	}
	b, err := os.ReadFile(page)
	if err != nil {
		t.Fatal(err)
	}
	html := string(b)
	if n := strings.Count(html, "<tr><td>"); n != 4 {
		t.Errorf("%d table rows, want 4", n)
	}
	for _, id := range []string{"prefill-engines", "decode-engines", "arrivals", "attainment", "ttft-p90"} {
		i := strings.Index(html, `<svg id="`+id+`"`)
		if i < 0 {
			t.Errorf("no chart %s", id)
			continue
		}
		svg := html[i : i+strings.Index(html[i:], "</svg>")]
		if n := strings.Count(svg, `class="series"`); n != 4 {
			t.Errorf("%s: %d lines, want one per run (4)", id, n)
		}
	}
}

// TestBenchAutoscaleSLOAdapt runs the SLO mode with the trend lead, the
// learned TTFT baseline and the correction memory and checks the setting
// names all three.
func TestBenchAutoscaleSLOAdapt(t *testing.T) {
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--autoscale", "slo",
		"--initial-roles", "prefill=1,decode=1", "--profile", "7b-l40s", "--gpu-blocks", "8000", "--duration", "2m", "--peak-rate", "2",
		"--prefix-tokens", "128", "--own-tokens", "256", "--output-tokens", "16", "--slo-util", "0.9:0.6",
		"--slo-lead", "90s", "--slo-ttft-baseline", "15m", "--slo-correction-window", "6m", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep des.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 1 || rep.Runs[0].GPUHours <= 0 || rep.Runs[0].Completed != rep.Requests {
		t.Fatalf("report %+v", rep)
	}
	if s := rep.Runs[0].Setting; !strings.Contains(s, "learned baseline (15m0s)") || !strings.Contains(s, "trend lead 1m30s") ||
		!strings.Contains(s, "corrections held 6m0s") {
		t.Fatalf("setting %q", s)
	}
}

func TestBenchAutoscaleUsage(t *testing.T) {
	for _, args := range [][]string{
		{"--autoscale", "bogus"},
		{"--autoscale", "static"}, // no --roles
		{"--autoscale", "slo", "--slo-util", "x"},
		{"--autoscale", "kthena", "--kthena-targets", "4"},
		{"--autoscale", "slo", "--ratio", "3:1"},
		{"--autoscale", "slo", "--shape", "square"},
		{"--autoscale", "slo", "--slo-lead", "-1s"},
		{"--autoscale", "slo", "--slo-ttft-baseline", "-1m"},
		{"--autoscale", "slo", "--slo-correction-window", "-1m"},
		{"--autoscale", "slo", "--slo-tpot-expect", "-1"},
		{"--autoscale", "slo", "--slo-tpot-expect", "NaN"},
		{"--autoscale", "capacity", "--capacity-table", "1/1"},
		{"--autoscale", "clairvoyant", "--capacity-headroom", "-1"},
		{"--autoscale", "capacity", "--capacity-headroom", "x"},
	} {
		code, _, errOut := benchRunCLI(t, append([]string{"bench", "--mode", "des", "--duration", "1m"}, args...)...)
		if code != 2 || !strings.Contains(errOut, "usage") && !strings.Contains(errOut, "--") {
			t.Errorf("%v: exit %d, stderr %q", args, code, errOut)
		}
	}
	// Without --roles the message says what is missing, not a parse of "".
	if _, _, errOut := benchRunCLI(t, "bench", "--mode", "des", "--duration", "1m", "--autoscale", "static"); !strings.Contains(errOut, "needs --roles prefill=N,decode=M: the static deployment's size") || strings.Contains(errOut, `roles ""`) {
		t.Errorf("static without --roles: %q", errOut)
	}
}

// TestBenchAutoscaleNoneCompleted: an autoscaling run that completes no
// request (every prompt longer than the tiny KV cache) has no latencies,
// so its TTFTs and TPOTs, and those of its windows, are JSON null and
// n/a in the table, never a 0 that reads as the best latency; the exit
// code says none completed.
func TestBenchAutoscaleNoneCompleted(t *testing.T) {
	args := []string{"bench", "--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--duration", "2m",
		"--peak-rate", "1", "--trough-rate", "0.5", "--profile", "tiny", "--gpu-blocks", "10", "--block-size", "8", "--quiet"}
	code, out, errOut := benchRunCLI(t, append(args, "--json")...)
	if code != 1 || !strings.Contains(errOut, "no request succeeded") {
		t.Fatalf("exit %d, want 1 (none completed): %s", code, errOut)
	}
	var rep struct {
		Runs []map[string]any `json:"runs"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 1 || rep.Runs[0]["completed"] != 0.0 {
		t.Fatalf("runs %v, want one that completed none", rep.Runs)
	}
	r := rep.Runs[0]
	for _, k := range []string{"ttft_p90_s", "ttft_p99_s", "tpot_p90_s", "tpot_p99_s"} {
		if v, ok := r[k]; !ok || v != nil {
			t.Errorf("%s = %v, want null", k, v)
		}
	}
	if _, ok := r["attainment"].(float64); !ok {
		t.Errorf("attainment = %v, want a number (none met the SLOs)", r["attainment"])
	}
	ws, _ := r["windows"].([]any)
	if len(ws) == 0 {
		t.Fatalf("no windows: %v", r)
	}
	for i, w := range ws {
		w := w.(map[string]any)
		if w["finished"] != 0.0 || w["ttft_p90_s"] != nil || w["tpot_p90_s"] != nil {
			t.Errorf("window %d: %v, want ttft_p90_s and tpot_p90_s null (none finished)", i, w)
		}
	}

	code, out, errOut = benchRunCLI(t, args...)
	if code != 1 {
		t.Fatalf("table: exit %d: %s", code, errOut)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	row := strings.Fields(lines[len(lines)-1])
	// static, SLO met, GPU-h, ÷ static, prefill, decode, peak, started, decisions, TTFT p99, TPOT p99, failed, wall
	if len(row) != 13 || row[0] != "static" || row[9] != "n/a" || row[10] != "n/a" {
		t.Errorf("table row %q, want TTFT p99 and TPOT p99 n/a:\n%s", row, out)
	}
}

// TestParseBandFinite: --ratio takes finite numbers 0 < MIN ≤ MAX; NaN,
// which compares false with everything, and infinities are refused.
func TestParseBandFinite(t *testing.T) {
	for _, s := range []string{"1:NaN", "NaN:1", "nan:nan", "1:Inf", "1:+Inf", "Inf:Inf", "0:1", "2:1", "1", "a:b"} {
		if r, err := parseBand(s); err == nil {
			t.Errorf("--ratio %s: accepted as %+v", s, r)
		}
	}
	if r, err := parseBand("1:4"); err != nil || r.Min != 1 || r.Max != 4 {
		t.Errorf("--ratio 1:4: %+v, %v", r, err)
	}
}

// TestBenchAutoscaleAggregateBelow: --slo-aggregate-below reaches the SLO
// mode (its setting says so) and, at a load within it, the prefill role
// goes to zero while every request completes on the decode role.
func TestBenchAutoscaleAggregateBelow(t *testing.T) {
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--autoscale", "slo", "--initial-roles", "prefill=1,decode=1",
		"--profile", "7b-l40s", "--gpu-blocks", "8000", "--duration", "2m", "--peak-rate", "0.5", "--trough-rate", "0.5",
		"--prefix-tokens", "128", "--own-tokens", "256", "--output-tokens", "16", "--slo-util", "0.8:0.6", "--ratio", "1:4",
		"--slo-aggregate-below", "0.8", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep des.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 1 {
		t.Fatalf("report %+v", rep)
	}
	r := rep.Runs[0]
	if !strings.Contains(r.Setting, "aggregated on decode below 0.8") || r.Completed != rep.Requests {
		t.Fatalf("run %+v", r)
	}
	last := r.Windows[len(r.Windows)-1]
	if last.Prefill != 0 || last.Decode < 1 {
		t.Errorf("last window: %+v, want the prefill role at zero and decode serving", last)
	}
}

// TestBenchAutoscaleTPOTExpect: --slo-tpot-expect reaches the SLO mode (its
// setting says so).
func TestBenchAutoscaleTPOTExpect(t *testing.T) {
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--autoscale", "slo", "--initial-roles", "prefill=1,decode=1",
		"--profile", "7b-l40s", "--gpu-blocks", "8000", "--duration", "1m", "--peak-rate", "0.5", "--trough-rate", "0.5",
		"--prefix-tokens", "128", "--own-tokens", "256", "--output-tokens", "16", "--slo-util", "0.8:0.6", "--slo-raise-only",
		"--slo-tpot-expect", "1", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep des.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	if len(rep.Runs) != 1 || !strings.Contains(rep.Runs[0].Setting, "TPOT expected 1×SLO") {
		t.Fatalf("report %+v", rep)
	}
}

// TestBenchAutoscaleCapacity: --autoscale capacity and clairvoyant run one
// reference each per --capacity-headroom, named as such.
func TestBenchAutoscaleCapacity(t *testing.T) {
	code, out, errOut := benchRunCLI(t, "bench", "--mode", "des", "--autoscale", "capacity,clairvoyant", "--initial-roles", "prefill=1,decode=1",
		"--profile", "7b-l40s", "--gpu-blocks", "8000", "--duration", "1m", "--peak-rate", "0.5", "--trough-rate", "0.5",
		"--prefix-tokens", "128", "--own-tokens", "256", "--output-tokens", "16", "--capacity-headroom", "0,0.2", "--json")
	if code != 0 {
		t.Fatalf("exit %d: %s", code, errOut)
	}
	var rep des.ScaleReport
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatalf("not JSON: %v\n%s", err, out)
	}
	var names []string
	for _, r := range rep.Runs {
		names = append(names, r.Autoscaler+" "+r.Setting[:strings.Index(r.Setting, " (")])
		if r.Completed != rep.Requests {
			t.Errorf("%s: %d of %d completed", r.Autoscaler, r.Completed, rep.Requests)
		}
	}
	want := "capacity-reactive headroom +0 %, capacity-reactive headroom +20 %, capacity-clairvoyant headroom +0 %, capacity-clairvoyant headroom +20 %"
	if strings.Join(names, ", ") != want {
		t.Errorf("runs %q, want %q", strings.Join(names, ", "), want)
	}
}
