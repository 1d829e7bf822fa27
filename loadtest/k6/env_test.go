package k6

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// chat-sessions.js runs under `k6 run` from a login shell, whose USER (a
// login name) k6 passes into __ENV: the per-turn tokens are USER_TOKENS,
// and USER is read only when it is a number (before: USER=alice made every
// iteration throw RangeError and no request was sent).
func TestChatSessionsLoginUSER(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	base := map[string]string{"SESSIONS": "2", "TURNS": "2", "SYSTEM": "16", "OUTPUT": "4", "THINK": "0"}
	cases := []struct {
		env       map[string]string
		userWords int
	}{
		{map[string]string{"USER": "alice"}, 128},
		{map[string]string{"USER": "root", "LOGNAME": "root", "HOME": "/root"}, 128},
		{map[string]string{"USER": "4"}, 4},
		{map[string]string{"USER": "alice", "USER_TOKENS": "6"}, 6},
		{map[string]string{"USER": "9", "USER_TOKENS": "6"}, 6},
		{map[string]string{}, 128},
	}
	var runs []fakeCase
	for _, c := range cases {
		env := map[string]string{}
		for k, v := range base {
			env[k] = v
		}
		for k, v := range c.env {
			env[k] = v
		}
		runs = append(runs, fakeCase{Script: "chat-sessions.js", Env: env, Latency: 0.01})
	}
	for i, r := range f.run(t, runs...) {
		c := cases[i]
		if r.InitError != "" || r.RunError != "" || len(r.Errors) > 0 || len(r.Requests) != 4 {
			t.Errorf("%v: init %q, run %q, errors %v, %d requests; want 4", c.env, r.InitError, r.RunError, r.Errors, len(r.Requests))
			continue
		}
		for _, q := range r.Requests {
			m := q.Body.Messages
			if len(m) == 0 || m[len(m)-1].Role != "user" || len(strings.Fields(m[len(m)-1].Content)) != c.userWords {
				t.Errorf("%v: the last message of a turn is not a user message of %d words: %+v", c.env, c.userWords, m)
				break
			}
		}
	}
}

// Every numeric variable of every script is checked at init: a value that
// is not a number of the right kind stops the script with an error naming
// the variable (before: parseInt gave NaN, which became an array length
// or an option k6 refused without saying which variable).
func TestScriptsRefuseBadNumbers(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	trace := writeTrace(t, `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`+"\n")
	vars := map[string][]string{
		"shared-prefix.js": {"GROUPS", "PROMPTS", "SHARED", "QUESTION", "OUTPUT", "RATE", "VUS"},
		"trace-replay.js":  {"TRACE_BLOCK_SIZE", "OUTPUT", "RATE_SCALE", "LIMIT", "VUS", "MAX_PROMPT"},
		"chat-sessions.js": {"SESSIONS", "TURNS", "SYSTEM", "USER_TOKENS", "OUTPUT", "THINK", "VUS"},
	}
	floats := map[string]bool{"RATE": true, "RATE_SCALE": true, "THINK": true}
	type want struct{ script, name, value string }
	var cases []fakeCase
	var wants []want
	for script, names := range vars {
		for _, name := range names {
			bad := []string{"abc", "-1", "NaN", "Infinity", "12abc", "0x10"}
			if !floats[name] {
				bad = append(bad, "1.5", "1e3")
			}
			if name == "RATE_SCALE" {
				bad = append(bad, "0")
			}
			for _, v := range bad {
				env := map[string]string{"TRACE": trace, name: v}
				cases = append(cases, fakeCase{Script: script, Env: env, InitOnly: true})
				wants = append(wants, want{script, name, v})
			}
		}
	}
	for i, r := range f.run(t, cases...) {
		w := wants[i]
		if !strings.Contains(r.InitError, w.name+"="+fmt.Sprintf("%q", w.value)+": want") {
			t.Errorf("%s %s=%s: init error %q, want one naming the variable", w.script, w.name, w.value, r.InitError)
		}
	}
	// Good values of each kind are read.
	ok := f.run(t,
		fakeCase{Script: "shared-prefix.js", Env: map[string]string{"GROUPS": " 2 ", "PROMPTS": "2", "SHARED": "0", "QUESTION": "4", "RATE": "2.5e1"}, InitOnly: true},
		fakeCase{Script: "trace-replay.js", Env: map[string]string{"TRACE": trace, "RATE_SCALE": ".5", "LIMIT": "0", "OUTPUT": ""}, InitOnly: true},
		fakeCase{Script: "chat-sessions.js", Env: map[string]string{"THINK": "0", "SYSTEM": "0"}, InitOnly: true},
	)
	for i, r := range ok {
		if r.InitError != "" {
			t.Errorf("good values, case %d: %s", i, r.InitError)
		}
	}
	if r := f.run(t, fakeCase{Script: "shared-prefix.js", Env: map[string]string{"SHARED": "0", "QUESTION": "0"}, InitOnly: true}); !strings.Contains(r[0].InitError, "a prompt needs at least one token") {
		t.Errorf("SHARED=0 QUESTION=0: %q", r[0].InitError)
	}
}

