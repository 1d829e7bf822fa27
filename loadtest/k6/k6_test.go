package k6

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// TestScriptsParse checks every script with `node --check` (k6 cannot run here). The
// scripts are ES modules, so each is checked under a .mjs name: node treats a .js file
// with import statements leniently and would accept syntax errors.
func TestScriptsParse(t *testing.T) {
	node := testutil.RequireTool(t, "node", "k6 cannot run here, so node --check parses the scripts")
	scripts, err := filepath.Glob("*.js")
	if err != nil || len(scripts) < 4 {
		t.Fatalf("scripts: %v %v", scripts, err)
	}
	dir := t.TempDir()
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		dst := filepath.Join(dir, s[:len(s)-len(".js")]+".mjs")
		if err := os.WriteFile(dst, b, 0o644); err != nil {
			t.Fatal(err)
		}
		if out, err := exec.Command(node, "--check", dst).CombinedOutput(); err != nil {
			t.Errorf("%s: %v\n%s", s, err, out)
		}
	}
	// The check must be able to fail.
	bad := filepath.Join(dir, "bad.mjs")
	if err := os.WriteFile(bad, []byte("export default function ( {\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := exec.Command(node, "--check", bad).Run(); err == nil {
		t.Fatal("node --check accepted a syntax error")
	}
}

// k6 cannot run here (nor may its Go module be used), so these tests run the scripts under node
// with a fake of k6's API: testdata/fake-k6 (its README says what it fakes). The fake runs the
// scripts' own code, on a virtual clock, with the executors the scripts declare; its http.post
// records every request (virtual send time, headers, body) and answers after a fixed latency.
// One node process runs all the cases of a test (node starts slowly on a loaded machine).

// fakeCase is one run of a script under the fake.
type fakeCase struct {
	Script    string            `json:"script"`
	ScriptDir string            `json:"scriptDir"`
	Env       map[string]string `json:"env"`
	Latency   float64           `json:"latency"`  // s per fake request
	InitOnly  bool              `json:"initOnly"` // only run the init context
	Call      *fakeCall         `json:"call,omitempty"`
	// StdoutTTY and NoColor are what k6 tells handleSummary: stdout is a
	// terminal, --no-color was given.
	StdoutTTY bool `json:"stdoutTTY"`
	NoColor   bool `json:"noColor"`
}

// fakeCall calls an exported function of the script after its init context.
type fakeCall struct {
	Fn   string `json:"fn"`
	Args []any  `json:"args"`
}

// fakeRun is what testdata/fake-k6/harness.mjs prints for a case.
type fakeRun struct {
	InitError string          `json:"initError"`
	RunError  string          `json:"runError"`
	Value     json.RawMessage `json:"value"`
	Options   json.RawMessage `json:"options"`
	Requests  []fakeRequest   `json:"requests"`
	Errors    []struct {
		Iteration int    `json:"iteration"`
		Message   string `json:"message"`
	} `json:"errors"`
	Dropped    int               `json:"dropped"`
	Iterations int               `json:"iterations"`
	Summary    map[string]string `json:"summary"`
}

type fakeRequest struct {
	T         float64           `json:"t"` // s after the scenario's start
	VU        int               `json:"vu"`
	Iteration int               `json:"iteration"`
	URL       string            `json:"url"`
	Headers   map[string]string `json:"headers"`
	Body      struct {
		Prompt    []int `json:"prompt"`
		MaxTokens *int  `json:"max_tokens"`
		Messages  []struct {
			Role    string `json:"role"`
			Content string `json:"content"`
		} `json:"messages"`
	} `json:"body"`
}

// fakeK6 is a directory where the scripts' k6 imports resolve to the fake of k6's API.
type fakeK6 struct {
	node, dir, scriptDir string
}

