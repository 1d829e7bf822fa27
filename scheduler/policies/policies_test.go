package policies

import (
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// pick runs p over candidates built from es with the given matches.
func pick(t *testing.T, p scheduler.Policy, req *scheduler.Request, es []scheduler.Engine, ms []index.Match) (string, string) {
	t.Helper()
	cs := make([]scheduler.Candidate, len(es))
	w := scheduler.DefaultTierWeights()
	for i := range es {
		cs[i] = scheduler.Candidate{Engine: &es[i], Match: ms[i]}
		cs[i].Hit = w.Weighted(ms[i]) / float64(req.Blocks())
		cs[i].CachedTokens = int(w.Weighted(ms[i]) * float64(req.BlockSize))
	}
	var cyc scheduler.Cycle
	i, reason := p.Pick(req, cs, &cyc)
	return cs[i].ID, reason
}

func req(blocks int) *scheduler.Request {
	k := make([]uint64, blocks)
	return &scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: blocks * 16, OutputTokens: 64}
}

func full(n int) index.Match         { return index.Match{GPU: n, CPU: n, Other: n, Spec: n} }
func spec(n int) index.Match         { return index.Match{Spec: n} }
func eng(id string) scheduler.Engine { return scheduler.Engine{ID: id, Healthy: true} }

// indexSGLang is sglang at its launch thresholds with the index standing in
// for its tree (History nil), so the thresholds can be tested on matches.
func indexSGLang() SGLang {
	c := DefaultSGLangConfig()
	return SGLang{CacheThreshold: c.CacheThreshold, BalanceAbsThreshold: c.BalanceAbsThreshold, BalanceRelThreshold: c.BalanceRelThreshold}
}

// indexRay is ray at its defaults with the index standing in for its tree.
func indexRay() Ray {
	c := DefaultRayConfig()
	return Ray{ImbalancedThreshold: c.ImbalancedThreshold, MatchRateThreshold: c.MatchRateThreshold}
}

func TestSGLang(t *testing.T) {
	p := indexSGLang()
	a, b, c := eng("a"), eng("b"), eng("c")
	// Balanced, match above 0.3: best match wins even if a bit busier.
	a.InFlight, b.InFlight, c.InFlight = 10, 5, 5
	if got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(8), spec(2), {}}); got != "a" || why != "cache-match" {
		t.Fatalf("balanced high match: %s %s", got, why)
	}
	// Balanced, match 0.3, not above the threshold: emptiest cache.
	a.KVUsage, b.KVUsage, c.KVUsage = 0.5, 0.2, 0.9
	if got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(3), {}, {}}); got != "b" || why != "smallest-cache" {
		t.Fatalf("low match: %s %s", got, why)
	}
	// 40 − 2 = 38 is not > 64: still balanced at the launch defaults.
	a.InFlight, b.InFlight, c.InFlight = 40, 2, 20
	if got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(10), {}, {}}); got != "a" || why != "cache-match" {
		t.Fatalf("balanced at 38 apart: %s %s", got, why)
	}
	// Imbalanced (80 − 2 > 64 and 80 > 1.5·2): shortest queue despite the match.
	a.InFlight, b.InFlight, c.InFlight = 80, 2, 20
	if got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(10), {}, {}}); got != "b" || why != "imbalanced-shortest-queue" {
		t.Fatalf("imbalanced: %s %s", got, why)
	}
}

func TestRay(t *testing.T) {
	p := indexRay()
	a, b, c := eng("a"), eng("b"), eng("c")
	a.InFlight, b.InFlight, c.InFlight = 3, 1, 2
	if got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(5), spec(1), {}}); got != "a" || why != "prefix-match" {
		t.Fatalf("match: %s %s", got, why)
	}
	// Imbalanced: power of two choices never picks the busiest.
	a.InFlight, b.InFlight, c.InFlight = 30, 1, 2
	for i := 0; i < 20; i++ {
		got, why := pick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(10), {}, {}})
		if got == "a" || why != "imbalanced-pow2" {
			t.Fatalf("imbalanced: %s %s", got, why)
		}
	}
}