// shared-prefix.js keeps RATE exact (arrivalRate): a rate below 0.005
// req/s was rounded to 0 per 100 s and raised to 1 (0.01 req/s) without a
// word; now 0.004 req/s sends a request every 250 s, and a rate too small
// to write is refused by name.
func TestSharedPrefixRateExact(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	env := func(rate string) map[string]string {
		return map[string]string{"GROUPS": "2", "PROMPTS": "2", "SHARED": "8", "QUESTION": "4", "RATE": rate}
	}
	runs := f.run(t,
		fakeCase{Script: "shared-prefix.js", Env: env("0.004"), Latency: 0.01},
		fakeCase{Script: "shared-prefix.js", Env: env("0.0000001"), InitOnly: true},
	)
	r := runs[0]
	if r.InitError != "" || r.RunError != "" || len(r.Requests) != 4 {
		t.Fatalf("RATE=0.004: init %q, run %q, %d requests", r.InitError, r.RunError, len(r.Requests))
	}
	for i, q := range r.Requests {
		if math.Abs(q.T-250*float64(i)) > 1e-6 {
			t.Errorf("RATE=0.004: request %d sent at %g s, want %g", i, q.T, 250*float64(i))
		}
	}
	if e := runs[1].InitError; !strings.Contains(e, "RATE=1e-7: below 0.001 req/s") {
		t.Errorf("RATE=0.0000001: init error %q", e)
	}
	// arrivalRate: whole iterations per 10^k s, exact up to 6 decimals.
	for _, c := range []struct {
		rate     float64
		n, unitS float64
	}{{20, 20, 1}, {0.33, 33, 100}, {7.25, 725, 100}, {0.004, 4, 1000}, {1.0 / 3, 333333, 1e6}, {0.000004, 4, 1e6}, {1234.5678, 12345678, 1e4}} {
		v := f.run(t, fakeCase{Script: "lib.js", Call: &fakeCall{Fn: "arrivalRate", Args: []any{c.rate}}})[0]
		var got struct {
			Rate, TimeUnitS float64
		}
		if err := json.Unmarshal(v.Value, &got); err != nil || got.Rate != c.n || got.TimeUnitS != c.unitS {
			t.Errorf("arrivalRate(%v) = %s (%v %s), want %v per %v s", c.rate, v.Value, err, v.RunError, c.n, c.unitS)
		}
	}
}

