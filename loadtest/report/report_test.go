package report

import (
	"encoding/json"
	"math"
	"reflect"
	"slices"
	"strings"
	"testing"
)

func TestQuantile(t *testing.T) {
	v := []float64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	for q, want := range map[float64]float64{0: 1, 0.5: 5, 0.9: 9, 0.99: 10, 1: 10} {
		if got := Quantile(v, q); got != want {
			t.Errorf("Quantile(%v) = %v, want %v", q, got, want)
		}
	}
	if Quantile(nil, 0.5) != 0 {
		t.Error("empty input")
	}
}

func TestImbalance(t *testing.T) {
	for _, tc := range []struct {
		per  []int
		want float64
	}{{[]int{5, 5}, 1}, {[]int{8, 0}, 2}, {[]int{0, 0}, 0}, {[]int{3, 1, 2}, 1.5},
		// Fewer requests than engines: undefined (0), not 3 / (3/4) = 4.
		{[]int{3, 0, 0, 0}, 0}, {[]int{1, 1, 0}, 0}, {[]int{2, 1, 0}, 2}} {
		if got := Imbalance(slices.Values(tc.per)); got != tc.want {
			t.Errorf("Imbalance(%v) = %v, want %v", tc.per, got, tc.want)
		}
	}
}

func TestWriteTable(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{"a": {ThroughputRPS: 1.5, Completed: 3}, "b": {Completed: 4}},
		Order: []string{"b", "a", "missing"}, OracleHitRate: 0.25}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	out := sb.String()
	if strings.Index(out, "\n  b") > strings.Index(out, "\n  a") || strings.Contains(out, "missing") ||
		!strings.Contains(out, "oracle (infinite shared cache) hit rate: 0.250") {
		t.Fatalf("table:\n%s", out)
	}
}

// TestOfferedLine: the text table and the HTML page name each policy's
// offered hit rate and the part it took, in the report's order, and say
// nothing of it when no policy measured one (live runs).
func TestOfferedLine(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{"a": {PrefixHitRate: 0.3, OfferedHitRate: 0.4, Completed: 1}, "b": {PrefixHitRate: 0.2, OfferedHitRate: 0.25, Completed: 1},
		"c": {PrefixHitRate: 0.1, Completed: 1}},
		Order: []string{"b", "a", "c"}}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	const want = "and the part taken: b 0.250 (80%) a 0.400 (75%)\n"
	if !strings.Contains(sb.String(), want) {
		t.Errorf("table lacks %q:\n%s", want, sb.String())
	}
	var hb strings.Builder
	if err := WriteHTML(&hb, r, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hb.String(), "and the part taken: b 0.250 (80%) a 0.400 (75%)</p>") {
		t.Errorf("HTML lacks the offered line")
	}
	r.Policies = map[string]PolicyResult{"a": {PrefixHitRate: 0.3}}
	sb.Reset()
	hb.Reset()
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	if err := WriteHTML(&hb, r, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(sb.String()+hb.String(), "offered") {
		t.Errorf("an offered line without offered hit rates:\n%s", sb.String())
	}
}

