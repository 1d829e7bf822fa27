package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

var updateBenchJSON = flag.Bool("update-bench-json", false, "rewrite testdata/bench-json-schema.golden from the runs of TestBenchJSONSchema")

const benchJSONGolden = "testdata/bench-json-schema.golden"

// TestBenchJSONSchema: the JSON of every kind of `kvmesh bench` run
// (aggregated DES and live, --roles, --autoscale) has the shape
// testdata/bench-json-schema.golden records: each field's path (policy
// names as *, array elements as []) and the JSON types it takes over runs
// that complete requests and runs that complete none ("absent": left out
// of some of them). A field added, removed, renamed or retyped fails here
// (-update-bench-json rewrites the file); docs/BENCHMARKS.md's
// "`kvmesh bench --json`" section must name every field.
func TestBenchJSONSchema(t *testing.T) {
	dir := t.TempDir()
	trace := filepath.Join(dir, "trace.jsonl")
	if err := os.WriteFile(trace, []byte(`{"timestamp": 0, "input_length": 300, "output_length": 4, "hash_ids": [1]}
{"timestamp": 50, "input_length": 300, "output_length": 0, "hash_ids": [1]}
{"timestamp": 90, "input_length": 600, "output_length": 6, "hash_ids": [1, 2]}
`), 0o644); err != nil {
		t.Fatal(err)
	}
	cfg := filepath.Join(dir, "sched.yaml")
	if err := os.WriteFile(cfg, []byte("apiVersion: kvmesh.io/v1alpha1\nkind: SchedulerConfig\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	small := []string{"--groups", "2", "--prompts", "2", "--shared", "64", "--question", "16", "--output", "4", "--json", "--quiet"}
	failing := []string{"--groups", "1", "--prompts", "2", "--profile", "tiny", "--gpu-blocks", "10", "--block-size", "8", "--json", "--quiet"}
	runs := []struct {
		kind string
		code int
		args []string
	}{
		{"aggregated", 0, append([]string{"--mode", "des", "--engines", "2", "--policies", "kvmesh,random"}, small...)},
		{"aggregated", 1, append([]string{"--mode", "des", "--engines", "2", "--policies", "random"}, failing...)},
		{"aggregated", 0, []string{"--mode", "des", "--engines", "2", "--policies", "kvmesh", "--workload", "trace", "--trace", trace,
			"--trace-block-size", "256", "--profile-file", filepath.Join("..", "..", "loadtest", "analysis", "profiles", "7b-l40s-slowdecode.yaml"),
			"--config", cfg, "--json", "--quiet"}},
		{"aggregated", 0, append([]string{"--mode", "live", "--engines", "2", "--policies", "random"}, small...)},
		{"pd", 0, append([]string{"--mode", "des", "--roles", "prefill=1,decode=1", "--policies", "kvmesh,aggregated"}, small...)},
		{"pd", 1, append([]string{"--mode", "des", "--roles", "prefill=1,decode=1", "--policies", "kvmesh"}, failing...)},
		{"autoscale", 0, []string{"--mode", "des", "--autoscale", "static,slo", "--roles", "prefill=1,decode=1", "--duration", "2m",
			"--peak-rate", "1", "--trough-rate", "0.5", "--json", "--quiet"}},
		{"autoscale", 1, []string{"--mode", "des", "--autoscale", "static", "--roles", "prefill=1,decode=1", "--duration", "2m",
			"--peak-rate", "1", "--trough-rate", "0.5", "--profile", "tiny", "--gpu-blocks", "10", "--block-size", "8", "--json", "--quiet"}},
	}
	types := map[string]map[string]bool{} // "kind path" → JSON types
	paths := map[string][]map[string]bool{}
	for _, r := range runs {
		code, out, errOut := benchRunCLI(t, append([]string{"bench"}, r.args...)...)
		if code != r.code {
			t.Fatalf("%v: exit %d, want %d: %s", r.args, code, r.code, errOut)
		}
		var v any
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			t.Fatalf("%v: %v\n%s", r.args, err, out)
		}
		seen := map[string]bool{}
		jsonShape(v, "", func(path, typ string) {
			k := r.kind + " " + path
			if types[k] == nil {
				types[k] = map[string]bool{}
			}
			types[k][typ], seen[k] = true, true
		})
		paths[r.kind] = append(paths[r.kind], seen)
	}
	for kind, outs := range paths { // a path some runs of its kind leave out
		for k := range types {
			if !strings.HasPrefix(k, kind+" ") {
				continue
			}
			for _, seen := range outs {
				if !seen[k] {
					types[k]["absent"] = true
				}
			}
		}
	}
	var lines []string
	for _, k := range slices.Sorted(maps.Keys(types)) {
		lines = append(lines, k+" "+strings.Join(slices.Sorted(maps.Keys(types[k])), "|"))
	}
	got := "# kvmesh bench --json: kind, field path, JSON types (TestBenchJSONSchema; -update-bench-json rewrites it)\n" +
		strings.Join(lines, "\n") + "\n"
	if *updateBenchJSON {
		if err := os.WriteFile(benchJSONGolden, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(benchJSONGolden)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Errorf("the JSON's shape differs from %s (-update-bench-json rewrites it; document the change in docs/BENCHMARKS.md):\n%s",
			benchJSONGolden, lineDiff(string(want), got))
	}

	// Every field is documented.
	doc, err := os.ReadFile(filepath.Join("..", "..", "docs", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	start := strings.Index(string(doc), "### `kvmesh bench --json`")
	if start < 0 {
		t.Fatal("docs/BENCHMARKS.md has no \"### `kvmesh bench --json`\" section")
	}
	sec := string(doc[start:])
	if end := strings.Index(sec[4:], "\n## "); end >= 0 {
		sec = sec[:end+4]
	}
	if end := strings.Index(sec[4:], "\n### "); end >= 0 {
		sec = sec[:end+4]
	}
	field := regexp.MustCompile(`[a-z0-9_]+$`)
	documented := map[string]bool{}
	for k := range types {
		name := field.FindString(strings.TrimSuffix(strings.Fields(k)[1], "[]"))
		if name == "" || documented[name] {
			continue
		}
		documented[name] = true
		if !strings.Contains(sec, "`"+name+"`") {
			t.Errorf("docs/BENCHMARKS.md's JSON section does not name `%s` (%s)", name, k)
		}
	}
}

// jsonShape calls f with every path of v and the JSON type there: object
// keys joined by ".", a "policies" object's keys (policy names) as "*",
// array elements as "[]".
func jsonShape(v any, path string, f func(path, typ string)) {
	switch x := v.(type) {
	case map[string]any:
		if path != "" {
			f(path, "object")
		}
		for k, e := range x {
			name := k
			if strings.HasSuffix(path, "policies") && path != "run.policies" {
				name = "*"
			}
			jsonShape(e, strings.TrimPrefix(path+"."+name, "."), f)
		}
	case []any:
		f(path, "array")
		for _, e := range x {
			jsonShape(e, path+"[]", f)
		}
	case string:
		f(path, "string")
	case float64:
		f(path, "number")
	case bool:
		f(path, "bool")
	case nil:
		f(path, "null")
	default:
		panic(fmt.Sprintf("%s: %T", path, v))
	}
}

// lineDiff lists the lines only in want (-) and only in got (+).
func lineDiff(want, got string) string {
	w, g := map[string]bool{}, map[string]bool{}
	for _, l := range strings.Split(want, "\n") {
		w[l] = true
	}
	for _, l := range strings.Split(got, "\n") {
		g[l] = true
	}
	var b strings.Builder
	for _, l := range strings.Split(want, "\n") {
		if !g[l] {
			b.WriteString("- " + l + "\n")
		}
	}
	for _, l := range strings.Split(got, "\n") {
		if !w[l] {
			b.WriteString("+ " + l + "\n")
		}
	}
	return b.String()
}