func newFakeK6(t *testing.T) *fakeK6 {
	t.Helper()
	node := testutil.RequireTool(t, "node", "k6 cannot run here, so the scripts run under node with a fake of k6's API")
	scriptDir, err := filepath.Abs(".")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	write := func(name string, b []byte) {
		t.Helper()
		if err := os.MkdirAll(filepath.Dir(name), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(name, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(dir, "package.json"), []byte(`{"type": "module"}`+"\n"))
	scripts, _ := filepath.Glob("*.js")
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		write(filepath.Join(dir, "scripts", s), b)
	}
	fakes, _ := filepath.Glob("testdata/fake-k6/*")
	for _, f := range fakes {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if filepath.Base(f) == "harness.mjs" {
			write(filepath.Join(dir, "harness.mjs"), b)
		} else {
			write(filepath.Join(dir, "node_modules", "k6", filepath.Base(f)), b)
		}
	}
	return &fakeK6{node: node, dir: dir, scriptDir: scriptDir}
}

// run runs the cases in one node process.
func (f *fakeK6) run(t *testing.T, cases ...fakeCase) []fakeRun {
	t.Helper()
	for i := range cases {
		cases[i].Script = filepath.Join(f.dir, "scripts", cases[i].Script)
		cases[i].ScriptDir = f.scriptDir
		if cases[i].Latency == 0 {
			cases[i].Latency = 0.5
		}
	}
	c, err := json.Marshal(cases)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := os.CreateTemp(f.dir, "cases-*.json")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cf.Write(c); err != nil {
		t.Fatal(err)
	}
	cf.Close()
	cmd := exec.Command(f.node, filepath.Join(f.dir, "harness.mjs"), cf.Name())
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("node harness.mjs: %v\n%s", err, stderr.String())
	}
	var runs []fakeRun
	if err := json.Unmarshal(stdout.Bytes(), &runs); err != nil || len(runs) != len(cases) {
		t.Fatalf("harness output (%d runs for %d cases): %v\n%.500s", len(runs), len(cases), err, stdout.String())
	}
	return runs
}

// writeTrace writes rows (JSON lines) to a file and returns its path.
func writeTrace(t *testing.T, rows string) string {
	t.Helper()
	trace := filepath.Join(t.TempDir(), "trace.jsonl")
	if err := os.WriteFile(trace, []byte(rows), 0o644); err != nil {
		t.Fatal(err)
	}
	return trace
}

// replay runs trace-replay.js on a trace of rows once per env, checks that each run loaded and
// ran without an error, and returns each run's requests by prompt length (the test traces give
// each row its own input_length).
func (f *fakeK6) replay(t *testing.T, rows string, envs ...map[string]string) ([]fakeRun, []map[int]fakeRequest) {
	t.Helper()
	trace := writeTrace(t, rows)
	cases := make([]fakeCase, len(envs))
	for i, env := range envs {
		e := map[string]string{"TRACE": trace}
		for k, v := range env {
			e[k] = v
		}
		cases[i] = fakeCase{Script: "trace-replay.js", Env: e}
	}
	runs := f.run(t, cases...)
	byLens := make([]map[int]fakeRequest, len(runs))
	for i, r := range runs {
		if r.InitError != "" || r.RunError != "" {
			t.Fatalf("%v: init %s; run %s", envs[i], r.InitError, r.RunError)
		}
		for _, e := range r.Errors {
			t.Errorf("%v: iteration %d: %s", envs[i], e.Iteration, e.Message)
		}
		byLens[i] = make(map[int]fakeRequest)
		for _, q := range r.Requests {
			if _, dup := byLens[i][len(q.Body.Prompt)]; dup {
				t.Errorf("%v: two requests of %d prompt tokens", envs[i], len(q.Body.Prompt))
			}
			byLens[i][len(q.Body.Prompt)] = q
		}
	}
	return runs, byLens
}

// sentAt checks the virtual send times of the requests by prompt length.
func sentAt(t *testing.T, what string, byLen map[int]fakeRequest, want map[int]float64) {
	t.Helper()
	if len(byLen) != len(want) {
		t.Errorf("%s: %d requests sent, want %d", what, len(byLen), len(want))
	}
	for n, at := range want {
		q, ok := byLen[n]
		if !ok {
			t.Errorf("%s: the request of %d prompt tokens was not sent", what, n)
			continue
		}
		if math.Abs(q.T-at) > 1e-6 {
			t.Errorf("%s: the request of %d prompt tokens was sent at %.6g s, want %g s", what, n, q.T, at)
		}
	}
}

