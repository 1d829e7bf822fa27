package index

import (
	"fmt"
	"math/rand/v2"
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

func newIndex(t testing.TB) *Index {
	t.Helper()
	x, err := New(Config{SpeculativeTTL: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// newExactIndex returns an index whose lookups read every key: the model
// tests drive arbitrary states (holes in chains), where only the scan is
// exact; checkSearch covers the search on the same states.
func newExactIndex(t testing.TB) *Index {
	t.Helper()
	x, err := New(Config{SpeculativeTTL: time.Second, ExactLookup: true})
	if err != nil {
		t.Fatal(err)
	}
	return x
}

// model is the obviously-correct reference: a set per (engine, tier).
type model struct {
	held map[string]map[kvevents.Tier]map[uint64]bool
}

func (m *model) store(e string, t kvevents.Tier, keys []uint64) {
	if m.held[e] == nil {
		m.held[e] = map[kvevents.Tier]map[uint64]bool{}
	}
	if m.held[e][t] == nil {
		m.held[e][t] = map[uint64]bool{}
	}
	for _, k := range keys {
		m.held[e][t][k] = true
	}
}

func (m *model) remove(e string, t kvevents.Tier, keys []uint64) {
	for _, k := range keys {
		delete(m.held[e][t], k)
	}
}

// matcher is a reference index: model, or specModel with speculation.
type matcher interface {
	match(e string, keys []uint64) Match
}

// lookupAgainst looks q up in x and checks the search and every engine's
// match against the reference; it returns how many engines matched at
// least one block speculatively-or-better (Spec > 0). what names the step
// in a failure.
func lookupAgainst(t *testing.T, x *Index, ref matcher, engines []string, q []uint64, res *Result, what string) (matched int) {
	t.Helper()
	x.Lookup(q, res)
	checkSearch(t, x, q)
	for _, name := range engines {
		got := Match{}
		if s, ok := x.Slot(name); ok {
			got = res.Get(s)
		}
		want := ref.match(name, q)
		if got != want {
			t.Fatalf("%s engine %s: got %+v want %+v", what, name, got, want)
		}
		if want.Spec > 0 {
			matched++
		}
	}
	return matched
}

// clearAll clears every engine and checks the table is empty again.
func clearAll(t *testing.T, x *Index, engines []string) {
	t.Helper()
	for _, e := range engines {
		x.ClearEngine(e)
	}
	if ms := x.MemStats(); ms.Keys != 0 || ms.Entries != 0 || ms.OverflowKeys != 0 {
		t.Fatalf("after clearing every engine: %+v", ms)
	}
}

func (m *model) match(e string, keys []uint64) Match {
	in := func(k uint64, tiers ...kvevents.Tier) bool {
		for _, t := range tiers {
			if m.held[e][t][k] {
				return true
			}
		}
		return false
	}
	depth := func(tiers ...kvevents.Tier) int {
		for i, k := range keys {
			if !in(k, tiers...) {
				return i
			}
		}
		return len(keys)
	}
	g := depth(kvevents.TierGPU)
	c := depth(kvevents.TierGPU, kvevents.TierCPU)
	o := depth(kvevents.TierGPU, kvevents.TierCPU, kvevents.TierOther)
	return Match{GPU: g, CPU: c, Other: o, Spec: o}
}

// TestAgainstModel drives random stores, removes and clears over many
// engines (so keys overflow the inline elements) and compares every lookup
// and count with the reference model.
func TestAgainstModel(t *testing.T) {
	x := newExactIndex(t)
	m := &model{held: map[string]map[kvevents.Tier]map[uint64]bool{}}
	rng := rand.New(rand.NewPCG(1, 2))
	engines := []string{"e0", "e1", "e2", "e3", "e4", "e5", "e6", "e7"}
	// Small key universe (including key 0) so chains collide and overflow.
	chains := make([][]uint64, 20)
	for i := range chains {
		chains[i] = make([]uint64, 12)
		for j := range chains[i] {
			chains[i][j] = uint64(i*7+j) % 60
		}
	}
	var res Result
	for step := 0; step < 20000; step++ {
		e := engines[rng.IntN(len(engines))]
		tier := kvevents.Tier(rng.IntN(3))
		c := chains[rng.IntN(len(chains))]
		lo := rng.IntN(len(c))
		hi := lo + rng.IntN(len(c)-lo) + 1
		switch r := rng.IntN(100); {
		case r < 55:
			x.Store(e, tier, c[lo:hi])
			m.store(e, tier, c[lo:hi])
		case r < 97:
			x.Remove(e, tier, c[lo:hi])
			m.remove(e, tier, c[lo:hi])
		default:
			x.ClearEngine(e)
			delete(m.held, e)
		}
		q := chains[rng.IntN(len(chains))]
		lookupAgainst(t, x, m, engines, q, &res, fmt.Sprintf("step %d", step))
		for _, name := range engines {
			for tr := kvevents.Tier(0); tr < 3; tr++ {
				if got, want := x.KeyCount(name, tr), len(m.held[name][tr]); got != want {
					t.Fatalf("step %d engine %s tier %v: count %d want %d", step, name, tr, got, want)
				}
			}
		}
	}
	// Remove everything: the table must be empty again.
	clearAll(t, x, engines)
}

func TestStoreIdempotent(t *testing.T) {
	x := newIndex(t)
	keys := []uint64{11, 12, 13}
	x.Store("a", kvevents.TierGPU, keys)
	x.Store("a", kvevents.TierGPU, keys)
	if got := x.KeyCount("a", kvevents.TierGPU); got != 3 {
		t.Fatalf("count after double store = %d, want 3", got)
	}
	x.Remove("a", kvevents.TierGPU, keys[2:])
	var res Result
	x.Lookup(keys, &res)
	s, _ := x.Slot("a")
	if got := res.Get(s); got.GPU != 2 {
		t.Fatalf("GPU depth = %d, want 2", got.GPU)
	}
}

func TestTiersCumulative(t *testing.T) {
	x := newIndex(t)
	keys := []uint64{1, 2, 3, 4, 5}
	x.Store("a", kvevents.TierGPU, keys[:2])
	x.Store("a", kvevents.TierCPU, keys[2:4])
	x.Store("a", kvevents.TierOther, keys[4:])
	var res Result
	x.Lookup(keys, &res)
	s, _ := x.Slot("a")
	want := Match{GPU: 2, CPU: 4, Other: 5, Spec: 5}
	if got := res.Get(s); got != want {
		t.Fatalf("got %+v want %+v", got, want)
	}
}

func TestSpeculative(t *testing.T) {
	x := newIndex(t)
	keys := []uint64{21, 22, 23, 24}
	t0 := time.Unix(1000, 0)
	x.Store("a", kvevents.TierGPU, keys[:1])
	x.AddSpeculative("a", keys, t0)
	x.AddSpeculative("b", keys[:2], t0)
	var res Result
	x.Lookup(keys, &res)
	sa, _ := x.Slot("a")
	sb, _ := x.Slot("b")
	if got := res.Get(sa); got != (Match{GPU: 1, CPU: 1, Other: 1, Spec: 4}) {
		t.Fatalf("a: %+v", got)
	}
	if got := res.Get(sb); got != (Match{Spec: 2}) {
		t.Fatalf("b: %+v", got)
	}
	// A confirmed store supersedes speculation and survives expiry.
	x.Store("a", kvevents.TierGPU, keys[1:2])
	x.ExpireSpeculative(t0.Add(999 * time.Millisecond))
	x.Lookup(keys, &res)
	if got := res.Get(sa); got.Spec != 4 {
		t.Fatalf("before TTL: %+v", got)
	}
	x.ExpireSpeculative(t0.Add(time.Second))
	x.Lookup(keys, &res)
	if got := res.Get(sa); got != (Match{GPU: 2, CPU: 2, Other: 2, Spec: 2}) {
		t.Fatalf("after TTL a: %+v", got)
	}
	if got := res.Get(sb); got != (Match{}) {
		t.Fatalf("after TTL b: %+v", got)
	}
	for _, es := range x.Engines() {
		if es.Speculative != 0 {
			t.Fatalf("%s still has %d speculative keys", es.Engine, es.Speculative)
		}
	}
	if ms := x.MemStats(); ms.Keys != 2 {
		t.Fatalf("keys = %d, want 2 (speculative-only keys dropped)", ms.Keys)
	}
}

func TestLookupNoAlloc(t *testing.T) {
	x := newIndex(t)
	keys := chain(1, 256)
	for e := 0; e < 8; e++ {
		x.Store(engineName(e), kvevents.TierGPU, keys[:32*(e+1)])
	}
	var res Result
	x.Lookup(keys, &res)
	if a := testing.AllocsPerRun(100, func() { x.Lookup(keys, &res) }); a != 0 {
		t.Fatalf("Lookup allocates %.1f times", a)
	}
	s, _ := x.Slot(engineName(7))
	if got := res.Get(s).GPU; got != 256 {
		t.Fatalf("engine 7 depth %d", got)
	}
}

func TestConfigValidate(t *testing.T) {
	err := Config{SpeculativeTTL: -1, InitialKeys: -1}.Validate()
	if err == nil {
		t.Fatal("want errors")
	}
	if _, err := New(Config{SpeculativeTTL: -time.Second}); err == nil {
		t.Fatal("New accepted a negative TTL")
	}
}

func TestConcurrentReadersWriters(t *testing.T) {
	x := newIndex(t)
	done := make(chan struct{})
	keys := chain(7, 64)
	go func() {
		defer close(done)
		for i := 0; i < 2000; i++ {
			e := engineName(i % 4)
			x.Store(e, kvevents.TierGPU, keys[:i%64+1])
			x.Remove(e, kvevents.TierGPU, keys[i%64:])
			x.AddSpeculative(e, keys[:8], time.Unix(int64(i), 0))
		}
	}()
	var res Result
	for {
		select {
		case <-done:
			return
		default:
			x.Lookup(keys, &res)
			for _, s := range res.Slots {
				m := res.Get(s)
				if m.GPU > m.CPU || m.CPU > m.Other || m.Other > m.Spec {
					t.Fatalf("depths not monotone: %+v", m)
				}
			}
		}
	}
}

func chain(seed uint64, n int) []uint64 {
	rng := rand.New(rand.NewPCG(seed, seed^0xabcdef))
	out := make([]uint64, n)
	for i := range out {
		out[i] = rng.Uint64() | 1
	}
	return out
}

func engineName(i int) string {
	return "engine-" + string(rune('A'+i%26)) + string(rune('a'+i/26))
}

func TestRegisterMetrics(t *testing.T) {
	x := newIndex(t)
	x.Store("a", kvevents.TierGPU, []uint64{1, 2, 3})
	reg := prometheus.NewPedanticRegistry()
	if err := x.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		got[mf.GetName()] = mf.GetMetric()[0].GetGauge().GetValue()
	}
	if got["kvmesh_index_keys"] != 3 || got["kvmesh_index_entries"] != 3 || got["kvmesh_index_engines"] != 1 {
		t.Fatalf("metrics %v", got)
	}
}

func TestEngineLimit(t *testing.T) {
	x := newIndex(t)
	for i := 0; i < MaxEngines+1; i++ {
		x.Store("e"+strconv.Itoa(i), kvevents.TierGPU, []uint64{uint64(i) + 1})
	}
	ms := x.MemStats()
	if ms.Engines != MaxEngines || ms.DroppedWrites != 1 || ms.Keys != MaxEngines {
		t.Fatalf("%+v", ms)
	}
	// Refused writes are a counter, as Prometheus' rate() needs.
	reg := prometheus.NewPedanticRegistry()
	if err := x.RegisterMetrics(reg); err != nil {
		t.Fatal(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var dropped *dto.MetricFamily
	for _, mf := range mfs {
		if mf.GetName() == "kvmesh_index_dropped_writes_total" {
			dropped = mf
		}
	}
	if dropped == nil || dropped.GetType() != dto.MetricType_COUNTER || dropped.GetMetric()[0].GetCounter().GetValue() != 1 {
		t.Fatalf("dropped writes metric %v, want a counter at 1", dropped)
	}
	// The last engine's key is not reported for any engine.
	var res Result
	x.Lookup([]uint64{MaxEngines + 1}, &res)
	if len(res.Slots) != 0 {
		t.Fatalf("dropped engine matched: %v", res.Slots)
	}
	x.Lookup([]uint64{1}, &res)
	if len(res.Slots) != 1 || res.Engine(res.Slots[0]) != "e0" {
		t.Fatalf("slots %v", res.Slots)
	}
}

func TestClearDropsSpeculation(t *testing.T) {
	x := newIndex(t)
	t0 := time.Unix(50, 0)
	x.AddSpeculative("a", []uint64{5, 6}, t0)
	x.ClearEngine("a")
	x.ExpireSpeculative(t0.Add(time.Hour))
	for _, es := range x.Engines() {
		if es.Speculative != 0 || es.Keys != [3]int{} {
			t.Fatalf("%+v", es)
		}
	}
	if ms := x.MemStats(); ms.Keys != 0 {
		t.Fatalf("%+v", ms)
	}
}

// TestEnginesComingAndGoing: engines that are cleared (they left) give their
// slot back, so a long run with many engines coming and going neither grows
// the engine table nor reaches MaxEngines (before, the 4096th engine ever
// seen was refused and every write for it dropped).
func TestEnginesComingAndGoing(t *testing.T) {
	x := newIndex(t)
	now := time.Unix(100, 0)
	x.Store("stays", kvevents.TierGPU, []uint64{1, 2})
	const n = 3 * (MaxEngines + 1) // even: the last pair leaves too
	for i := 0; i < n; i++ {
		e := "e" + strconv.Itoa(i)
		x.Store(e, kvevents.Tier(i%3), []uint64{uint64(i) + 10, uint64(i) + 11})
		x.AddSpeculative(e, []uint64{uint64(i) + 12}, now)
		if i%2 == 1 { // two at a time: the previous one leaves now
			x.ClearEngine("e" + strconv.Itoa(i-1))
			x.ClearEngine(e)
		}
	}
	ms := x.MemStats()
	if ms.DroppedWrites != 0 || ms.Engines != 1 || len(x.Engines()) != 1 || len(x.names) > 3 || ms.Entries != 2 {
		t.Fatalf("after %d engines came and went: %+v, %d slots, engines %+v", n, ms, len(x.names), x.Engines())
	}
	var res Result
	x.Lookup([]uint64{1, 2}, &res)
	if len(res.Slots) != 1 || res.Engine(res.Slots[0]) != "stays" || res.Get(res.Slots[0]).GPU != 2 {
		t.Fatalf("lookup %v", res.Slots)
	}
	x.Store("new", kvevents.TierGPU, []uint64{7})
	x.Lookup([]uint64{7}, &res)
	if len(res.Slots) != 1 || res.Engine(res.Slots[0]) != "new" {
		t.Fatalf("a new engine after the churn: slots %v", res.Slots)
	}
}

// TestReusedSlotKeepsItsSpeculation: the speculative records of an engine
// whose slot was released do not expire the next holder's entries.
func TestReusedSlotKeepsItsSpeculation(t *testing.T) {
	x := newIndex(t) // SpeculativeTTL 1s
	t0 := time.Unix(50, 0)
	x.AddSpeculative("a", []uint64{5}, t0)
	x.ClearEngine("a")
	x.AddSpeculative("b", []uint64{5}, t0.Add(500*time.Millisecond)) // gets a's slot
	x.ExpireSpeculative(t0.Add(time.Second))                         // a's record is due, b's is not
	if es := x.Engines(); len(es) != 1 || es[0].Engine != "b" || es[0].Speculative != 1 {
		t.Fatalf("engines %+v", es)
	}
	var res Result
	x.Lookup([]uint64{5}, &res)
	if len(res.Slots) != 1 || res.Get(res.Slots[0]).Spec != 1 {
		t.Fatal("b's speculative entry expired with a's record")
	}
}

// pendingSpec is how many speculative records the queue still holds.
func pendingSpec(x *Index) int { return len(x.spec.recs) - x.spec.head }

func specOf(t *testing.T, x *Index, engine string) int {
	t.Helper()
	for _, es := range x.Engines() {
		if es.Engine == engine {
			return es.Speculative
		}
	}
	t.Fatalf("engine %s unknown", engine)
	return 0
}

// TestSpeculativeExpiryIgnoresWallSteps: the ingress passes time.Now, whose
// monotonic reading the index keeps expiry on. After the wall clock steps
// back 60 s, the record routed before the step expires after its TTL and
// does not hold the ones behind it (it held them for the step plus the TTL,
// and the queue grew with the traffic); a step forward drops nothing early.
func TestSpeculativeExpiryIgnoresWallSteps(t *testing.T) {
	x, err := New(Config{SpeculativeTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Now()
	x.AddSpeculative("a", []uint64{1, 2, 3}, t0)
	for i := 1; i <= 30; i++ { // one request a second for 30 real seconds
		now := testutil.WallStepped(t0.Add(time.Duration(i)*time.Second), -time.Minute)
		x.AddSpeculative("b", []uint64{uint64(100 + i)}, now)
		x.ExpireSpeculative(now)
		if p := pendingSpec(x); p > 2 {
			t.Fatalf("%d s after the step: %d records pending, want at most 2 (TTL 2 s)", i, p)
		}
	}
	if a, b := specOf(t, x, "a"), specOf(t, x, "b"); a != 0 || b != 2 {
		t.Fatalf("speculative a=%d b=%d, want 0 and 2 (the last 2 s)", a, b)
	}

	y, _ := New(Config{SpeculativeTTL: 2 * time.Second})
	y.AddSpeculative("a", []uint64{1}, t0)
	y.ExpireSpeculative(testutil.WallStepped(t0.Add(time.Second), time.Hour))
	if a := specOf(t, y, "a"); a != 1 {
		t.Fatalf("1 real s later, after an hour's step forward: speculative %d, want 1", a)
	}
}

// TestSpeculativeWallOnlyStepBack: a time without a monotonic reading is
// read on its wall clock; when it goes back, the records routed before
// drop at once rather than hold the queue for the size of the step.
func TestSpeculativeWallOnlyStepBack(t *testing.T) {
	x, err := New(Config{SpeculativeTTL: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	t0 := time.Unix(1_800_000_000, 0)
	x.AddSpeculative("a", []uint64{1, 2, 3}, t0)
	for i := 1; i <= 30; i++ {
		now := t0.Add(-time.Hour + time.Duration(i)*time.Second)
		x.AddSpeculative("b", []uint64{uint64(100 + i)}, now)
		if p := pendingSpec(x); p > 2 {
			t.Fatalf("%d s after the step: %d records pending, want at most 2", i, p)
		}
	}
	if a, b := specOf(t, x, "a"), specOf(t, x, "b"); a != 0 || b != 2 {
		t.Fatalf("speculative a=%d b=%d, want 0 and 2", a, b)
	}
}
