package loadgen

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestReportTextSaysWhatItKnows: the text report names each error kind's
// first message, says when the server reported no usage (not "prompt 0,
// hit rate 0%" as if measured), says its load imbalance covers only the
// engines that answered unless CountEngines gave them all (and, over one,
// is n/a: JSON null, where it read 1.00, a perfect balance), and blames a
// send lag on concurrency slots only when an arrival waited for one.
func TestReportTextSaysWhatItKnows(t *testing.T) {
	results := []Result{
		{Sent: 0, E2E: time.Second, TTFT: time.Second, OutputTokens: 3, Engine: "a"},
		{Sent: time.Millisecond, SendLag: 5 * time.Millisecond, E2E: time.Second, OutputTokens: 3, Engine: "a"},
		{ErrKind: "http_400", ErrMsg: "  prompt too long\n"},
		{ErrKind: "http_400", ErrMsg: "another"},
		{ErrKind: KindConnect, ErrMsg: strings.Repeat("é", 150)},
	}
	rep := buildReport(results, len(results))
	rep.OpenLoop = true
	text := func() string {
		var b strings.Builder
		if err := rep.WriteText(&b); err != nil {
			t.Fatal(err)
		}
		return b.String()
	}
	out := text()
	for _, want := range []string{
		"error http_400       2 (first: prompt too long)",
		"prompt and cached not reported (the server sent no usage), output 6",
		"load imbalance n/a over the 1 that answered (engines that served nothing are unseen; -engines names them all): a=2",
		"no arrival waited for a slot",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report does not say %q:\n%s", want, out)
		}
	}
	if s := rep.FailureSummary(); !strings.HasPrefix(s, "connect 1 (first: é") || !strings.Contains(s, "…); http_400 2 (first: prompt too long)") {
		t.Errorf("failure summary %q", s)
	}
	imbJSON := func() (imb any, over any) {
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m["load_imbalance"], m["load_imbalance_engines"]
	}
	if imb, over := imbJSON(); imb != nil || over != "answered" {
		t.Errorf("one engine answered: JSON load_imbalance %v over %v, want null over answered", imb, over)
	}
	if p := rep.PolicyResult(); p.LoadImbalance != 0 || !p.ImbalanceUnseen {
		t.Errorf("policy result: imbalance %v, unseen %v", p.LoadImbalance, p.ImbalanceUnseen)
	}
	rep.CountEngines([]string{"a", "b"})
	if imb, over := imbJSON(); imb != 2.0 || over != "given" {
		t.Errorf("-engines a,b: JSON load_imbalance %v over %v, want 2 over given", imb, over)
	}
	rep.SlotWaits = 1
	out = text()
	for _, want := range []string{"load imbalance 2.00: a=2 b=0", "(1 arrivals waited for a concurrency slot)",
		"warning       latencies count from the send, not the scheduled arrival: the 1 delayed"} {
		if !strings.Contains(out, want) {
			t.Errorf("report does not say %q:\n%s", want, out)
		}
	}
}

// TestAcquireCountsWaits: an arrival that finds every slot taken is
// counted, one that finds a free slot is not.
func TestAcquireCountsWaits(t *testing.T) {
	g := &generator{}
	sem := make(chan struct{}, 1)
	if !g.acquire(context.Background(), sem) || g.slotWaits.Load() != 0 {
		t.Fatalf("free slot: waits %d", g.slotWaits.Load())
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if g.acquire(ctx, sem) || g.slotWaits.Load() != 1 {
		t.Fatalf("full slots and a cancelled run: waits %d, want 1 and no slot", g.slotWaits.Load())
	}
}

// TestReportJSONUndefinedIsNull: what a run could not measure is null in
// the JSON (and n/a in the text), as `kvmesh bench --json` writes it, not a
// 0 that reads as a measurement (before: "ttft": {"mean_s": 0, …},
// "throughput_rps": 0, "load_imbalance": 0 for a run where nothing
// completed); what it measured is a number.
func TestReportJSONUndefinedIsNull(t *testing.T) {
	decode := func(rep *Report) map[string]any {
		t.Helper()
		b, err := json.Marshal(rep)
		if err != nil {
			t.Fatal(err)
		}
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		return m
	}
	undefined := []string{"duration_s", "throughput_rps", "output_tokens_per_s", "prefix_hit_rate", "load_imbalance",
		"ttft.mean_s", "ttft.p50_s", "ttft.p90_s", "ttft.p99_s", "ttft.max_s", "e2e.mean_s", "e2e.p99_s"}
	get := func(m map[string]any, key string) (any, bool) {
		if a, b, ok := strings.Cut(key, "."); ok {
			sub, _ := m[a].(map[string]any)
			v, ok := sub[b]
			return v, ok
		}
		v, ok := m[key]
		return v, ok
	}
	failed := buildReport([]Result{{ErrKind: KindConnect}, {ErrKind: KindConnect}}, 2)
	m := decode(failed)
	for _, k := range undefined {
		if v, ok := get(m, k); !ok || v != nil {
			t.Errorf("nothing completed: %s = %v (present %v), want null", k, v, ok)
		}
	}
	if m["failed"] != float64(2) || m["send_lag_p99_s"] != float64(0) {
		t.Errorf("nothing completed: failed %v, send lag %v", m["failed"], m["send_lag_p99_s"])
	}
	if m := decode(buildReport(nil, 0)); m["send_lag_p99_s"] != nil {
		t.Errorf("nothing sent: send_lag_p99_s %v, want null", m["send_lag_p99_s"])
	}
	var text strings.Builder
	failed.WriteText(&text)
	for _, want := range []string{"duration      n/a", "throughput    n/a", "TTFT          n/a", "E2E           n/a", "tokens        n/a"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report does not say %q:\n%s", want, text.String())
		}
	}

	ok := buildReport([]Result{
		{Sent: 0, TTFT: time.Millisecond, E2E: time.Second, PromptTokens: 4, CachedTokens: 2, OutputTokens: 1, Engine: "a"},
		{Sent: time.Second, TTFT: time.Millisecond, E2E: time.Second, PromptTokens: 4, CachedTokens: 2, OutputTokens: 1, Engine: "b"},
	}, 2)
	m = decode(ok)
	for _, k := range undefined {
		if v, _ := get(m, k); v == nil {
			t.Errorf("all completed: %s is null", k)
		}
	}
	if m["prefix_hit_rate"] != 0.5 || m["throughput_rps"] != 1.0 || m["load_imbalance"] != 1.0 {
		t.Errorf("all completed: %v", m)
	}
	// A server that names no engine: the imbalance is unknown.
	ok.PerEngine, ok.LoadImbalance = map[string]int{}, 0
	if m := decode(ok); m["load_imbalance"] != nil {
		t.Errorf("no engine named: load_imbalance %v, want null", m["load_imbalance"])
	}
}