func commonPrefix(a, b []int) int {
	n := 0
	for n < len(a) && n < len(b) && a[n] == b[n] {
		n++
	}
	return n
}

// Epoch-millisecond timestamps count from the earliest row (the old script slept ~1.7e9 s).
func TestTraceReplayEpochTimestamps(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 1700000001500, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 1700000000000, "input_length": 700, "output_length": 4, "hash_ids": [3, 4]}
{"timestamp": 1700000003000, "input_length": 800, "output_length": 4, "hash_ids": [5, 6]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "3"}, map[string]string{"VUS": "3", "RATE_SCALE": "2"})
	sentAt(t, "RATE_SCALE=1", got[0], map[int]float64{700: 0, 600: 1.5, 800: 3})
	sentAt(t, "RATE_SCALE=2", got[1], map[int]float64{700: 0, 600: 0.75, 800: 1.5})
}

// Rows in any order are sorted by time (ties keep file order) and LIMIT keeps the earliest.
func TestTraceReplayUnsortedRows(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 3000, "input_length": 600, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 1000, "input_length": 700, "output_length": 4, "hash_ids": [3, 4]}
{"timestamp": 2000, "input_length": 800, "output_length": 4, "hash_ids": [5, 6]}
{"timestamp": 1000, "input_length": 900, "output_length": 4, "hash_ids": [7, 8]}
`
	r, got := f.replay(t, rows, map[string]string{"VUS": "3", "LIMIT": "3"}, map[string]string{"VUS": "1"})
	sentAt(t, "LIMIT=3", got[0], map[int]float64{700: 0, 900: 0, 800: 1})
	if q := r[0].Requests; len(q) == 3 && len(q[0].Body.Prompt) != 700 {
		t.Errorf("first request has %d prompt tokens, want 700 (ties keep file order)", len(q[0].Body.Prompt))
	}
	// One VU takes the requests in time order: none waits behind a later one (each takes 0.5 s).
	sentAt(t, "VUS=1", got[1], map[int]float64{700: 0, 900: 0.5, 800: 1, 600: 2})
}

// aiperf's multi-turn rows (session_id + delay, no timestamp) are sent delay after the previous
// turn's answer, with the session in X-Session-ID; the old script sent them at once (due NaN).
func TestTraceReplaySessionDelay(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 0, "session_id": "a", "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
{"session_id": "a", "delay": 2000, "input_length": 1300, "output_length": 5, "hash_ids": [1, 2, 3]}
{"timestamp": 500, "input_length": 700, "output_length": 5, "hash_ids": [9, 10]}
{"session_id": "a", "delay": 1000, "input_length": 1900, "output_length": 5, "hash_ids": [1, 2, 3, 4]}
`
	// Each fake request takes 0.5 s; RATE_SCALE divides the delays as it divides the timestamps.
	r, got := f.replay(t, rows, map[string]string{"VUS": "2"}, map[string]string{"VUS": "2", "RATE_SCALE": "2"})
	sentAt(t, "RATE_SCALE=1", got[0], map[int]float64{600: 0, 1300: 0.5 + 2, 1900: 0.5 + 2 + 0.5 + 1, 700: 0.5})
	sentAt(t, "RATE_SCALE=2", got[1], map[int]float64{600: 0, 1300: 0.5 + 1, 1900: 0.5 + 1 + 0.5 + 0.5, 700: 0.25})
	for n, want := range map[int]string{600: "a", 1300: "a", 1900: "a", 700: ""} {
		if h := got[0][n].Headers["X-Session-ID"]; h != want {
			t.Errorf("request of %d prompt tokens: X-Session-ID %q, want %q", n, h, want)
		}
	}
	if a, b, c := got[0][600], got[0][1300], got[0][1900]; a.Iteration != b.Iteration || a.Iteration != c.Iteration || len(r[0].Requests) != 4 {
		t.Errorf("the session's turns ran in iterations %d, %d, %d: want one", a.Iteration, b.Iteration, c.Iteration)
	}
}