// The scripts import nothing from the network (before: jslib's
// k6-summary from https://jslib.k6.io, so they could not start on a host
// without internet access) and print their own summary, with ANSI colours
// only when k6 says stdout is a terminal and --no-color is not set.
func TestScriptsOfflineSummary(t *testing.T) {
	t.Parallel()
	imp := regexp.MustCompile(`(?m)^\s*import\s[^'"]*['"]([^'"]+)['"]`)
	scripts, _ := filepath.Glob("*.js")
	for _, s := range scripts {
		b, err := os.ReadFile(s)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range imp.FindAllStringSubmatch(string(b), -1) {
			if p := m[1]; !strings.HasPrefix(p, "./") && p != "k6" && !strings.HasPrefix(p, "k6/") {
				t.Errorf("%s imports %q: want only k6's modules and the scripts' own files", s, p)
			}
		}
	}
	f := newFakeK6(t)
	trace := writeTrace(t, `{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 2]}`+"\n")
	envs := map[string]map[string]string{
		"shared-prefix.js": {"GROUPS": "2", "PROMPTS": "2", "SHARED": "8", "QUESTION": "4"},
		"trace-replay.js":  {"TRACE": trace},
		"chat-sessions.js": {"SESSIONS": "1", "TURNS": "1", "SYSTEM": "4", "THINK": "0"},
	}
	type mode struct{ tty, noColor, colors bool }
	modes := []mode{{false, false, false}, {true, false, true}, {true, true, false}}
	var cases []fakeCase
	var names []string
	for script, env := range envs {
		for _, m := range modes {
			cases = append(cases, fakeCase{Script: script, Env: env, Latency: 0.01, StdoutTTY: m.tty, NoColor: m.noColor})
			names = append(names, script)
		}
	}
	for i, r := range f.run(t, cases...) {
		m := modes[i%len(modes)]
		out := r.Summary["stdout"]
		if r.InitError != "" || r.RunError != "" {
			t.Errorf("%s: init %q, run %q", names[i], r.InitError, r.RunError)
			continue
		}
		for _, want := range []string{"thresholds\n", "kvmesh_failed: rate<0.01", "kvmesh_ttft ", "avg=10.00ms", "kvmesh_failed ", "0.00% (0 of ",
			"kvmesh prefix hit rate: "} {
			if !strings.Contains(out, want) {
				t.Errorf("%s: the summary does not say %q:\n%s", names[i], want, out)
			}
		}
		if strings.Contains(out, "\x1b[") != m.colors {
			t.Errorf("%s, stdout a terminal %v, --no-color %v: ANSI colours %v, want %v:\n%q", names[i], m.tty, m.noColor, !m.colors, m.colors, out)
		}
	}
}

// summaryText lists each check with its group, from root_group as k6
// gives it to handleSummary (arrays) or as older k6 did (objects keyed by
// name; for…of over one threw a TypeError).
func TestSummaryTextChecks(t *testing.T) {
	t.Parallel()
	f := newFakeK6(t)
	check := func(name string, passes, fails int) map[string]any {
		return map[string]any{"name": name, "passes": passes, "fails": fails}
	}
	arrays := map[string]any{"name": "", "checks": []any{check("status 200", 2, 0)},
		"groups": []any{map[string]any{"name": "g", "checks": []any{check("no error event", 1, 2)}, "groups": []any{}}}}
	objects := map[string]any{"name": "", "checks": map[string]any{"status 200": check("status 200", 2, 0)},
		"groups": map[string]any{"g": map[string]any{"name": "g", "checks": map[string]any{"no error event": check("no error event", 1, 2)}}}}
	var cases []fakeCase
	for _, g := range []any{arrays, objects} {
		data := map[string]any{"metrics": map[string]any{}, "root_group": g}
		cases = append(cases, fakeCase{Script: "lib.js", Call: &fakeCall{Fn: "summaryText", Args: []any{data}}})
	}
	for i, r := range f.run(t, cases...) {
		var out string
		if err := json.Unmarshal(r.Value, &out); err != nil || r.RunError != "" {
			t.Errorf("case %d: %v %s", i, err, r.RunError)
			continue
		}
		for _, want := range []string{"checks\n", "✓ status 200: 2 of 2 passed", "✗ g / no error event: 1 of 3 passed"} {
			if !strings.Contains(out, want) {
				t.Errorf("case %d: the summary does not say %q:\n%s", i, want, out)
			}
		}
	}
}
