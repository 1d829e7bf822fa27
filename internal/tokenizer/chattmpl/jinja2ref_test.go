package chattmpl_test

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// Python Jinja2 is the reference: vLLM renders chat templates with
// transformers' apply_chat_template, which compiles them in Jinja2's
// ImmutableSandboxedEnvironment with the settings below. make deps installs
// Debian's python3-jinja2 for /usr/bin/python3; a test that needs it skips
// without it (and fails with CI=true).

// jinja2Script renders jobs ({"template", "vars"} on stdin, one JSON list)
// exactly as transformers' _compile_jinja_template sets Jinja2 up, and
// prints one {"out"} or {"err"} per job.
const jinja2Script = `
import json, sys
from datetime import datetime
import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

class AssistantTracker(Extension):
    tags = {"generation"}
    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_render_assistant", []), [], [], body).set_lineno(lineno)
    def _render_assistant(self, caller):
        return caller()

def raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)

def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

def strftime_now(format):
    return datetime.now().strftime(format)

env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[AssistantTracker, loopcontrols])
env.filters["tojson"] = tojson
env.globals["raise_exception"] = raise_exception
env.globals["strftime_now"] = strftime_now

out = []
compiled = {}
for job in json.load(sys.stdin):
    try:
        t = compiled.get(job["template"])
        if t is None:
            t = compiled[job["template"]] = env.from_string(job["template"])
        out.append({"out": t.render(**job["vars"])})
    except Exception as e:
        out.append({"err": type(e).__name__ + ": " + str(e)})
json.dump({"version": jinja2.__version__, "results": out}, sys.stdout)
`

type jinja2Job struct {
	Template string          `json:"template"`
	Vars     json.RawMessage `json:"vars"`
}

type jinja2Result struct {
	Out string `json:"out"`
	Err string `json:"err,omitempty"`
}

// pythonJinja2 is a Python 3 with Jinja2 3.x (make deps installs
// python3-jinja2 for /usr/bin/python3).
func pythonJinja2(t *testing.T) string {
	t.Helper()
	return testutil.Python(t, "import jinja2; assert jinja2.__version__.startswith('3.')",
		"python3 with Jinja2 3.x (Debian's python3-jinja2) is needed: it is the reference renderer vLLM uses")
}

// renderJinja2 renders jobs with Python Jinja2 in one process.
func renderJinja2(t *testing.T, jobs []jinja2Job) []jinja2Result {
	t.Helper()
	py := pythonJinja2(t)
	in, err := json.Marshal(jobs)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(py, "-c", jinja2Script)
	cmd.Stdin = bytes.NewReader(in)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("python3 jinja2: %v\n%s", err, stderr.String())
	}
	var res struct {
		Version string         `json:"version"`
		Results []jinja2Result `json:"results"`
	}
	if err := json.Unmarshal(out, &res); err != nil {
		t.Fatalf("python3 jinja2 output: %v", err)
	}
	if len(res.Results) != len(jobs) {
		t.Fatalf("python3 jinja2: %d results for %d jobs", len(res.Results), len(jobs))
	}
	t.Logf("reference: Jinja2 %s", res.Version)
	return res.Results
}

// TestTemplatesJinja2 renders every real template of templateDir with
// every conversation of diffCases by Python Jinja2 (what vLLM renders
// with) and by chattmpl: the texts must be identical, or both must fail.
// Unlike @huggingface/jinja, Jinja2 has no divergences to list.
func TestTemplatesJinja2(t *testing.T) {
	names := templateFiles(t)
	var jobs []jinja2Job
	for _, n := range names {
		src := readTemplate(t, n)
		for _, c := range diffCases {
			jobs = append(jobs, jinja2Job{Template: src, Vars: json.RawMessage(withTemplateVars(c.vars))})
		}
	}
	ref := renderJinja2(t, jobs)
	same, bothFailed := 0, 0
	for i, job := range jobs {
		name, c := names[i/len(diffCases)], diffCases[i%len(diffCases)]
		got, err := renderOurs(job.Template, job.Vars)
		switch {
		case err != nil && ref[i].Err != "":
			bothFailed++
			t.Logf("%s / %s: both fail: Jinja2 %s; chattmpl %v", name, c.name, ref[i].Err, err)
		case err != nil:
			t.Errorf("%s / %s: chattmpl failed (%v); Jinja2 rendered %q", name, c.name, err, clip(ref[i].Out))
		case ref[i].Err != "":
			t.Errorf("%s / %s: Jinja2 failed (%s); chattmpl rendered %q", name, c.name, ref[i].Err, clip(got))
		case got != ref[i].Out:
			t.Errorf("%s / %s: differs at byte %d\n ours %q\n  ref %q", name, c.name, diffAt(got, ref[i].Out), around(got, ref[i].Out), around(ref[i].Out, got))
		default:
			same++
		}
	}
	t.Logf("%d templates x %d cases: %d identical renders, %d rejected by both", len(names), len(diffCases), same, bothFailed)
	if same < len(jobs)*3/4 {
		t.Errorf("only %d of %d jobs rendered", same, len(jobs))
	}
}

// TestJinja2CasesReference renders every case of jinja2Cases with Python
// Jinja2: the expected texts in the table are Jinja2's (and a case that
// expects an error fails there too).
func TestJinja2CasesReference(t *testing.T) {
	jobs := make([]jinja2Job, len(jinja2Cases))
	for i, c := range jinja2Cases {
		jobs[i] = jinja2Job{Template: c.source(t), Vars: json.RawMessage(c.varsJSON())}
	}
	ref := renderJinja2(t, jobs)
	for i, c := range jinja2Cases {
		switch {
		case c.err != "" && ref[i].Err == "":
			t.Errorf("%s: %s: Jinja2 rendered %q; the table expects an error", c.name, c.src, ref[i].Out)
		case c.err == "" && ref[i].Err != "":
			t.Errorf("%s: %s: Jinja2 failed (%s); the table expects %q", c.name, c.src+c.file, ref[i].Err, c.want)
		case c.unsupported && strings.HasSuffix(c.want, " at 0x…>"): // an object address
			if !strings.HasPrefix(ref[i].Out, strings.TrimSuffix(c.want, "…>")) {
				t.Errorf("%s: %s:\n Jinja2 %q\n  table %q", c.name, c.src, ref[i].Out, c.want)
			}
		case c.err == "" && ref[i].Out != c.want:
			t.Errorf("%s: %s:\n Jinja2 %q\n  table %q", c.name, c.src+c.file, ref[i].Out, c.want)
		case c.err != "" && c.err != "unsupported" && !strings.Contains(ref[i].Err, c.err):
			t.Errorf("%s: %s: Jinja2 failed with %q, the table expects %q", c.name, c.src, ref[i].Err, c.err)
		}
	}
}
