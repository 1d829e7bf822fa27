package policies

import (
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// pickAll runs p over fresh candidates built from es and ms once per
// random-stream position 0..n-1 and returns every engine it picked and
// every reason it gave, so a test can require the same answer whatever the
// random draws (tie-breaks, power-of-two samples) are.
func pickAll(t *testing.T, p scheduler.Policy, r *scheduler.Request, es []scheduler.Engine, ms []index.Match, n int) (ids, reasons []string) {
	t.Helper()
	w := scheduler.DefaultTierWeights()
	for k := 0; k < n; k++ {
		cs := make([]scheduler.Candidate, len(es))
		for i := range es {
			cs[i] = scheduler.Candidate{Engine: &es[i], Match: ms[i]}
			cs[i].Hit = w.Weighted(ms[i]) / float64(r.Blocks())
			cs[i].CachedTokens = int(w.Weighted(ms[i]) * float64(r.BlockSize))
		}
		var cyc scheduler.Cycle
		for j := 0; j < k; j++ {
			cyc.Rand()
		}
		i, why := p.Pick(r, cs, &cyc)
		if !slices.Contains(ids, cs[i].ID) {
			ids = append(ids, cs[i].ID)
		}
		if !slices.Contains(reasons, why) {
			reasons = append(reasons, why)
		}
	}
	return ids, reasons
}

// mustPick fails unless p picks want with reason why (why "" = any) for
// every random-stream position.
func mustPick(t *testing.T, p scheduler.Policy, r *scheduler.Request, es []scheduler.Engine, ms []index.Match, want, why, calc string) {
	t.Helper()
	ids, reasons := pickAll(t, p, r, es, ms, 64)
	if len(ids) != 1 || ids[0] != want || why != "" && (len(reasons) != 1 || reasons[0] != why) {
		t.Fatalf("%s picked %v (%v), want only %s (%s): %s", p.Name(), ids, reasons, want, why, calc)
	}
}

// TestRayLowMatch covers PrefixCacheAffinityRouter's low-match branch. Ray
// (prefix_aware_router.py, _prefix_match_best_replicas): when the load is
// balanced and the best prefix match rate is below match_rate_threshold
// (0.1), the candidates are the "smallest tenants" (least prefix-cache
// use; here: lowest KV usage), and the replica with the shortest queue
// among them is chosen. ray.go samples two of them (power of two), which
// is the same whenever at most two replicas tie for the lowest usage, as
// here.
func TestRayLowMatch(t *testing.T) {
	p := indexRay()
	a, b, c := eng("a"), eng("b"), eng("c")
	a.KVUsage, b.KVUsage, c.KVUsage = 0.5, 0.2, 0.9
	// Balanced: in-flight 0, 5, 0 (spread 5 < 10).
	b.InFlight = 5
	// a matches 1 of 20 blocks: 5% < 10%. Only b has the lowest usage, so b,
	// although it is the busiest and has no match (not a: the match is too
	// short to count; not a or c: a random power of two over all).
	mustPick(t, p, req(20), []scheduler.Engine{a, b, c}, []index.Match{spec(1), {}, {}}, "b", "low-utilization",
		"best match 1/20 = 0.05 < 0.1; lowest KV usage: b (0.2)")
	// No match anywhere is the same branch.
	mustPick(t, p, req(20), []scheduler.Engine{a, b, c}, []index.Match{{}, {}, {}}, "b", "low-utilization",
		"best match 0 < 0.1; lowest KV usage: b (0.2)")
	// a and b tie at the lowest usage: both are sampled, the one with fewer
	// in flight wins (a: 4, b: 2); c (idle, 0.9) is never considered.
	a.KVUsage, a.InFlight, b.InFlight = 0.2, 4, 2
	mustPick(t, p, req(20), []scheduler.Engine{a, b, c}, []index.Match{spec(1), {}, {}}, "b", "low-utilization",
		"lowest KV usage: a, b (0.2); in flight a 4 > b 2")
	// At exactly the threshold (1 of 10 = 0.1 ≥ 0.1) the match counts: a,
	// the only replica with the best match, despite its usage and load.
	a.KVUsage = 0.9
	mustPick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{spec(1), {}, {}}, "a", "prefix-match",
		"best match 1/10 = 0.1 ≥ 0.1: a")
}