// A row without hash_ids (or with none) is a prompt of its own: input_length tokens shared with
// no other row (the old script threw a TypeError in the iteration, outside kvmesh_failed).
func TestTraceReplayMissingHashIDs(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 0, "input_length": 700, "output_length": 3}
{"timestamp": 0, "input_length": 701, "output_length": 3, "hash_ids": []}
{"timestamp": 0, "input_length": 702, "output_length": 3, "hash_ids": null}
{"timestamp": 0, "input_length": 703, "output_length": 3, "hash_ids": [1, 2]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "4"})
	sentAt(t, "", got[0], map[int]float64{700: 0, 701: 0, 702: 0, 703: 0})
	for _, a := range []int{700, 701, 702} {
		for _, b := range []int{700, 701, 702, 703} {
			if n := commonPrefix(got[0][a].Body.Prompt, got[0][b].Body.Prompt); a != b && n >= 16 {
				t.Errorf("prompts of %d and %d tokens share %d leading tokens: want their own", a, b, n)
			}
		}
	}
}

// hash_ids rounded down (Dynamo: input_length // block ids) or up (Mooncake: the last block
// partial) both give input_length tokens: the blocks' tokens, then the row's own (the old script
// cut a round-down prompt to 512 × ids).
func TestTraceReplayRoundDownHashIDs(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 0, "input_length": 1100, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 1101, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 1000, "output_length": 3, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 1102, "output_length": 3, "hash_ids": [1, 2, 3]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "4"})
	sentAt(t, "", got[0], map[int]float64{1100: 0, 1101: 0, 1000: 0, 1102: 0})
	for _, c := range []struct{ a, b, min, max int }{
		{1100, 1101, 1024, 1040}, // the two blocks, then each row's own tokens
		{1100, 1102, 1024, 1040}, // own tokens against block 3's
		{1100, 1000, 1000, 1000}, // the round-up row is a prefix of the two blocks
	} {
		if n := commonPrefix(got[0][c.a].Body.Prompt, got[0][c.b].Body.Prompt); n < c.min || n > c.max {
			t.Errorf("prompts of %d and %d tokens share %d leading tokens, want %d..%d", c.a, c.b, n, c.min, c.max)
		}
	}
}

// TRACE_BLOCK_SIZE sets the tokens per hash id (the old script had 512 hard-coded); a trace read
// with the wrong one stops at init, naming the line and the block size that fits.
func TestTraceReplayBlockSize(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 0, "input_length": 40, "output_length": 3, "hash_ids": [5, 6, 7]}
{"timestamp": 0, "input_length": 41, "output_length": 3, "hash_ids": [5, 6, 8]}
{"timestamp": 0, "input_length": 20, "output_length": 3, "hash_ids": [5]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "3", "TRACE_BLOCK_SIZE": "16"})
	sentAt(t, "", got[0], map[int]float64{40: 0, 41: 0, 20: 0})
	if n := commonPrefix(got[0][40].Body.Prompt, got[0][41].Body.Prompt); n < 32 || n >= 40 {
		t.Errorf("rows of blocks 5,6,7 and 5,6,8 share %d leading tokens, want 32 (two 16-token blocks) up to 40", n)
	}
	if n := commonPrefix(got[0][40].Body.Prompt, got[0][20].Body.Prompt); n < 16 || n >= 20 {
		t.Errorf("rows of blocks 5,6,7 and 5 share %d leading tokens, want 16 up to 20", n)
	}
	r := f.run(t, fakeCase{Script: "trace-replay.js", Env: map[string]string{"TRACE": writeTrace(t, rows)}, InitOnly: true})
	if e := r[0].InitError; !strings.Contains(e, "trace line 1") || !strings.Contains(e, "TRACE_BLOCK_SIZE=16") {
		t.Errorf("16-token blocks read as 512: init error %q, want one naming line 1 and TRACE_BLOCK_SIZE=16", e)
	}
}