func TestKthena(t *testing.T) {
	p := NewKthenaKVCache()
	a, b := eng("a"), eng("b")
	// score = least-request 100·(maxBase − base)/maxBase with base = onFlight
	// + 100·max(onFlight − running, 0), plus kvcache-aware 100·confirmed
	// matched blocks/request blocks; highest wins.
	// a: 1 in flight, not running (base 1 + 100 = 101), 3 of 10 blocks
	// cached; b: 60 in flight, all running (base 60). maxBase 101:
	// a = 0 + 30 = 30, b = int(100·41/101) = 40. (Were a request not yet
	// running worth what a running one is, a's base would be 1 and a would
	// win.)
	a.InFlight, b.InFlight, b.Running = 1, 60, 60
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(3), {}}); got != "b" {
		t.Fatalf("kthena picked %s (a = 30, b = 40)", got)
	}
	// 5 of 10 cached: a = 0 + 50 = 50, b = 40.
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(5), {}}); got != "a" {
		t.Fatalf("kthena picked %s (a = 50, b = 40)", got)
	}
	// Speculative matches are not KV events: a = 0 + 0, b = 40.
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{spec(10), {}}); got != "b" {
		t.Fatalf("kthena counted a speculative match: %s (a = 0, b = 40)", got)
	}
	a.InFlight, a.Running = 50, 50
	b.InFlight, b.Running = 100, 100
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(2), full(10)}); got != "b" {
		// a = 50 + 20 = 70; b = 0 + 100 = 100.
		t.Fatalf("kthena picked %s", got)
	}
}

func TestDynamo(t *testing.T) {
	p := Dynamo{OverlapWeight: 1} // no active-sequence tracker: LocalActiveTokens
	a, b := eng("a"), eng("b")
	// a caches 8 of 10 blocks but holds 5 more active blocks than b.
	a.LocalActiveTokens = 5 * 16
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(8), {}}); got != "a" {
		t.Fatalf("dynamo: %s (cost a = 2+15, b = 10+10)", got)
	}
	a.LocalActiveTokens = 20 * 16
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(8), {}}); got != "b" {
		t.Fatalf("dynamo: %s (cost a = 2+30, b = 10+10)", got)
	}
}

func TestLLMD(t *testing.T) {
	p := LLMD()
	a, b := eng("a"), eng("b")
	a.Waiting, a.KVUsage = 4, 0.5
	b.Waiting, b.KVUsage = 0, 0.5
	// prefix 3·1.0 beats queue 2·1.0.
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(10), {}}); got != "a" {
		t.Fatalf("llmd: %s", got)
	}
	// Half a match (1.5) loses to the queue (2).
	if got, _ := pick(t, p, req(10), []scheduler.Engine{a, b}, []index.Match{full(5), {}}); got != "b" {
		t.Fatalf("llmd: %s", got)
	}
}

func TestKVMesh(t *testing.T) {
	p := NewKVMesh()
	a, b := eng("a"), eng("b")
	r := req(256) // 4,096 tokens
	// A hit is kept while the hot engine is moderately busier.
	a.InFlight, b.InFlight = 3, 2
	a.LocalActiveTokens, b.LocalActiveTokens = 3*4200, 2*4200
	if got, why := pick(t, p, r, []scheduler.Engine{a, b}, []index.Match{full(240), {}}); got != "a" || why != "prefix-affinity" {
		t.Fatalf("kvmesh left its cache: %s %s", got, why)
	}
	// But not when its prefill queue is deep: no death spiral.
	a.LocalPrefillTokens = 200000
	if got, why := pick(t, p, r, []scheduler.Engine{a, b}, []index.Match{full(240), {}}); got != "b" || why != "spill-over-cache" {
		t.Fatalf("kvmesh sent a request behind 200k queued tokens: %s %s", got, why)
	}
	// No match anywhere: the lighter engine.
	a.LocalPrefillTokens = 0
	if got, why := pick(t, p, r, []scheduler.Engine{a, b}, []index.Match{{}, {}}); got != "b" || why != "no-cache-least-cost" {
		t.Fatalf("kvmesh: %s %s", got, why)
	}
	if err := (KVMesh{}).Validate(); err == nil {
		t.Fatal("zero prefill rate accepted")
	}
}

// TestKVMeshWaiting: a miss costs the requests that will queue behind it,
// counted as the engine's waiting requests up to its running batch.
func TestKVMeshWaiting(t *testing.T) {
	r := req(256) // 4,096 uncached tokens everywhere: ≈ 0.14 s of prefill
	// a: 20 short requests waiting (2k tokens of queued prefill); b: none
	// waiting but 60k tokens (2 s) of prefill queued.
	engines := func(running int) []scheduler.Engine {
		a, b := eng("a"), eng("b")
		a.Running, a.Waiting, a.InFlight, a.QueuedPrefillTokens = running, 20, running+20, 2000
		b.Running, b.InFlight, b.QueuedPrefillTokens = running, running, 60000
		return []scheduler.Engine{a, b}
	}
	none := []index.Match{{}, {}}
	// The per-request cost terms alone: a's 20 waiting and b's 2 s of queue
	// make this cluster saturated, which switches to least work (pinned by
	// TestKVMeshSaturatedLeastWork).
	terms := NewKVMesh()
	terms.SaturationQueue, terms.BalanceBound = 0, 0
	off := terms
	off.WaitingWeight = 0
	// Own time to first token alone prefers a's shorter queue of work.
	if got, _ := pick(t, off, r, engines(30), none); got != "a" {
		t.Fatalf("waitingWeight 0 picked %s, want a", got)
	}
	// Its 20 waiting requests each wait behind the 4,096 tokens: 2·20·0.14 s ≫ 2 s.
	if got, _ := pick(t, terms, r, engines(30), none); got != "b" {
		t.Fatalf("kvmesh picked %s, want b (20 requests would queue behind the prefill on a)", got)
	}
	// With 2 running, the count is capped at 2: 2·2·0.14 s < 2 s.
	if got, _ := pick(t, terms, r, engines(2), none); got != "a" {
		t.Fatalf("kvmesh picked %s, want a (waiting capped at the running batch)", got)
	}
	bad := NewKVMesh()
	bad.WaitingWeight = -1
	if err := bad.Validate(); err == nil {
		t.Fatal("negative waitingWeight accepted")
	}
}

