package policies

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/scheduler"
)

// keys returns distinct chain keys from..from+n-1 (a prompt of n blocks).
func keys(from, n int) []uint64 {
	k := make([]uint64, n)
	for i := range k {
		k[i] = uint64(from + i)
	}
	return k
}

func reqKeys(k []uint64) *scheduler.Request {
	return &scheduler.Request{Keys: k, BlockSize: 16, PromptTokens: 16 * len(k), OutputTokens: 64}
}

// TestHistoryKthenaPrefixStore replays Kthena's own table test of its
// prefix store (pkg/kthena-router/scheduler/plugins/cache/prefix_store_test.go
// TestModelPrefixStore and "Eviction callback uses correct hashModelKey"):
// match length is one past the deepest stored hash, the per-pod LRU evicts
// the deepest hashes of a prompt first.
func TestHistoryKthenaPrefixStore(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cap   int
		add   map[string][]uint64
		query []uint64
		want  map[string]int
	}{
		{"empty", 100, nil, []uint64{1, 2, 3}, map[string]int{"pod1": 0}},
		{"single pod exact match", 100, map[string][]uint64{"pod1": {1, 2, 3}}, []uint64{1, 2, 3}, map[string]int{"pod1": 3}},
		{"different match lengths", 100, map[string][]uint64{"pod1": {1, 2, 3}, "pod2": {1, 2}, "pod3": {1, 4, 5}},
			[]uint64{1, 2, 3}, map[string]int{"pod1": 3, "pod2": 2, "pod3": 1}},
		{"LRU eviction", 2, map[string][]uint64{"pod1": {1, 2, 3}}, []uint64{1, 2, 3}, map[string]int{"pod1": 2}},
		{"LRU eviction of 5 into 3", 3, map[string][]uint64{"pod1": {1, 2, 3, 4, 5}}, []uint64{1, 2, 3, 4, 5}, map[string]int{"pod1": 3}},
	} {
		h := NewHistory(tc.cap, 0)
		for pod, k := range tc.add {
			h.Insert(pod, k)
		}
		for pod, want := range tc.want {
			if got := h.Deepest(pod, tc.query); got != want {
				t.Errorf("%s: %s matched %d, want %d", tc.name, pod, got, want)
			}
		}
	}
	h := NewHistory(3, 0)
	h.Insert("pod", []uint64{1, 2})
	h.Insert("pod", []uint64{3})
	h.Insert("pod", []uint64{5, 6})
	if a, b, c := h.Deepest("pod", []uint64{1, 2}), h.Deepest("pod", []uint64{5, 6}), h.Deepest("pod", []uint64{3}); a != 0 || b != 2 || c != 1 {
		t.Errorf("eviction order: old %d (want 0), new %d (want 2), other %d (want 1)", a, b, c)
	}
	if h.Size("pod") != 3 {
		t.Errorf("size %d, want 3", h.Size("pod"))
	}
}

// TestHistoryRadixPrefix: a radix tree's match is contiguous from the root;
// MaxBlocks caps what is recorded and matched (llm-d's 256 blocks).
func TestHistoryRadixPrefix(t *testing.T) {
	h := NewHistory(0, 0)
	h.Insert("w", []uint64{1, 2, 3, 4})
	if got := h.Prefix("w", []uint64{1, 2, 9, 4}); got != 2 {
		t.Errorf("prefix through a divergence: %d, want 2", got)
	}
	capped := NewHistory(0, 2)
	capped.Insert("w", []uint64{1, 2, 3, 4})
	if got, size := capped.Prefix("w", []uint64{1, 2, 3, 4}), capped.Size("w"); got != 2 || size != 2 {
		t.Errorf("capped at 2: matched %d, size %d", got, size)
	}
}

// TestSGLangTree follows sgl-router's cache_aware behaviour with its own
// tree (cache_aware.rs tests: the same text goes back to the worker that
// got it; a cold text goes to the smallest tree; under imbalance the
// shortest queue wins, and the text is inserted there too).
func TestSGLangTree(t *testing.T) {
	p := NewSGLang()
	es := []scheduler.Engine{eng("w1"), eng("w2")}
	none := []index.Match{{}, {}}
	first, why := pick(t, p, reqKeys(keys(1, 10)), es, none)
	if why != "smallest-cache" {
		t.Fatalf("cold first request: %s", why)
	}
	other := "w1"
	if first == "w1" {
		other = "w2"
	}
	if got, why := pick(t, p, reqKeys(keys(1, 10)), es, none); got != first || why != "cache-match" {
		t.Fatalf("same text: %s (%s), want %s by cache-match", got, why, first)
	}
	// 3 of 10 blocks shared = 0.3, not above cache_threshold 0.3: the
	// smallest tree (the other worker, empty).
	if got, why := pick(t, p, reqKeys(append(keys(1, 3), keys(100, 7)...)), es, none); got != other || why != "smallest-cache" {
		t.Fatalf("match 0.3: %s (%s), want %s by smallest-cache", got, why, other)
	}
	// Imbalanced (70 − 5 > 64, 70 > 1.5·5): shortest queue even for a hit,
	// and the text is then in that worker's tree as well.
	es[0].InFlight, es[1].InFlight = 70, 5
	if first == "w2" {
		es[0].InFlight, es[1].InFlight = 5, 70
	}
	if got, why := pick(t, p, reqKeys(keys(1, 10)), es, none); got != other || why != "imbalanced-shortest-queue" {
		t.Fatalf("imbalanced: %s (%s), want %s", got, why, other)
	}
	if p.History.Prefix(other, keys(1, 10)) != 10 {
		t.Errorf("the imbalanced pick did not insert into %s's tree", other)
	}
	// The engines' KV events are not its view: a full confirmed match on
	// a worker it never sent the text to does not count.
	es[0].InFlight, es[1].InFlight = 0, 0
	if got, why := pick(t, p, reqKeys(keys(500, 10)), es, []index.Match{full(10), full(10)}); why != "smallest-cache" {
		t.Fatalf("KV events counted: %s (%s)", got, why)
	}
}