// A row without output_length generates OUTPUT tokens (default 64; the old script sent
// max_tokens null); output_length 0 generates one, as the Go reader's.
func TestTraceReplayMissingOutputLength(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"timestamp": 0, "input_length": 600, "hash_ids": [1, 2]}
{"timestamp": 0, "input_length": 700, "output_length": 9, "hash_ids": [3, 4]}
{"timestamp": 0, "input_length": 800, "output_length": 0, "hash_ids": [5, 6]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "3"}, map[string]string{"VUS": "3", "OUTPUT": "7"})
	for i, def := range []int{64, 7} {
		for n, want := range map[int]int{600: def, 700: 9, 800: 1} {
			if m := got[i][n].Body.MaxTokens; m == nil || *m != want {
				t.Errorf("run %d: request of %d prompt tokens: max_tokens %v, want %d", i, n, m, want)
			}
		}
	}
	r := f.run(t, fakeCase{Script: "trace-replay.js", Env: map[string]string{"TRACE": writeTrace(t, rows), "OUTPUT": "0"}, InitOnly: true})
	if e := r[0].InitError; !strings.Contains(e, "trace line 1: missing output_length") {
		t.Errorf("OUTPUT=0: init error %q, want line 1's missing output_length", e)
	}
}

// Bailian's traces (TRACE_FORMAT=bailian): timestamps in seconds, 16-token blocks, sessions
// linked by chat_id / parent_chat_id, 64-bit hash ids kept exact (a signed one keeps its bits).
func TestTraceReplayBailian(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	rows := `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 20, "output_length": 3, "hash_ids": [-1]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 11.5, "input_length": 21, "output_length": 3, "hash_ids": [18446744073709551615]}
{"chat_id": 3, "parent_chat_id": -1, "timestamp": 12.0, "input_length": 22, "output_length": 3, "hash_ids": [9007199254740993]}
{"chat_id": 4, "parent_chat_id": -1, "timestamp": 12.0, "input_length": 23, "output_length": 3, "hash_ids": [9007199254740992]}
`
	_, got := f.replay(t, rows, map[string]string{"VUS": "4", "TRACE_FORMAT": "bailian"})
	sentAt(t, "", got[0], map[int]float64{20: 0, 21: 1.5, 22: 2, 23: 2})
	for n, want := range map[int]string{20: "b1", 21: "b1", 22: "b3", 23: "b4"} {
		if h := got[0][n].Headers["X-Session-ID"]; h != want {
			t.Errorf("request of %d prompt tokens: X-Session-ID %q, want %q", n, h, want)
		}
	}
	if n := commonPrefix(got[0][20].Body.Prompt, got[0][21].Body.Prompt); n < 16 {
		t.Errorf("hash ids -1 and 2^64-1 share %d leading tokens, want their 16-token block", n)
	}
	if n := commonPrefix(got[0][22].Body.Prompt, got[0][23].Body.Prompt); n >= 16 {
		t.Errorf("hash ids 2^53+1 and 2^53 share %d leading tokens: want different blocks", n)
	}
}

