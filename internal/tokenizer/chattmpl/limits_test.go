package chattmpl

import (
	"errors"
	"runtime"
	"strings"
	"testing"
	"time"
)

// TestRenderLimits: hostile templates end with ErrRender, within the step
// budget (every loop iteration counts, empty bodies too) and without
// building more than the byte budget (each built value, and all of them
// together). Each case allocates far less than it would unbounded.
func TestRenderLimits(t *testing.T) {
	const doubled = `{% set ns = namespace(s='x') %}{% for i in range(23) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}` // 8 MiB
	for _, c := range []struct{ name, src string }{
		{"nested empty loops", `{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}`},
		{"string doubling with ~", `{% set ns = namespace(s='x') %}{% for i in range(29) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s | length }}`},
		{"string doubling with +", `{% set ns = namespace(s='x') %}{% for i in range(29) %}{% set ns.s = ns.s + ns.s %}{% endfor %}{{ ns.s | length }}`},
		{"list doubling", `{% set ns = namespace(l=[1]) %}{% for i in range(24) %}{% set ns.l = ns.l + ns.l %}{% endfor %}{{ ns.l | length }}`},
		{"replace growth", `{% set ns = namespace(s='ab') %}{% for i in range(28) %}{% set ns.s = ns.s | replace('a', 'aa') %}{% endfor %}{{ ns.s | length }}`},
		{"join growth", `{% set ns = namespace(s='ab') %}{% for i in range(28) %}{% set ns.s = [ns.s, ns.s] | join %}{% endfor %}{{ ns.s | length }}`},
		{"string repeat", `{{ ('x' * 600000000) | length }}`},
		{"format width", `{{ '%600000000d' % 1 }}`},
		{"many large values", doubled + `{% set l = namespace(v=[]) %}{% for i in range(100) %}{% set l.v = l.v + [ns.s ~ i] %}{% endfor %}{{ l.v | length }}`},
		{"characters of a large string", doubled + `{% for c in ns.s %}{% endfor %}`},
		{"shared list printed", `{% set ns = namespace(l=[1]) %}{% for i in range(26) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l }}`},
		{"shared list as JSON", `{% set ns = namespace(l=[1]) %}{% for i in range(26) %}{% set ns.l = [ns.l, ns.l] %}{% endfor %}{{ ns.l | tojson }}`},
		{"shared lists compared", `{% set ns = namespace(l=[1], m=[1]) %}{% for i in range(26) %}{% set ns.l = [ns.l, ns.l] %}{% set ns.m = [ns.m, ns.m] %}{% endfor %}{{ ns.l == ns.m }}`},
		{"scanning a large string", doubled + `{% for i in range(1000) %}{% if 'zz' in ns.s %}{% endif %}{% endfor %}`},
		{"range beyond the sandbox's", `{% for i in range(100000000) %}{% endfor %}`},
		{"range spanning int64", `{{ range(-9223372036854775807, 9223372036854775807) | length }}`},
		{"slice into many parts", `{{ [1] | slice(1000000000) | list | length }}`},
		{"format precision", `{{ '{:.99999999999f}'.format(1.5) }}`},
		{"macro recursion", `{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}`},
		{"recursive loop", `{% for x in [1] recursive %}{{ loop([1]) }}{% endfor %}`},
	} {
		t.Run(c.name, func(t *testing.T) {
			tm, err := Parse(c.src)
			if err != nil {
				t.Fatal(err)
			}
			var before, after runtime.MemStats
			runtime.ReadMemStats(&before)
			out, err := tm.Render(nil)
			runtime.ReadMemStats(&after)
			if !errors.Is(err, ErrRender) {
				t.Errorf("rendered %d bytes, err %v; want ErrRender", len(out), err)
			}
			if alloc := after.TotalAlloc - before.TotalAlloc; alloc > 3*maxBuilt {
				t.Errorf("allocated %d MiB", alloc>>20)
			}
		})
	}
}

// TestParseNesting: nesting beyond maxNest is a syntax error, not a deep
// recursion.
func TestParseNesting(t *testing.T) {
	for _, src := range []string{
		"{{ " + strings.Repeat("(", 5000) + "1" + strings.Repeat(")", 5000) + " }}",
		"{{ " + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + " }}",
		"{{ " + strings.Repeat("not ", 5000) + "x }}",
		"{{ " + strings.Repeat("-", 5000) + "1 }}",
		strings.Repeat("{% if true %}", 5000) + strings.Repeat("{% endif %}", 5000),
	} {
		if _, err := Parse(src); !errors.Is(err, ErrSyntax) {
			t.Errorf("%.40s…: %v; want ErrSyntax", src, err)
		}
	}
	if _, err := Parse("{{ " + strings.Repeat("(", 100) + "1" + strings.Repeat(")", 100) + " }}"); err != nil {
		t.Errorf("100 parentheses: %v", err)
	}
}

// stopAfter is a Stopper that stops once polled n times.
type stopAfter struct{ n, polls int }

var errStopped = errors.New("caller gave up")

func (s *stopAfter) Stopped() error {
	if s.polls++; s.polls > s.n {
		return errStopped
	}
	return nil
}

// TestRenderBounded: a rendering past its deadline ends with ErrDeadline
// (not ErrRender: the template is not at fault), one whose Stopper says
// stop with ErrStopped and the Stopper's error, both long before the step limit; the
// same rendering without a bound, or within one, renders.
func TestRenderBounded(t *testing.T) {
	tm, err := Parse(`{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}done`)
	if err != nil {
		t.Fatal(err)
	}
	past := time.Now().Add(-time.Second)
	if out, err := tm.RenderBounded(nil, Bound{Deadline: past}); !errors.Is(err, ErrDeadline) || errors.Is(err, ErrRender) {
		t.Errorf("past deadline: rendered %q, err %v; want ErrDeadline only", out, err)
	}
	s := &stopAfter{n: 3}
	if out, err := tm.RenderBounded(nil, Bound{Stop: s}); !errors.Is(err, ErrStopped) || !errors.Is(err, errStopped) || errors.Is(err, ErrRender) {
		t.Errorf("stopper: rendered %q, err %v; want ErrStopped with its error", out, err)
	} else if s.polls != 4 {
		t.Errorf("stopper polled %d times; want 4 (it stops the rendering at its first error)", s.polls)
	}
	// Large values read count too: one step reading megabytes polls.
	big, err := Parse(`{% if 'zz' in s %}{% endif %}`)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := big.RenderBounded(map[string]any{"s": strings.Repeat("x", 1<<20)}, Bound{Deadline: past}); !errors.Is(err, ErrDeadline) {
		t.Errorf("a large operand read past the deadline: err %v; want ErrDeadline", err)
	}
	for _, b := range []Bound{{}, {Deadline: time.Now().Add(time.Hour)}, {Stop: &stopAfter{n: 1 << 30}}} {
		if out, err := tm.RenderBounded(nil, b); err != nil || out != "done" {
			t.Errorf("bound %+v: rendered %q, err %v; want done", b, out, err)
		}
	}
}
