package chattmpl

import (
	"strings"
	"testing"
)

// TestSumMatchesPairwise holds evalSum to evalBin's pairwise fold.
func TestSumMatchesPairwise(t *testing.T) {
	vars := map[string]any{"s": "str", "n": int64(2), "f": 1.5, "l": []any{int64(1)}, "d": NewDict(), "none": nil}
	for _, src := range []string{
		`{{ 'a' + 'b' + 'c' }}`, `{{ 'a' + s + 'c' + s }}`, `{{ 1 + 2 + 3 }}`, `{{ n + f + 1 }}`, `{{ l + l + [2] }}`,
		`{{ 'a' + 'b' + 1 }}`, `{{ 1 + 'a' + 'b' }}`, `{{ 'a' + 1 + 'b' }}`, `{{ s + undefined_name + 'x' }}`,
		`{{ 'a' + none + 'b' }}`, `{{ d + 'a' + 'b' }}`, `{{ ('a' + 'b') + ('c' + 'd') + 'e' }}`, `{{ 'a' + 'b' | upper + 'c' }}`,
		`{{ 'x' ~ 'y' + 'z' + 'w' }}`, `{{ 'a' + 'b' - 'c' }}`, `{% set c = '<h>' + s + '</h>\n\n' + s | trim + '<e>' %}{{ c }}`,
		`{{ 1 + 2 + 'a' + 'b' }}`, `{{ 'a' + 'b' + l }}`,
	} {
		want, werr := renderPairwise(t, src, vars)
		got, err := render(t, src, vars)
		if got != want || (err == nil) != (werr == nil) || (err != nil && err.Error() != werr.Error()) {
			t.Errorf("%s: got %q, %v; pairwise %q, %v", src, got, err, want, werr)
		}
	}
}

func renderPairwise(t *testing.T, src string, vars map[string]any) (string, error) {
	joinSums = false
	defer func() { joinSums = true }()
	return render(t, src, vars)
}

// BenchmarkSum renders a Llama 3 style message (header + ~4 KB content |
// trim + footer) with the chain joined once and pairwise.
func BenchmarkSum(b *testing.B) {
	tm, err := Parse("{% for m in messages %}{% set c = '<|start_header_id|>' + m['role'] + '<|end_header_id|>\n\n' + m['content'] | trim + '<|eot_id|>' %}{{ c }}{% endfor %}")
	if err != nil {
		b.Fatal(err)
	}
	m := NewDict()
	m.Set("role", "system")
	m.Set("content", strings.Repeat("lorem ipsum ", 350))
	vars := map[string]any{"messages": []any{m}}
	for _, on := range []bool{true, false} {
		name := "joined"
		if !on {
			name = "pairwise"
		}
		b.Run(name, func(b *testing.B) {
			joinSums = on
			defer func() { joinSums = true }()
			b.ReportAllocs()
			for b.Loop() {
				if _, err := tm.Render(vars); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