// A malformed trace stops k6 at init with an error naming the line, as the Go reader's does.
func TestTraceReplayBadRows(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	ok := `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}` + "\n"
	bad := []struct{ row, want string }{
		{`{"timestamp": 5, "output_length": 3}`, "missing input_length"},
		{`{"timestamp": 5, "text_input": "hi", "output_length": 3}`, "text_input without input_length"},
		{`{"input_length": 10, "output_length": 3}`, "missing timestamp"},
		{`{"session_id": "s", "delay": 5, "input_length": 10, "output_length": 3}`, "missing timestamp"},
		{`{"timestamp": 5, "input_length": 2000, "output_length": 3, "hash_ids": [1]}`, "does not fit 1 blocks of 512"},
		{`{"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": [1.5]}`, "hash id 1.5"},
		{`{"timestamp": 5, "input_length": 10, "output_length": 3, "hash_ids": ["7"]}`, "hash id \"7\""},
		{`{"timestamp": -5, "input_length": 10, "output_length": 3}`, "timestamp -5"},
		{`{"timestamp": 5, "input_length": 0, "output_length": 3}`, "input_length 0"},
		{`{"timestamp": 5,`, "trace line 2"},
	}
	cases := make([]fakeCase, len(bad))
	for i, c := range bad {
		cases[i] = fakeCase{Script: "trace-replay.js", Env: map[string]string{"TRACE": writeTrace(t, ok+c.row+"\n")}, InitOnly: true}
	}
	for i, r := range f.run(t, cases...) {
		if !strings.Contains(r.InitError, "trace line 2") || !strings.Contains(r.InitError, bad[i].want) {
			t.Errorf("%s: init error %q, want trace line 2 and %q", bad[i].row, r.InitError, bad[i].want)
		}
	}
}

// shared-prefix.js sends each of its GROUPS × PROMPTS prompts exactly once, closed-loop or at any
// RATE (the old one ran RATE × ceil(TOTAL/RATE) iterations and wrapped: at RATE=20, 520 requests
// for 512 prompts, the repeats fully cached).
func TestSharedPrefixSendsEachPromptOnce(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	const groups, prompts, shared = 32, 16, 32
	rates := []string{"0", "20", "7", "0.33", "1000"}
	cases := make([]fakeCase, len(rates))
	for i, rate := range rates {
		cases[i] = fakeCase{Script: "shared-prefix.js", Latency: 0.01, Env: map[string]string{
			"GROUPS": fmt.Sprint(groups), "PROMPTS": fmt.Sprint(prompts), "SHARED": fmt.Sprint(shared), "QUESTION": "8", "RATE": rate}}
	}
	for i, r := range f.run(t, cases...) {
		rate := rates[i]
		if r.InitError != "" || r.RunError != "" || len(r.Errors) > 0 || r.Dropped > 0 {
			t.Errorf("RATE=%s: init %q, run %q, errors %v, %d dropped", rate, r.InitError, r.RunError, r.Errors, r.Dropped)
			continue
		}
		if len(r.Requests) != groups*prompts {
			t.Errorf("RATE=%s: %d requests, want %d", rate, len(r.Requests), groups*prompts)
		}
		seen := make(map[string]int)
		perGroup := make(map[string]int)
		for _, q := range r.Requests {
			b, _ := json.Marshal(q.Body.Prompt)
			seen[string(b)]++
			g, _ := json.Marshal(q.Body.Prompt[:shared])
			perGroup[string(g)]++
		}
		repeats := 0
		for _, n := range seen {
			repeats += n - 1
		}
		if repeats > 0 {
			t.Errorf("RATE=%s: %d repeated prompts", rate, repeats)
		}
		if len(seen) != groups*prompts || len(perGroup) != groups {
			t.Errorf("RATE=%s: %d distinct prompts in %d groups, want %d in %d", rate, len(seen), len(perGroup), groups*prompts, groups)
		}
		for _, n := range perGroup {
			if n != prompts {
				t.Errorf("RATE=%s: a group has %d prompts, want %d", rate, n, prompts)
				break
			}
		}
	}
}

// Every script runs with fewer iterations than its default VUs (k6 refuses a shared-iterations
// scenario with more VUs than iterations; the old scripts passed VUS through).
func TestScriptsFewerIterationsThanVUs(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	trace := writeTrace(t, `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`+"\n")
	want := []int{1, 4, 4}
	runs := f.run(t,
		fakeCase{Script: "trace-replay.js", Env: map[string]string{"TRACE": trace}, Latency: 0.01},
		fakeCase{Script: "shared-prefix.js", Env: map[string]string{"GROUPS": "2", "PROMPTS": "2", "SHARED": "16", "QUESTION": "4"}, Latency: 0.01},
		fakeCase{Script: "chat-sessions.js", Env: map[string]string{"SESSIONS": "2", "TURNS": "2", "SYSTEM": "16", "USER": "4", "OUTPUT": "4", "THINK": "0"}, Latency: 0.01},
	)
	for i, r := range runs {
		if r.InitError != "" || r.RunError != "" || len(r.Errors) > 0 || len(r.Requests) != want[i] {
			t.Errorf("case %d: init %q, run %q, errors %v, %d requests, want %d", i, r.InitError, r.RunError, r.Errors, len(r.Requests), want[i])
		}
	}
}

