package main

import (
	"encoding/json"
	"os"
	"path/filepath"
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

// TestBenchPDUsage: combinations that would run something other than what
// was asked are refused, naming why.
func TestBenchPDUsage(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"bench", "--mode", "live", "--roles", "prefill=1,decode=1"}, "--roles runs in --mode des only"},
		{[]string{"bench", "--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--html", "x.html"},
			"--html is not written for --autoscale"},
	} {
		code, out, errOut := benchRunCLI(t, tc.args...)
		if code != 2 || out != "" || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want 2 naming %q", tc.args, code, out, errOut, tc.want)
		}
	}
}
