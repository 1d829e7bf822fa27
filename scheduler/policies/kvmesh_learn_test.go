package policies

import (
	"fmt"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// TestKVMeshLearnedCostsBalanceShortPrompts: three engines with equal true
// costs, one of them busy enough that it never decoded alone (its learner
// has TTFT samples only, many of them; the others also have decode
// stretches). Short unshared prompts, whose load terms are near zero, go
// to the engines with fewer requests, not to the busy one: its step cost
// is the pooled estimate, as theirs is. When the busy engine reported the
// prior's step cost (3.4× below the true one), it looked cheapest, got
// every short prompt and so never decoded alone: one engine took 78 % of a
// 3,000-prompt trace on 8 (docs/BENCHMARKS.md, "Unseen shapes (stop 68)").
func TestKVMeshLearnedCostsBalanceShortPrompts(t *testing.T) {
	const base, perTok, rate = 0.024, 8.3e-8, 9500.0
	sec := func(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }
	l, err := learn.New(learn.Config{}) // the ingress default prior
	if err != nil {
		t.Fatal(err)
	}
	for k := 0; k < 300; k++ {
		tok := 5 + (k*37)%40
		for _, id := range []string{"a", "b", "c"} {
			l.ObservePrefill(id, tok, sec(base+float64(tok)/rate))
		}
		l.ObservePrefill("b", tok, sec(base+float64(tok)/rate))
		if k%3 == 0 {
			for _, id := range []string{"a", "c"} {
				ctx, seqs := 200+float64((k*7919)%2000), float64(1+k%8)
				l.ObserveDecode(id, seqs, ctx, sec(base+perTok*ctx+20e-6*seqs), 4)
			}
		}
	}
	p := NewKVMesh()
	p.Costs = l
	count := map[string]int{}
	a, b, c := eng("a"), eng("b"), eng("c")
	es := []scheduler.Engine{a, b, c}
	es[1].InFlight, es[1].Running, es[1].LocalActiveTokens = 6, 6, 6*40
	for i := 0; i < 12; i++ {
		r := &scheduler.Request{Keys: []uint64{uint64(i)}, BlockSize: 16, PromptTokens: 5 + i%30, OutputTokens: 5}
		got, why := pick(t, p, r, es, []index.Match{{}, {}, {}})
		count[got]++
		for j := range es {
			if es[j].ID == got {
				es[j].InFlight++
				es[j].Running++
				es[j].LocalActiveTokens += r.PromptTokens
			}
		}
		if why != "no-cache-least-cost" {
			t.Fatalf("pick %d: reason %s, want no-cache-least-cost", i, why)
		}
	}
	rb, ra := l.Rates("b"), l.Rates("a")
	t.Logf("picks %v; step base: b %.4f s, a %.4f s", count, rb.StepBase, ra.StepBase)
	if got := fmt.Sprint(count["a"], count["b"], count["c"]); count["b"] > 2 || count["a"] < 4 || count["c"] < 4 {
		t.Errorf("picks a, b, c = %s: want the 12 short prompts spread so the three engines end near 6 requests each (b started with 6)", got)
	}
}