// TestRayShortlistAndBoundary: of the shortlist (best match), Ray takes the
// one with the smallest queue, not a power of two of it; and a queue spread
// of exactly imbalanced_threshold is still balanced (Ray's test is ">").
func TestRayShortlistAndBoundary(t *testing.T) {
	p := indexRay()
	a, b, c, d := eng("a"), eng("b"), eng("c"), eng("d")
	a.InFlight, b.InFlight, c.InFlight, d.InFlight = 6, 5, 1, 9
	ms := []index.Match{full(10), full(10), full(10), {}}
	// Three tie on the best match; c has the smallest queue. A power of two
	// over the three would miss c in a third of the picks.
	ids, _ := pickAll(t, p, req(10), []scheduler.Engine{a, b, c, d}, ms, 60)
	for i, id := range ids {
		if id != "c" {
			t.Fatalf("pick %d: %s, want c (smallest queue of the best-match shortlist a 6, b 5, c 1)", i, id)
		}
	}
	// Spread 10 − 0 = 10 is not > 10: balanced, so the match decides (a),
	// never d.
	a.InFlight, b.InFlight, c.InFlight, d.InFlight = 10, 10, 10, 0
	mustPick(t, p, req(10), []scheduler.Engine{a, b, c, d}, []index.Match{full(10), {}, {}, {}}, "a", "prefix-match",
		"spread 10 = threshold: balanced; only a matches")
	// Spread 11 > 10: imbalanced, power of two over all.
	a.InFlight = 11
	_, reasons := pickAll(t, p, req(10), []scheduler.Engine{a, b, c, d}, []index.Match{full(10), {}, {}, {}}, 20)
	for _, r := range reasons {
		if r != "imbalanced-pow2" {
			t.Fatalf("spread 11 > 10: reason %q, want imbalanced-pow2", r)
		}
	}
}

// TestDynamoOverlapWeight: logit = max(0, prefill_blocks − w·overlap) +
// decode_blocks, lowest wins (selector/default.rs: the overlap credit scales
// the cached blocks only), with prefill_blocks = LocalPrefillTokens/bs +
// request blocks and, without an active-sequence tracker, decode_blocks =
// LocalActiveTokens/bs + request blocks.
func TestDynamoOverlapWeight(t *testing.T) {
	a, b := eng("a"), eng("b")
	// a caches 8 of 10 blocks but has 12 active blocks; b is idle, cold.
	a.LocalActiveTokens = 12 * 16
	es, ms := []scheduler.Engine{a, b}, []index.Match{full(8), {}}
	mustPick(t, Dynamo{OverlapWeight: 1}, req(10), es, ms, "b", "lowest-cost",
		"w=1: a = 1·(10−8) + (12+10) = 24, b = 1·10 + 10 = 20")
	mustPick(t, Dynamo{OverlapWeight: 2}, req(10), es, ms, "b", "lowest-cost",
		"w=2: a = max(0, 10 − 2·8) + 22 = 22, b = 10 + 10 = 20")
	a.LocalActiveTokens = 9 * 16
	es = []scheduler.Engine{a, b}
	mustPick(t, Dynamo{OverlapWeight: 2}, req(10), es, ms, "a", "lowest-cost",
		"w=2: a = 0 + 19 = 19, b = 20 (at w=1: a = 2 + 19 = 21)")
	mustPick(t, Dynamo{OverlapWeight: 1}, req(10), es, ms, "b", "lowest-cost",
		"w=1: a = 2 + 19 = 21, b = 20")
	a.LocalActiveTokens = 12 * 16
	es = []scheduler.Engine{a, b}
	// Weight 0 ignores the cache: pure load.
	mustPick(t, Dynamo{OverlapWeight: 0}, req(10), es, ms, "b", "lowest-cost",
		"w=0: a = 0 + 22 = 22, b = 0 + 10 = 10")
}