// TestKVMeshStallWeight: a long prompt's stall on an engine running many
// short streams is weighted as decode-side seconds (stallWeight 0.2): it
// goes there rather than behind seconds of queued prefill elsewhere; at
// stallWeight 1 (the weight before it) n running streams × its prefill
// kept it out.
func TestKVMeshStallWeight(t *testing.T) {
	r := req(2048) // 32,768 uncached tokens ≈ 1.1 s at 30k tok/s
	a, b := eng("a"), eng("b")
	// a: 30 short streams running, nothing queued; b: 1 running, 12 s of
	// prefill queued (360k tokens).
	a.Running, a.InFlight, a.LocalActiveTokens = 30, 30, 30*600
	b.Running, b.InFlight, b.LocalPrefillTokens, b.LocalActiveTokens = 1, 1, 360000, 40000
	es := []scheduler.Engine{a, b}
	none := []index.Match{{}, {}}
	p := NewKVMesh()
	if p.StallWeight != 0.2 {
		t.Fatalf("default stallWeight %v, want 0.2", p.StallWeight)
	}
	// a: stall 0.2·30·1.1 s ≈ 6.6 s, about 11 s in all, against b's 12 s
	// queue; at weight 1 the stall alone is 33 s.
	if got, _ := pick(t, p, r, es, none); got != "a" {
		t.Fatalf("stallWeight 0.2 picked %s, want a (no queue)", got)
	}
	full := p
	full.StallWeight = 1
	if got, _ := pick(t, full, r, es, none); got != "b" {
		t.Fatalf("stallWeight 1 picked %s, want b (30 streams stalled 1.1 s each)", got)
	}
	// The weight scales the stall term alone.
	c := scheduler.Candidate{Engine: &es[0]}
	t1, t2 := full.Terms(r, &c, r.PromptTokens), p.Terms(r, &c, r.PromptTokens)
	if t1.Stall <= 0 || t2.Stall/t1.Stall < 0.1999 || t2.Stall/t1.Stall > 0.2001 {
		t.Fatalf("stall %v at weight 1, %v at 0.2", t1.Stall, t2.Stall)
	}
	t2.Stall = t1.Stall
	if t1 != t2 {
		t.Fatalf("terms other than the stall moved: %+v vs %+v", t1, t2)
	}
	p.StallWeight = -1
	if err := p.Validate(); err == nil {
		t.Fatal("negative stallWeight accepted")
	}
}

func TestRoundRobinAndLeastRequest(t *testing.T) {
	rr := &RoundRobin{}
	es := []scheduler.Engine{eng("a"), eng("b"), eng("c")}
	ms := make([]index.Match, 3)
	var got []string
	for i := 0; i < 6; i++ {
		id, _ := pick(t, rr, req(1), es, ms)
		got = append(got, id)
	}
	if got[0] == got[1] || got[0] != got[3] || got[1] != got[4] {
		t.Fatalf("round robin order %v", got)
	}
	es[0].InFlight, es[1].InFlight, es[2].InFlight = 3, 0, 2
	if id, _ := pick(t, LeastRequest{}, req(1), es, ms); id != "b" {
		t.Fatalf("least request %s", id)
	}
}

func TestRandomCoversAll(t *testing.T) {
	s, seen := Random{}, map[string]bool{}
	es := []scheduler.Engine{eng("a"), eng("b"), eng("c")}
	cs := make([]scheduler.Candidate, 3)
	var cyc scheduler.Cycle
	for i := 0; i < 100; i++ {
		for j := range es {
			cs[j] = scheduler.Candidate{Engine: &es[j]}
		}
		k, _ := s.Pick(req(1), cs, &cyc)
		seen[cs[k].ID] = true
	}
	if len(seen) != 3 {
		t.Fatalf("random reached %v", seen)
	}
}