// TestUndefinedNumbers: a policy that completed nothing has no throughput,
// TTFT, E2E, TPOT, queue, hit rate (before: the DES's 0 over the prompts
// it refused) or imbalance, one whose server reported no usage no hit
// rate, one with fewer completions than
// engines no imbalance, one whose answers were all of one token no TPOT,
// and a run that measured no offered hit rate (live) none: the JSON says
// null (the other fields and their order unchanged), the table and the
// HTML n/a, and the table says why the imbalance is missing.
func TestUndefinedNumbers(t *testing.T) {
	r := Report{Policies: map[string]PolicyResult{
		"none": {PrefixHitRate: 0.125, Failed: 3, Wall: 1, Offered: true, Preemptions: 1},
		"few": {ThroughputRPS: 2, TTFTMean: 0.5, TTFTP50: 0.5, TTFTP90: 0.5, TTFTP99: 0.5, E2EMean: 1, E2EP99: 1.5, Completed: 2,
			QueueMean: 0.25, OfferedHitRate: 0.5, Offered: true, HitUnknown: true},
		"ok": {ThroughputRPS: 2, TTFTMean: 0.5, TTFTP50: 0.5, TTFTP90: 0.5, TTFTP99: 0.5, E2EMean: 1, E2EP99: 2, TPOTMean: 0.125,
			TPOTP99: 0.25, TPOTCount: 9, LoadImbalance: 1.25, Completed: 9, EngineTTFTMean: 0.25, QueueMean: 0.125, Preemptions: 3},
	}, Order: []string{"none", "few", "ok"}}
	got := map[string]string{}
	for name, p := range r.Policies {
		b, err := json.Marshal(p)
		if err != nil {
			t.Fatal(err)
		}
		got[name] = string(b)
	}
	want := map[string]string{
		"none": `{"throughput_rps":null,"ttft_mean_s":null,"ttft_p50_s":null,"ttft_p90_s":null,"ttft_p99_s":null,"e2e_mean_s":null,"e2e_p99_s":null,"tpot_mean_s":null,"tpot_p99_s":null,"prefix_hit_rate":null,"offered_hit_rate":null,"load_imbalance":null,"queue_mean_s":null,"completed":0,"failed":3,"preemptions":1}`,
		"few":  `{"throughput_rps":2,"ttft_mean_s":0.5,"ttft_p50_s":0.5,"ttft_p90_s":0.5,"ttft_p99_s":0.5,"e2e_mean_s":1,"e2e_p99_s":1.5,"tpot_mean_s":null,"tpot_p99_s":null,"prefix_hit_rate":null,"offered_hit_rate":0.5,"load_imbalance":null,"queue_mean_s":0.25,"completed":2,"failed":0,"preemptions":0}`,
		"ok":   `{"throughput_rps":2,"ttft_mean_s":0.5,"ttft_p50_s":0.5,"ttft_p90_s":0.5,"ttft_p99_s":0.5,"e2e_mean_s":1,"e2e_p99_s":2,"tpot_mean_s":0.125,"tpot_p99_s":0.25,"prefix_hit_rate":0,"offered_hit_rate":null,"load_imbalance":1.25,"engine_ttft_mean_s":0.25,"queue_mean_s":0.125,"completed":9,"failed":0,"preemptions":3}`,
	}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("%s JSON:\n got %s\nwant %s", name, got[name], w)
		}
	}
	// The JSON reads back into a PolicyResult (null: zero).
	var back PolicyResult
	if err := json.Unmarshal([]byte(got["ok"]), &back); err != nil || back.LoadImbalance != 1.25 || back.EngineTTFTMean != 0.25 {
		t.Errorf("read back: %+v, %v", back, err)
	}
	var sb strings.Builder
	if err := r.WriteTable(&sb); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"  none             n/a          n/a    n/a    n/a    n/a      n/a         n/a       n/a        n/a     0       3 ",
		"   few            2.00        0.500  0.500  0.500  0.500    0.250       1.000       n/a        n/a     2       0 ",
		"    ok            2.00        0.500  0.500  0.500  0.500    0.125       1.000     0.000       1.25     9       0 ",
		"imbalance n/a (few): fewer requests completed than there are engines\n",
	} {
		if !strings.Contains(sb.String(), w) {
			t.Errorf("table lacks %q:\n%s", w, sb.String())
		}
	}
	var hb strings.Builder
	if err := WriteHTML(&hb, r, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	for _, w := range []string{
		"<tr><td>none</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>n/a</td><td>0</td><td>3</td></tr>",
		"<td>1.000</td><td>n/a</td><td>n/a</td><td>2</td><td>0</td></tr>",
		"imbalance n/a (few): fewer requests completed than there are engines</p>",
	} {
		if !strings.Contains(hb.String(), w) {
			t.Errorf("HTML lacks %q", w)
		}
	}
}

// TestPolicyJSONFields: MarshalJSON writes PolicyResult's JSON fields,
// same names, same order (a field added to one must be added to both).
func TestPolicyJSONFields(t *testing.T) {
	tags := func(v any) []string {
		var out []string
		for f := range reflect.TypeOf(v).Fields() {
			if tag := f.Tag.Get("json"); tag != "-" {
				out = append(out, tag)
			}
		}
		return out
	}
	if a, b := tags(PolicyResult{}), tags(policyJSON{}); !slices.Equal(a, b) {
		t.Errorf("PolicyResult's JSON fields %v, MarshalJSON's %v", a, b)
	}
}