// TestDynamoLocalPrefill: the worker's outstanding prefill (uncached prompt
// tokens of its requests without a first token) adds to its prefill blocks,
// in blocks, weighted by the overlap weight.
func TestDynamoLocalPrefill(t *testing.T) {
	a, b := eng("a"), eng("b")
	ms := []index.Match{full(8), {}} // a caches 8 of 10 blocks
	a.LocalPrefillTokens = 9 * 16
	d := Dynamo{OverlapWeight: 1}
	mustPick(t, d, req(10), []scheduler.Engine{a, b}, ms, "b", "lowest-cost",
		"a = (9 + 10 − 8) + (0 + 10) = 21, b = 10 + 10 = 20")
	a.LocalPrefillTokens = 7 * 16
	mustPick(t, d, req(10), []scheduler.Engine{a, b}, ms, "a", "lowest-cost",
		"a = (7 + 10 − 8) + (0 + 10) = 19, b = 20")
	// Queued blocks are not scaled by the overlap credit: at w=2, 16 queued
	// blocks still lose (the credit only cancels a's own 10 blocks).
	a.LocalPrefillTokens = 17 * 16
	mustPick(t, Dynamo{OverlapWeight: 2}, req(10), []scheduler.Engine{a, b}, ms, "b", "lowest-cost",
		"w=2: a = (17 + 10 − 16) + 10 = 21, b = 20")
	// Tokens, not blocks, would make any queue decisive: 3 queued blocks
	// keep a ahead.
	a.LocalPrefillTokens = 3 * 16
	mustPick(t, Dynamo{OverlapWeight: 2}, req(10), []scheduler.Engine{a, b}, ms, "a", "lowest-cost",
		"w=2: a = max(0, 3 + 10 − 16) + 10 = 10, b = 20")
}

// TestLLMDKVUsage: score = (2·queue + 2·(1 − KV usage) + 3·prefix) / 7,
// queue min-max normalised over waiting (all 1 when equal), prefix =
// confirmed matched blocks / request blocks; highest wins.
func TestLLMDKVUsage(t *testing.T) {
	p := LLMD()
	a, b, c := eng("a"), eng("b"), eng("c")
	// Same queue, no match: KV usage alone decides, the freest cache wins.
	a.KVUsage, b.KVUsage, c.KVUsage = 0.5, 0.2, 0.9
	a.Waiting, b.Waiting, c.Waiting = 3, 3, 3
	mustPick(t, p, req(10), []scheduler.Engine{a, b, c}, []index.Match{{}, {}, {}}, "b", "weighted-score",
		"queue 1 each, prefix 0: 2·0.5, 2·0.8, 2·0.1")
	// Weight 2 against the prefix's 3: a holds half the prefix but its
	// cache is nearly full.
	a.KVUsage, b.KVUsage = 0.9, 0.1
	es := []scheduler.Engine{a, b}
	mustPick(t, p, req(10), es, []index.Match{full(5), {}}, "b", "weighted-score",
		"a = 2 + 2·0.1 + 3·0.5 = 3.7, b = 2 + 2·0.9 = 3.8 (KV weight 1 would give a: 3.6 vs 2.9)")
	b.KVUsage = 0.2
	es = []scheduler.Engine{a, b}
	mustPick(t, p, req(10), es, []index.Match{full(5), {}}, "a", "weighted-score",
		"a = 2 + 2·0.1 + 3·0.5 = 3.7, b = 2 + 2·0.8 = 3.6 (KV weight 3 would give b: 4.4 vs 3.8)")
}

// TestRayProbedQueue: with probed queues the shortlist's smallest queue is
// the replicas' own reported load (running + waiting, snapshot-old), not the
// router's in-flight count.
func TestRayProbedQueue(t *testing.T) {
	p := indexRay()
	p.ProbedQueue = true
	a, b := eng("a"), eng("b")
	a.InFlight, b.InFlight = 0, 5 // the router's view: a is idle
	a.Running, a.Waiting = 4, 3   // the replicas' reports: a is busier
	b.Running, b.Waiting = 2, 0
	ms := []index.Match{full(10), full(10)}
	mustPick(t, p, req(10), []scheduler.Engine{a, b}, ms, "b", "prefix-match", "probed queues: b (2) < a (7)")
	p.ProbedQueue = false
	mustPick(t, p, req(10), []scheduler.Engine{a, b}, ms, "a", "prefix-match", "router's queues: a (0) < b (5)")
}
