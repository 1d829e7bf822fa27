package manifests

import (
	"regexp"
	"slices"
	"strings"
	"testing"
)

var (
	reQuoted  = regexp.MustCompile(`"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'`)
	reBraces  = regexp.MustCompile(`\{[^{}]*\}`)
	reRange   = regexp.MustCompile(`\[[^\[\]]*\]`)
	reGroupBy = regexp.MustCompile(`\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)`)
	reIdent   = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	reVar     = regexp.MustCompile(`\$\{?[a-zA-Z_][a-zA-Z0-9_]*\}?`)
	// PromQL keywords and modifiers that look like names.
	promKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true,
		"group_right": true, "bool": true, "and": true, "or": true, "unless": true, "offset": true, "inf": true,
		"nan": true, "atan2": true}
)

// metricNames returns the metric (sample) names a PromQL expression reads:
// identifiers that are not functions, aggregations, keywords, label names or
// Grafana variables.
func metricNames(expr string) []string {
	s := reVar.ReplaceAllString(expr, "1")
	s = reQuoted.ReplaceAllString(s, `""`)
	for {
		t := reBraces.ReplaceAllString(s, "")
		if t == s {
			break
		}
		s = t
	}
	s = reRange.ReplaceAllString(s, "")
	s = reGroupBy.ReplaceAllString(s, "")
	var out []string
	for _, loc := range reIdent.FindAllStringIndex(s, -1) {
		name := s[loc[0]:loc[1]]
		rest := strings.TrimLeft(s[loc[1]:], " \t\n")
		if strings.HasPrefix(rest, "(") || promKeywords[strings.ToLower(name)] {
			continue // a function, an aggregation or a keyword
		}
		if loc[0] > 0 && (s[loc[0]-1] >= '0' && s[loc[0]-1] <= '9' || s[loc[0]-1] == '.') {
			continue // a duration or number suffix such as 5m, 1e3
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	return out
}

func TestMetricNames(t *testing.T) {
	for expr, want := range map[string][]string{
		`sum by (engine) (rate(kvmesh_ingress_requests_total{code=~"5.."}[5m]))`:                                         {"kvmesh_ingress_requests_total"},
		`histogram_quantile(0.99, sum by (le) (rate(kvmesh_ingress_ttft_seconds_bucket{job="$job"}[$__rate_interval])))`: {"kvmesh_ingress_ttft_seconds_bucket"},
		`vllm:kv_cache_usage_perc * 100`:                               {"vllm:kv_cache_usage_perc"},
		`a_total / ignoring(x) group_left b_total > bool 0`:            {"a_total", "b_total"},
		`max without (instance) (kvmesh_ingress_index_keys) offset 1m`: {"kvmesh_ingress_index_keys"},
	} {
		if got := metricNames(expr); !slices.Equal(got, want) {
			t.Errorf("metricNames(%q) = %v, want %v", expr, got, want)
		}
	}
}

func FuzzMetricNames(f *testing.F) {
	f.Add(`sum(rate(x_total{a="b"}[5m]))`)
	f.Add(`{{{[[[`)
	f.Fuzz(func(t *testing.T, expr string) {
		for _, n := range metricNames(expr) {
			if !reIdent.MatchString(n) {
				t.Fatalf("%q is not an identifier", n)
			}
		}
	})
}