// TestRecordStats: the JSON's TPOT is over the requests of two output
// tokens or more per sequence (a one-token answer has none; as 0 it pulled
// the HTML's mean down), its E2E p99 over every finished request.
func TestRecordStats(t *testing.T) {
	recs := []Record{
		{TTFT: 0.1, E2E: 1.1, OutputTokens: 11},              // 0.1 s per token
		{TTFT: 0.2, E2E: 0.2, OutputTokens: 1},               // none
		{TTFT: 0.2, E2E: 0.5, OutputTokens: 2, Sequences: 2}, // one token per sequence: none
		{TTFT: 0, E2E: 0.9, OutputTokens: 4},                 // 0.3
	}
	var p PolicyResult
	p.SetRecordStats(recs)
	if p.TPOTCount != 2 || math.Abs(p.TPOTMean-0.2) > 1e-12 || math.Abs(p.TPOTP99-0.3) > 1e-12 || p.E2EP99 != 1.1 {
		t.Fatalf("TPOT n %d mean %v p99 %v, E2E p99 %v; want 2, 0.2, 0.3, 1.1", p.TPOTCount, p.TPOTMean, p.TPOTP99, p.E2EP99)
	}
	p = PolicyResult{Completed: 1}
	p.SetRecordStats(recs[1:3])
	b, err := json.Marshal(p)
	if err != nil || !strings.Contains(string(b), `"tpot_mean_s":null,"tpot_p99_s":null`) {
		t.Fatalf("one-token answers only: %s, %v", b, err)
	}
	var hb strings.Builder
	if err := WriteHTML(&hb, Report{Policies: map[string]PolicyResult{"a": p}, Order: []string{"a"},
		Runs: map[string]Run{"a": {Records: recs[1:3], EngineIDs: []string{"e"}}}}, HTMLMeta{}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(hb.String(), "<td>0.000</td><td>n/a</td><td>n/a</td><td>0.000</td>") {
		t.Errorf("HTML TPOT of one-token answers is not n/a:\n%s", hb.String())
	}
}

// TestLearnedLine: the "learned" line says n/a when no output-length
// prediction was scored and that the rates are the prior's when nothing
// was sampled; before, both read as learned, "predicted within 0%".
func TestLearnedLine(t *testing.T) {
	rates := LearnedCosts{PrefillRate: 30000, StepBase: 0.007, DecodeSecPerToken: 1.9e-7}
	for _, c := range []struct {
		name    string
		samples int
		preds   int
		predErr float64
		want    []string
		not     string
	}{
		{"nothing", 0, 0, 0, []string{"kvmesh learned nothing (no samples): its rates are the prior's, prefillRate 30000 tok/s",
			"output length predicted: n/a (no prediction scored)"}, "within"},
		{"no prediction", 12, 0, 0, []string{"kvmesh learned: prefillRate 30000 tok/s, stepBase 0.0070s, decodeSecPerToken 1.9e-07; output length predicted: n/a"}, "within"},
		{"both", 12, 5, 0.44, []string{"kvmesh learned: prefillRate 30000 tok/s, stepBase 0.0070s, decodeSecPerToken 1.9e-07; output length predicted within 44% (mean abs error)\n"}, "n/a"},
	} {
		l := rates
		l.Samples = c.samples
		r := Report{Policies: map[string]PolicyResult{"kvmesh": {Completed: 1, Learned: l, OutputPredictions: c.preds, OutputPredError: c.predErr}}, Order: []string{"kvmesh"}}
		var b strings.Builder
		if err := r.WriteTable(&b); err != nil {
			t.Fatal(err)
		}
		line := ""
		for _, l := range strings.Split(b.String(), "\n") {
			if strings.HasPrefix(l, "kvmesh learned") {
				line = l + "\n"
			}
		}
		for _, w := range c.want {
			if !strings.Contains(line, w) {
				t.Errorf("%s: learned line %q, want %q", c.name, line, w)
			}
		}
		if strings.Contains(line, c.not) {
			t.Errorf("%s: learned line %q has %q", c.name, line, c.not)
		}
	}
}