// The documented trace-replay commands (the k6 section of loadtest/README.md and the script's own
// header) work from the repository root: k6 resolves a relative TRACE against the script's
// directory, and so does the fake's open().
func TestTraceReplayDocumentedCommand(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	root, err := filepath.Abs("../..")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../README.md")
	if err != nil {
		t.Fatal(err)
	}
	script, err := os.ReadFile("trace-replay.js")
	if err != nil {
		t.Fatal(err)
	}
	sec := string(readme)
	if i := strings.Index(sec, "## k6 scripts"); i >= 0 {
		sec = sec[i:]
	} else {
		t.Fatal("loadtest/README.md has no k6 section")
	}
	if i := strings.Index(sec[1:], "\n## "); i >= 0 {
		sec = sec[:i+1]
	}
	var header []string
	for _, l := range strings.Split(string(script), "\n") {
		if !strings.HasPrefix(l, "//") {
			break
		}
		header = append(header, strings.TrimPrefix(l, "//"))
	}
	var cases []fakeCase
	var cmds []string
	for _, doc := range []struct{ name, text string }{{"loadtest/README.md", sec}, {"trace-replay.js", strings.Join(header, "\n")}} {
		cmd := ""
		for _, l := range strings.Split(strings.ReplaceAll(doc.text, "\\\n", " "), "\n") {
			if strings.Contains(l, "k6 run") && strings.Contains(l, "trace-replay.js") {
				cmd = strings.Join(strings.Fields(l), " ")
			}
		}
		if cmd == "" {
			t.Errorf("%s: no k6 run command of trace-replay.js", doc.name)
			continue
		}
		env := make(map[string]string)
		fields := strings.Fields(cmd)
		for i, w := range fields {
			if w == "-e" && i+1 < len(fields) {
				k, v, _ := strings.Cut(fields[i+1], "=")
				env[k] = strings.ReplaceAll(v, "$PWD", root) // run from the repository root
			}
			if strings.HasSuffix(w, ".js") {
				if _, err := os.Stat(filepath.Join(root, w)); err != nil {
					t.Errorf("%s: script %s: %v", doc.name, w, err)
				}
			}
		}
		if env["TRACE"] == "" {
			t.Errorf("%s: %q sets no TRACE", doc.name, cmd)
		}
		cases = append(cases, fakeCase{Script: "trace-replay.js", Env: env, InitOnly: true})
		cmds = append(cmds, doc.name+": "+cmd)
	}
	for i, r := range f.run(t, cases...) {
		if r.InitError != "" {
			t.Errorf("%s, from the repository root: %s", cmds[i], r.InitError)
		}
	}
}