// TestRayTreeNeverEvicts: Ray's default tree (do_eviction False) keeps
// everything it routed; the smallest tree gets cold text.
func TestRayTreeNeverEvicts(t *testing.T) {
	p := NewRay()
	es := []scheduler.Engine{eng("a"), eng("b")}
	none := []index.Match{{}, {}}
	p.History.Insert("a", keys(1, 1000))
	if got, why := pick(t, p, reqKeys(keys(5000, 10)), es, none); got != "b" || why != "low-utilization" {
		t.Fatalf("cold text: %s (%s), want the smaller tree b", got, why)
	}
	if got, why := pick(t, p, reqKeys(keys(1, 10)), es, none); got != "a" || why != "prefix-match" {
		t.Fatalf("routed text: %s (%s), want a", got, why)
	}
}

// TestDynamoActiveBlocksDedup pins sequence.rs: a worker's active blocks are
// the distinct prompt blocks of its active requests (a prefix shared by N
// requests counts once, outputs not at all), and a request's new blocks are
// only those not already active.
func TestDynamoActiveBlocksDedup(t *testing.T) {
	a := NewActiveBlocks()
	shared := keys(1, 8)
	for i := 0; i < 5; i++ { // five requests: 8 shared blocks + 2 own each
		a.Add("w", append(append([]uint64{}, shared...), keys(100+10*i, 2)...))
	}
	if got := a.After("w", nil); got != 8+5*2 {
		t.Fatalf("active blocks %d, want 18 (8 shared once + 10 own)", got)
	}
	if got := a.After("w", append(append([]uint64{}, shared...), keys(900, 2)...)); got != 20 {
		t.Fatalf("after a sharing request: %d, want 20 (only its 2 new blocks)", got)
	}
	a.Remove("w", append(append([]uint64{}, shared...), keys(100, 2)...))
	if got := a.After("w", nil); got != 16 {
		t.Fatalf("after one finished: %d, want 16 (shared blocks stay while others hold them)", got)
	}
	// The policy: a worker hot with a group's prefix is charged the shared
	// blocks once, so the group's next request stays there.
	p := Dynamo{OverlapWeight: 1, Active: NewActiveBlocks()}
	for i := 0; i < 20; i++ {
		p.Active.Add("hot", append(append([]uint64{}, shared...), keys(1000+10*i, 2)...))
	}
	es := []scheduler.Engine{eng("hot"), eng("cold")}
	r := reqKeys(append(append([]uint64{}, shared...), keys(5000, 2)...))
	// hot: prefill max(0, 10 − 8) + decode (8 + 40 + 2) = 52; cold: 10 + 10 = 20.
	mustPick(t, p, r, es, []index.Match{{GPU: 8}, {}}, "cold", "lowest-cost", "hot 52, cold 20")
	p = Dynamo{OverlapWeight: 1, Active: NewActiveBlocks()}
	for i := 0; i < 3; i++ {
		p.Active.Add("hot", append(append([]uint64{}, shared...), keys(1000+10*i, 2)...))
	}
	// hot: 2 + (8 + 6 + 2) = 18; cold: 20. Without de-duplication hot
	// would be charged 3·10 + 10 = 40.
	mustPick(t, p, r, es, []index.Match{{GPU: 8}, {}}, "hot", "lowest-cost", "hot 18, cold 20")
	p.Finished("hot", r.Keys)
}

// TestKthenaDefaultPlugins: the shipped default scores least-request,
// least-latency and its own routing history (not KV events).
func TestKthenaDefaultPlugins(t *testing.T) {
	p := NewKthena()
	a, b := eng("a"), eng("b")
	// Same load; a is slower on both latencies: least-latency a 0, b 100.
	a.TTFT, a.TPOT = 2*time.Second, 40*time.Millisecond
	b.TTFT, b.TPOT = time.Second, 20*time.Millisecond
	es := []scheduler.Engine{a, b}
	// KV events say a holds the prompt, but the default has no
	// kvcache-aware plugin: b by latency.
	mustPick(t, p, reqKeys(keys(1, 10)), es, []index.Match{full(10), {}}, "b", "weighted-score",
		"a = 100 + 0 + 0, b = 100 + 100 + 0 (b's history gets the prompt)")
	// b now holds the prompt in the router's history: prefix-cache adds
	// 100 to b.
	p.History.Insert("a", keys(50, 10))
	mustPick(t, p, reqKeys(keys(1, 10)), es, []index.Match{full(10), {}}, "b", "weighted-score",
		"b = 100 + 100 + 100")
	// Only the first 128 blocks are hashed: a 200-block prompt whose first
	// 128 blocks a holds scores 100 on a.
	p = NewKthena()
	a.TTFT, a.TPOT, b.TTFT, b.TPOT = 0, 0, 0, 0 // no samples: least-latency 100 each
	long := keys(1, 200)
	p.History.Insert("a", long[:128])
	b.InFlight, b.Running = 1, 1 // b busier: least-request a 100, b 0
	a.InFlight = 0
	es = []scheduler.Engine{a, b}
	mustPick(t, p, reqKeys(long), es, []index.Match{{}, {}}, "a", "weighted-score", "a = 100 + 100 + 100, b = 0 + 100 + 0")
}
