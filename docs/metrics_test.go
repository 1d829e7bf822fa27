package docs

import (
	"go/scanner"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var (
	metricName = regexp.MustCompile(`^kvmesh_[a-z0-9_]*[a-z0-9]$`)
	// metricPrefix is a literal a metric name is built on
	// ("kvmesh_sidecar_" + name).
	metricPrefix = regexp.MustCompile(`^kvmesh_[a-z0-9_]*_$`)
	// metricPart is the varying part a built name takes, from a (name,
	// help) pair of literals in the same file.
	metricPart = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	// docMetric is a metric name as OPERATIONS.md's reference writes it.
	docMetric = regexp.MustCompile("`(kvmesh_[a-z0-9_]+)`")
)

type goToken struct {
	tok token.Token
	lit string // a STRING's value, unquoted
}

// goTokens is a Go file's tokens, comments left out.
func goTokens(t *testing.T, path string) []goToken {
	t.Helper()
	src, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	fset := token.NewFileSet()
	file := fset.AddFile(path, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, func(pos token.Position, msg string) { t.Errorf("%s: %s", pos, msg) }, 0)
	var toks []goToken
	for {
		_, tok, lit := s.Scan()
		if tok == token.EOF {
			return toks
		}
		if tok == token.STRING {
			lit, _ = strconv.Unquote(lit)
		}
		toks = append(toks, goToken{tok, lit})
	}
}

// fileMetrics returns the kvmesh_* metric names the file's code defines:
//   - a name literal followed by a help literal (one with a space), as the
//     first two arguments of a call or elements of a composite literal:
//     prometheus.NewDesc("kvmesh_x", "Help.", ...), a helper
//     counter("kvmesh_x", "Help.", ...);
//   - an Opts field Name: "kvmesh_x";
//   - a prefix concatenated with a variable, maybe then a suffix literal
//     ("kvmesh_kvevents_" + name + "_total"): the prefix is combined with the
//     name of every (name, help) pair in the file.
//
// Other kvmesh_* literals (an ext_proc response's details, a log message)
// are not metric definitions. A file with two prefixes is refused: which
// pairs belong to which is not known.
func fileMetrics(t *testing.T, path string) map[string]bool {
	toks := goTokens(t, path)
	str := func(i int) (string, bool) {
		if i < 0 || i >= len(toks) || toks[i].tok != token.STRING {
			return "", false
		}
		return toks[i].lit, true
	}
	names := map[string]bool{}
	var parts []string
	var prefix, suffix string
	for i := range toks {
		lit, ok := str(i)
		if !ok {
			continue
		}
		// (name, help) pair opening a call or a composite literal.
		if help, ok := str(i + 2); ok && i > 0 && toks[i+1].tok == token.COMMA && strings.Contains(help, " ") &&
			(toks[i-1].tok == token.LPAREN || toks[i-1].tok == token.LBRACE) {
			switch {
			case metricName.MatchString(lit):
				names[lit] = true
			case metricPart.MatchString(lit):
				parts = append(parts, lit)
			}
		}
		// Name: "kvmesh_x"
		if i >= 2 && toks[i-1].tok == token.COLON && toks[i-2].tok == token.IDENT && toks[i-2].lit == "Name" &&
			metricName.MatchString(lit) && (i+1 >= len(toks) || toks[i+1].tok != token.ADD) {
			names[lit] = true
		}
		// "kvmesh_x_" + name [+ "_suffix"]
		if metricPrefix.MatchString(lit) && i+2 < len(toks) && toks[i+1].tok == token.ADD && toks[i+2].tok == token.IDENT {
			if prefix != "" && prefix != lit {
				t.Errorf("%s builds metric names on two prefixes, %s and %s: teach fileMetrics which names go with which", path, prefix, lit)
			}
			prefix = lit
			j := i + 3
			for j+1 < len(toks) && toks[j].tok == token.PERIOD && toks[j+1].tok == token.IDENT {
				j += 2 // c.name
			}
			if s, ok := str(j + 1); ok && toks[j].tok == token.ADD {
				suffix = s
			}
		}
	}
	if prefix != "" {
		if len(parts) == 0 {
			t.Errorf("%s builds metric names on %s but no (name, help) pair was found: teach fileMetrics how it names them", path, prefix)
		}
		for _, p := range parts {
			names[prefix+p+suffix] = true
		}
	}
	return names
}

// codeMetrics walks the repository's Go code, tests and testdata left out
// (a test may register a metric of its own).
func codeMetrics(t *testing.T, root string) map[string]string {
	t.Helper()
	where := map[string]string{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if p != root && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		for n := range fileMetrics(t, p) {
			rel, _ := filepath.Rel(root, p)
			where[n] = rel
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return where
}

// TestMetricsReference: every kvmesh_* metric the code defines has a row in
// OPERATIONS.md's "Metrics reference", and every row names a metric the code
// defines, so the reference cannot fall behind the code.
func TestMetricsReference(t *testing.T) {
	code := codeMetrics(t, "..")
	// The scan must see each way a metric is defined; were it to go blind,
	// the test would pass on nothing.
	for _, n := range []string{
		"kvmesh_ingress_routing_decisions_total",           // Opts Name:
		"kvmesh_ingress_learned_prefill_tokens_per_second", // NewDesc
		"kvmesh_scheduler_decisions_total",                 // a helper's (name, help)
		"kvmesh_sidecar_deltas_published_total",            // "kvmesh_sidecar_" + c.name, {name, help}
		"kvmesh_kvevents_delivered_total",                  // "kvmesh_kvevents_" + name + "_total"
		"kvmesh_materializer_keys_applied_total",           // Name: "kvmesh_materializer_" + name
		"kvmesh_sim_queued_prefill_tokens",
	} {
		if code[n] == "" {
			t.Errorf("the source scan did not find %s: fix fileMetrics", n)
		}
	}
	if len(code) < 150 {
		t.Errorf("the source scan found only %d metrics", len(code))
	}
	b, err := os.ReadFile("OPERATIONS.md")
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	start := strings.Index(doc, "\n## Metrics reference\n")
	if start < 0 {
		t.Fatal(`OPERATIONS.md has no "## Metrics reference" section`)
	}
	ref := doc[start+1:]
	if end := strings.Index(ref[3:], "\n## "); end >= 0 {
		ref = ref[:end+3]
	}
	rows := map[string]bool{}
	for _, line := range strings.Split(ref, "\n") {
		if !strings.HasPrefix(line, "| `") {
			continue
		}
		cell, _, _ := strings.Cut(line[1:], "|")
		if m := docMetric.FindStringSubmatch(cell); m != nil {
			rows[m[1]] = true
		}
	}
	var missing []string
	for n, file := range code {
		if !rows[n] {
			missing = append(missing, n+" ("+file+")")
		}
	}
	sort.Strings(missing)
	for _, m := range missing {
		t.Errorf("metric %s has no row in OPERATIONS.md's metrics reference", m)
	}
	for n := range rows {
		if code[n] == "" {
			t.Errorf("OPERATIONS.md's metrics reference lists %s, which no code defines", n)
		}
	}
}
