// Package hfjinja runs @huggingface/jinja, the JavaScript Jinja port that
// Hugging Face maintains for chat templates, under Node.js so tests can use it
// as the reference renderer for chat templates. It installs the pinned npm
// package into the user cache directory once and renders a batch of jobs in
// one node process.
//
// It is test support: nothing outside _test.go files imports it. When node or
// npm is missing the caller's test is skipped, except with CI=true, where it
// fails (a missing tool must not turn a differential test into a pass).
package hfjinja

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Version is the pinned @huggingface/jinja release.
const Version = "0.5.11"

// Job is one render: a template source and its variables as a JSON object
// (raw, so key order survives into the JavaScript objects).
type Job struct {
	Template string          `json:"template"`
	Vars     json.RawMessage `json:"vars"`
}

// Result is the rendered text, or the error message when rendering failed.
type Result struct {
	Out string `json:"out"`
	Err string `json:"err,omitempty"`
}

// script renders every job; templates are compiled once per distinct source.
const script = `import { Template } from "@huggingface/jinja";
import { readFileSync } from "node:fs";
const jobs = JSON.parse(readFileSync(process.argv[2], "utf8"));
const compiled = new Map();
const out = jobs.map((j) => {
  try {
    let t = compiled.get(j.template);
    if (!t) { t = new Template(j.template); compiled.set(j.template, t); }
    return { out: t.render(j.vars) };
  } catch (e) {
    return { out: "", err: String((e && e.message) || e) };
  }
});
process.stdout.write(JSON.stringify(out));
`

// Render renders jobs with @huggingface/jinja and returns one result per job.
func Render(tb testing.TB, jobs []Job) []Result {
	tb.Helper()
	var res []Result
	testutil.RunNode(tb, install(tb), "render.mjs", nil, jobs, &res, 2*time.Minute)
	if len(res) != len(jobs) {
		tb.Fatalf("node render.mjs: %d results for %d jobs", len(res), len(jobs))
	}
	return res
}

// install returns a directory holding node_modules/@huggingface/jinja and
// render.mjs, installing it on first use.
func install(tb testing.TB) string {
	tb.Helper()
	return testutil.NPMPackages(tb, "hfjinja-"+Version, "@huggingface/jinja is the reference chat-template renderer",
		[]string{"@huggingface/jinja@" + Version}, map[string]string{"render.mjs": script})
}