// TestReportWindowTPOTFailures: the throughput window ends at the last
// request's end, a failure's included (before, at the last success: a
// 2.3 s run whose last requests failed read 0.20 s and 5 req/s); the JSON
// and the text carry TPOT as `kvmesh bench --json` does (tpot_mean_s,
// tpot_p99_s: before, only the HTML had it); and the run's records hold
// the failed requests for -requests-csv (before, left out).
func TestReportWindowTPOTFailures(t *testing.T) {
	results := []Result{
		{Sent: 0, TTFT: 100 * time.Millisecond, E2E: 200 * time.Millisecond, OutputTokens: 3, Engine: "e1"},
		{Sent: 200 * time.Millisecond, E2E: 50 * time.Millisecond, ErrKind: "http_500", ErrMsg: "boom", Engine: "e2"},
		{Sent: 250 * time.Millisecond, E2E: 2 * time.Second, ErrKind: KindTimeout, ErrMsg: "deadline"},
	}
	rep := buildReport(results, len(results))
	if rep.DurationS != 2.25 || rep.ThroughputRPS != 1/2.25 {
		t.Errorf("duration %v s, %v req/s; want 2.25 s (the timeout's end), 1/2.25", rep.DurationS, rep.ThroughputRPS)
	}
	b, err := json.Marshal(rep)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	if m["tpot_mean_s"] != 0.05 || m["tpot_p99_s"] != 0.05 {
		t.Errorf("JSON TPOT mean %v p99 %v, want 0.05 (100 ms over 2 tokens after the first)", m["tpot_mean_s"], m["tpot_p99_s"])
	}
	if first, _ := m["first_errors"].(map[string]any); first["http_500"] != "boom" || first[KindTimeout] != "deadline" {
		t.Errorf("first_errors %v", m["first_errors"])
	}
	var sb strings.Builder
	if err := rep.WriteText(&sb); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(sb.String(), "TPOT          mean 50.0ms  p99 50.0ms\n") || !strings.Contains(sb.String(), "duration      2.25 s\n") {
		t.Errorf("text:\n%s", sb.String())
	}
	run := rep.Run(1, nil)
	if len(run.Records) != 1 || len(run.Failures) != 2 {
		t.Fatalf("%d records, %d failures; want 1 and 2", len(run.Records), len(run.Failures))
	}
	if f := run.Failures[0]; f.Kind != "http_500" || f.Start != 0.2 || f.E2E != 0.05 || run.EngineIDs[f.Engine] != "e2" {
		t.Errorf("failure 0: %+v (engines %v)", f, run.EngineIDs)
	}
	if f := run.Failures[1]; f.Kind != KindTimeout || f.Engine != -1 || f.E2E != 2 {
		t.Errorf("failure 1: %+v", f)
	}
	// Nothing completed with an output of two tokens or more: null.
	rep = buildReport(results[1:], 2)
	if b, _ := json.Marshal(rep); !strings.Contains(string(b), `"tpot_mean_s":null,"tpot_p99_s":null`) {
		t.Errorf("no TPOT: %s", b)
	}
}