// lib.js's parseTrace reads traces as loadtest/workload's Go reader does: the same requests in
// the same order, arrivals, lengths, closed-loop predecessors and think times, and named sessions.
func TestParseTraceMatchesGoReader(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	synthetic, err := os.ReadFile("../../testdata/traces/mooncake_synthetic_trace.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	mixed := `{"timestamp": 1700000009000, "input_length": 1100, "output_length": 4, "hash_ids": [1, 2]}
{"timestamp": 1700000001000, "session_id": "s1", "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}

{"timestamp": 1700000001000, "input_length": 300}
{"session_id": "s1", "delay": 2500, "input_length": 1300, "hash_ids": [1, 2, 3]}
{"timestamp": 1700000000500, "session_id": 7, "input_length": 40, "output_length": 0, "hash_ids": []}
{"session_id": "s1", "delay": 100, "input_length": 1900, "output_length": 6, "hash_ids": [1, 2, 3, 4]}
{"session_id": 7, "delay": 0, "input_length": 80, "output_length": 2}
{"timestamp": 1700000004000, "session_id": "s1", "input_length": 2000, "output_length": 2, "hash_ids": [1, 2, 3]}
{"session_id": "s1", "delay": 10, "input_length": 2100, "output_length": 2, "hash_ids": [1, 2, 3, 4]}
`
	bailian := `{"chat_id": 1, "parent_chat_id": -1, "timestamp": 10.0, "input_length": 20, "output_length": 3, "hash_ids": [-1]}
{"chat_id": 2, "parent_chat_id": 1, "timestamp": 11.5, "input_length": 21, "output_length": 3, "hash_ids": [18446744073709551615, 5]}
{"chat_id": 3, "parent_chat_id": -1, "timestamp": 10.25, "input_length": 22, "output_length": 3}
{"chat_id": 4, "parent_chat_id": 2, "timestamp": 13.0, "input_length": 40, "output_length": 3, "hash_ids": [1, 2, 3]}
`
	type cfg struct {
		BlockSize int     `json:"blockSize"`
		Output    int     `json:"output"`
		RateScale float64 `json:"rateScale"`
		Limit     int     `json:"limit"`
		Format    string  `json:"format"`
	}
	cases := []struct {
		name, text string
		cfg        cfg
	}{
		{"synthetic", string(synthetic), cfg{BlockSize: 512, Output: 64, RateScale: 1, Format: "mooncake"}},
		{"synthetic, limit 300, rate ×4", string(synthetic), cfg{BlockSize: 512, Output: 64, RateScale: 4, Limit: 300, Format: "mooncake"}},
		{"mixed forms", mixed, cfg{BlockSize: 512, Output: 9, RateScale: 1, Format: "mooncake"}},
		{"mixed forms, limit 6, rate ×2.5", mixed, cfg{BlockSize: 512, Output: 9, RateScale: 2.5, Limit: 6, Format: "mooncake"}},
		{"bailian", bailian, cfg{BlockSize: 16, Output: 64, RateScale: 1, Format: "bailian"}},
	}
	var calls []fakeCase
	for _, c := range cases {
		calls = append(calls, fakeCase{Script: "lib.js", Call: &fakeCall{Fn: "parseTrace", Args: []any{c.text, c.cfg}}})
	}
	runs := f.run(t, calls...)
	for i, c := range cases {
		want, err := workload.Mooncake{BlockTokens: c.cfg.BlockSize, Output: c.cfg.Output, RateScale: c.cfg.RateScale,
			Limit: c.cfg.Limit, Bailian: c.cfg.Format == "bailian"}.Read(strings.NewReader(c.text))
		if err != nil {
			t.Fatalf("%s: Go reader: %v", c.name, err)
		}
		if runs[i].InitError != "" || runs[i].RunError != "" {
			t.Errorf("%s: parseTrace: init %s; run %s", c.name, runs[i].InitError, runs[i].RunError)
			continue
		}
		var got []struct {
			Arrival, Think       float64
			Input, Output, After int
			Session              string
		}
		if err := json.Unmarshal(runs[i].Value, &got); err != nil || len(got) != len(want) {
			t.Errorf("%s: parseTrace returned %d requests (%v), the Go reader %d", c.name, len(got), err, len(want))
			continue
		}
		for k, w := range want {
			g := got[k]
			if math.Abs(g.Arrival-w.Arrival.Seconds()) > 1e-6 || g.Input != w.PromptTokens || g.Output != w.OutputTokens ||
				g.After != w.After-1 || math.Abs(g.Think-w.Think.Seconds()) > 1e-6 || (g.Session != "" && g.Session != w.Session) {
				t.Errorf("%s: request %d: parseTrace %+v, Go reader {Arrival:%v Think:%v Input:%d Output:%d After:%d Session:%s}",
					c.name, k, g, w.Arrival.Seconds(), w.Think.Seconds(), w.PromptTokens, w.OutputTokens, w.After-1, w.Session)
			}
		}
	}
}
