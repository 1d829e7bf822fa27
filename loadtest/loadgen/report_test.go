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
// engines that answered unless CountEngines gave them all, and blames a
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
		"load imbalance 1.00 over the 1 that answered",
		"no arrival waited for a slot",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report does not say %q:\n%s", want, out)
		}
	}
	if s := rep.FailureSummary(); !strings.HasPrefix(s, "connect 1 (first: é") || !strings.Contains(s, "…); http_400 2 (first: prompt too long)") {
		t.Errorf("failure summary %q", s)
	}
	rep.CountEngines([]string{"a", "b"})
	rep.SlotWaits = 1
	out = text()
	for _, want := range []string{"load imbalance 2.00: a=2 b=0", "(1 arrivals waited for a concurrency slot)"} {
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
