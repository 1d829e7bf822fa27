package loadgen

import (
	"context"
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
