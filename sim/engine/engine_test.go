package engine

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// recSink records deep copies of every event with its time.
type recSink struct {
	batches [][]kvevents.Event
	times   []time.Duration
}

func (s *recSink) KVEvents(now time.Duration, evs []kvevents.Event) {
	cp := make([]kvevents.Event, len(evs))
	for i, ev := range evs {
		ev.BlockHashes = slices.Clone(ev.BlockHashes)
		ev.TokenIDs = slices.Clone(ev.TokenIDs)
		ev.ExtraKeys = slices.Clone(ev.ExtraKeys)
		cp[i] = ev
	}
	s.batches = append(s.batches, cp)
	s.times = append(s.times, now)
}

func (s *recSink) all() []kvevents.Event {
	var out []kvevents.Event
	for _, b := range s.batches {
		out = append(out, b...)
	}
	return out
}

func seq(from, n int) []uint32 {
	out := make([]uint32, n)
	for i := range out {
		out[i] = uint32(from + i)
	}
	return out
}

func newTestEngine(t *testing.T, cfg Config, sink EventSink) *Engine {
	t.Helper()
	if cfg.Profile.Name == "" {
		cfg.Profile = profiles["tiny"]
	}
	cfg.KeepBlockTokens = true
	e, err := New(cfg, sink)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// runUntilIdle steps e from now until it is idle, checking invariants after
// every step, and returns the end time.
func runUntilIdle(t *testing.T, e *Engine, now, until time.Duration) time.Duration {
	t.Helper()
	for i := 0; !e.Idle(); i++ {
		if i > 1_000_000 {
			t.Fatal("engine does not finish")
		}
		res := e.Step(now, max(until, now))
		if res.Steps == 0 {
			t.Fatalf("engine stuck at %v with %d running, %d waiting", now, len(e.running), e.waiting.len())
		}
		now = res.End
		checkInvariants(t, e)
	}
	return now
}

// checkInvariants verifies the block pool's bookkeeping against the requests.
func checkInvariants(t *testing.T, e *Engine) {
	t.Helper()
	p := e.pool
	refs := make([]int32, p.n)
	for r := range e.held {
		for _, b := range r.blocks {
			refs[b]++
		}
	}
	for _, r := range e.running {
		for _, b := range r.blocks {
			refs[b]++
		}
		if want := (r.computed + e.bs - 1) / e.bs; len(r.blocks) < want {
			t.Fatalf("request %s: %d blocks for %d computed tokens", r.ID, len(r.blocks), r.computed)
		}
	}
	free, hashed := 0, 0
	for b := 0; b < p.n; b++ {
		if refs[b] != p.ref[b] {
			t.Fatalf("block %d: ref %d, held by %d requests", b, p.ref[b], refs[b])
		}
		if p.inFree[b] != (p.ref[b] == 0) {
			t.Fatalf("block %d: inFree %v with ref %d", b, p.inFree[b], p.ref[b])
		}
		if p.inFree[b] {
			free++
		}
		if p.hashed[b] {
			hashed++
			found := false
			for x := p.lookup(p.hash[b]); x >= 0; x = p.dup[x] {
				found = found || x == int32(b)
			}
			if !found {
				t.Fatalf("block %d: hashed but not in the hash map", b)
			}
		}
	}
	if free != p.numFree || hashed != p.numHashed {
		t.Fatalf("numFree %d (counted %d), numHashed %d (counted %d)", p.numFree, free, p.numHashed, hashed)
	}
	queued := 0
	for _, r := range e.waiting.q[e.waiting.head:] {
		queued += r.prefillEnd - r.computed
	}
	for _, r := range e.running {
		if r.computed < r.prefillEnd {
			queued += r.prefillEnd - r.computed
		}
	}
	if queued != e.queuedPrefill {
		t.Fatalf("queued prefill %d, counted %d", e.queuedPrefill, queued)
	}
}

func TestRepeatedPromptHitsCacheAndIsFaster(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 16, GPUBlocks: 256}, sink)
	prompt := seq(1, 2000) // 125 full blocks; compute-bound prefill
	r1 := &Request{Prompt: prompt, OutputLen: 4}
	if err := e.Add(r1, 0); err != nil {
		t.Fatal(err)
	}
	now := runUntilIdle(t, e, 0, 0)
	r2 := &Request{Prompt: prompt, OutputLen: 4}
	if err := e.Add(r2, now); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, now, now)
	a, b := r1.Result(), r2.Result()
	if a.CachedTokens != 0 || b.CachedTokens != 1984 {
		t.Fatalf("cached tokens: first %d, second %d; want 0 and 1984", a.CachedTokens, b.CachedTokens)
	}
	if b.TTFT >= a.TTFT {
		t.Fatalf("TTFT of the repeat %v not shorter than the first %v", b.TTFT, a.TTFT)
	}
	l := e.Load()
	if l.PrefixQueries != 4000 || l.PrefixHits != 1984 || l.Finished != 2 || l.GenerationTokens != 8 {
		t.Fatalf("load %+v", l)
	}
	// The same prompt generates the same tokens (greedy-like filler).
	if r1.OutputToken(3) != r2.OutputToken(3) {
		t.Fatal("same prompt generated different tokens")
	}
}

func TestBlockStoredEventsChain(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 64, MaxBatchTokens: 6}, sink)
	prompt := seq(10, 22) // chunks of 6: stores blocks as they fill
	r := &Request{Prompt: prompt, OutputLen: 9}
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, 0, 0)
	var hashes []uint64
	var toks []uint32
	for _, ev := range sink.all() {
		if ev.Kind != kvevents.BlockStored {
			t.Fatalf("unexpected %v", ev.Kind)
		}
		if len(ev.TokenIDs) != len(ev.BlockHashes)*4 || ev.BlockSize != 4 || ev.Medium != "GPU" {
			t.Fatalf("malformed event %+v", ev)
		}
		if len(hashes) == 0 {
			if ev.HasParent {
				t.Fatal("first event has a parent")
			}
		} else if !ev.HasParent || ev.ParentHash != hashes[len(hashes)-1] {
			t.Fatalf("parent %x, want %x", ev.ParentHash, hashes[len(hashes)-1])
		}
		hashes = append(hashes, ev.BlockHashes...)
		toks = append(toks, ev.TokenIDs...)
	}
	// 22 prompt + 9 generated = 31 tokens, of which the first 30 were computed: 7 full blocks.
	if len(hashes) != 7 {
		t.Fatalf("%d blocks stored, want 7", len(hashes))
	}
	want := append(slices.Clone(prompt), r.OutputTokens(nil, 0, 6)...)
	if !slices.Equal(toks, want[:28]) {
		t.Fatalf("event tokens %v, want %v", toks, want[:28])
	}
	// Chain: recomputing with the engine's hash reproduces every hash.
	parent := e.none
	buf := make([]byte, 64)
	for i, h := range hashes {
		parent = blockHash(parent, toks[4*i:4*i+4], buf)
		if parent != h {
			t.Fatalf("block %d: hash %x does not chain (want %x)", i, h, parent)
		}
	}
}

func TestLRUEvictionOrderAndBlockRemoved(t *testing.T) {
	sink := &recSink{}
	// 9 blocks of 4 tokens. Each request: a 9-token prompt = 2 full blocks + 1 partial.
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 9}, sink)
	now := time.Duration(0)
	var reqs []*Request
	for i := 0; i < 3; i++ {
		r := &Request{Prompt: seq(100*(i+1), 9), OutputLen: 1}
		reqs = append(reqs, r)
		if err := e.Add(r, now); err != nil {
			t.Fatal(err)
		}
		now = runUntilIdle(t, e, now, now)
	}
	stored := map[int][]uint64{} // request index → its block hashes
	for i, r := range reqs {
		stored[i] = r.hashes[:2]
	}
	for _, ev := range sink.all() {
		if ev.Kind == kvevents.BlockRemoved {
			t.Fatalf("eviction before the cache was full: %+v", ev)
		}
	}
	// Touch request 0's prefix so it becomes most recently used.
	r := &Request{Prompt: seq(100, 9), OutputLen: 1}
	if err := e.Add(r, now); err != nil {
		t.Fatal(err)
	}
	now = runUntilIdle(t, e, now, now)
	if r.Result().CachedTokens != 8 {
		t.Fatalf("cached %d, want 8", r.Result().CachedTokens)
	}
	// A new request needs 5 blocks: takes the two partial ones, evicts request 1
	// (tail first), then request 2's tail.
	sink.batches = nil
	n := &Request{Prompt: seq(900, 17), OutputLen: 1}
	if err := e.Add(n, now); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, now, now)
	var removed []uint64
	for _, ev := range sink.all() {
		if ev.Kind == kvevents.BlockRemoved {
			removed = append(removed, ev.BlockHashes...)
		}
	}
	want := []uint64{stored[1][1], stored[1][0], stored[2][1]}
	if !slices.Equal(removed, want) {
		t.Fatalf("removed %x, want %x (LRU, tail first)", removed, want)
	}
	// What is left is exactly request 0's blocks, request 2's first block and the new ones.
	got := map[uint64]bool{}
	for _, cb := range e.CachedBlocks(kvevents.TierGPU) {
		got[cb.Hash] = true
	}
	for _, h := range []uint64{stored[0][0], stored[0][1], stored[2][0], n.hashes[0], n.hashes[1], n.hashes[2], n.hashes[3]} {
		if !got[h] {
			t.Fatalf("hash %x missing from the cache", h)
		}
	}
	if len(got) != 7 {
		t.Fatalf("%d cached blocks, want 7", len(got))
	}
}

func TestPreemptionWhenOutOfBlocks(t *testing.T) {
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 20}, nil)
	var reqs []*Request
	for i := 0; i < 6; i++ {
		r := &Request{Prompt: seq(1000*i+1, 10), OutputLen: 30}
		reqs = append(reqs, r)
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	runUntilIdle(t, e, 0, 1<<62)
	l := e.Load()
	if l.Preemptions == 0 {
		t.Fatal("no preemption with 6×40 tokens in 80 slots")
	}
	for _, r := range reqs {
		if !r.Done() || r.Generated() != 30 {
			t.Fatalf("%s: done %v generated %d", r.ID, r.Done(), r.Generated())
		}
	}
	if l.UsedBlocks != 0 || l.KVUsage != 0 || l.QueuedPrefillTokens != 0 {
		t.Fatalf("leftover usage %+v", l)
	}
}

func TestCPUTierReceivesEvictedBlocksAndServesHits(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 4, CPUBlocks: 8}, sink)
	a := &Request{Prompt: seq(1, 9), OutputLen: 1}
	if err := e.Add(a, 0); err != nil {
		t.Fatal(err)
	}
	now := runUntilIdle(t, e, 0, 0)
	b := &Request{Prompt: seq(500, 13), OutputLen: 1} // needs all 4 blocks: evicts a's 2
	if err := e.Add(b, now); err != nil {
		t.Fatal(err)
	}
	now = runUntilIdle(t, e, now, now)
	evs := sink.all()
	// a's blocks: CPU store then GPU remove, tail first.
	var got []string
	for _, ev := range evs {
		if ev.Kind == kvevents.BlockStored && ev.Medium == "CPU" {
			if len(ev.TokenIDs) != 0 || ev.HasParent {
				t.Fatalf("CPU store is a location update, got %+v", ev)
			}
			got = append(got, "cpu+"+hex(ev.BlockHashes[0], a))
		}
		if ev.Kind == kvevents.BlockRemoved {
			got = append(got, ev.Medium+"-"+hex(ev.BlockHashes[0], a))
		}
	}
	want := []string{"cpu+1", "GPU-1", "cpu+0", "GPU-0"}
	if !slices.Equal(got, want) {
		t.Fatalf("events %v, want %v", got, want)
	}
	if n := len(e.CachedBlocks(kvevents.TierCPU)); n != 2 {
		t.Fatalf("%d CPU blocks, want 2", n)
	}
	// a again: both blocks come back from the CPU tier.
	a2 := &Request{Prompt: seq(1, 9), OutputLen: 1}
	if err := e.Add(a2, now); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, now, now)
	if res := a2.Result(); res.CPUCachedTokens != 8 || res.CachedTokens != 0 {
		t.Fatalf("repeat after eviction: %+v", res)
	}
	if e.Load().CPUPrefixHits != 8 {
		t.Fatalf("cpu hits %d", e.Load().CPUPrefixHits)
	}
}

// hex names a's block by index for readable failures ("?" = other request).
func hex(h uint64, a *Request) string {
	for i, x := range a.hashes {
		if x == h {
			return string(rune('0' + i))
		}
	}
	return "?"
}

func TestChunkedPrefillAndFCFS(t *testing.T) {
	e := newTestEngine(t, Config{BlockSize: 16, GPUBlocks: 256, MaxBatchTokens: 64, MaxRunning: 2}, nil)
	long := &Request{ID: "long", Prompt: seq(1, 100), OutputLen: 2}
	s1 := &Request{ID: "s1", Prompt: seq(5000, 10), OutputLen: 2}
	s2 := &Request{ID: "s2", Prompt: seq(6000, 10), OutputLen: 2}
	for _, r := range []*Request{long, s1, s2} {
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
	}
	// Step 1 takes 64 tokens of "long" only (budget), so nothing has a token yet.
	res := e.Step(0, 0)
	if res.Tokens != 64 || long.Generated() != 0 || e.Load().Running != 1 {
		t.Fatalf("step 1: %+v, long generated %d, running %d", res, long.Generated(), e.Load().Running)
	}
	// Step 2: the rest of long (36) and s1 (10) share the budget; s2 waits (MaxRunning 2).
	res = e.Step(res.End, 0)
	if res.Tokens != 46 || long.Generated() != 1 || s1.Generated() != 1 || e.Load().Waiting != 1 {
		t.Fatalf("step 2: %+v, generated %d/%d, waiting %d", res, long.Generated(), s1.Generated(), e.Load().Waiting)
	}
	if long.Result().FirstToken != s1.Result().FirstToken {
		t.Fatal("long and s1 finish prefill in the same step")
	}
	runUntilIdle(t, e, res.End, 0)
	if first := min(long.Result().Finished, s1.Result().Finished); s2.Result().Scheduled < first {
		t.Fatalf("s2 scheduled at %v before a slot freed at %v", s2.Result().Scheduled, first)
	}
}

// A profile carries vLLM's batch defaults for its GPU; an explicit Config
// value wins. The budget shows in how a long prompt is chunked.
func TestProfileBatchDefaults(t *testing.T) {
	l40s, err := LookupProfile("7b-l40s")
	if err != nil {
		t.Fatal(err)
	}
	h100, _ := LookupProfile("8b-h100")
	tiny := profiles["tiny"]
	for _, tc := range []struct {
		name            string
		cfg             Config
		seqs, budget    int
		firstStepTokens int
	}{
		{"l40s", Config{Profile: l40s}, 256, 2048, 2048},
		{"h100", Config{Profile: h100}, 1024, 8192, 5000},
		{"no defaults in the profile", Config{Profile: tiny}, 256, 8192, 5000},
		{"explicit wins", Config{Profile: l40s, MaxRunning: 7, MaxBatchTokens: 3000}, 7, 3000, 3000},
	} {
		tc.cfg.GPUBlocks = 1024
		c := tc.cfg.Defaults()
		if c.MaxRunning != tc.seqs || c.MaxBatchTokens != tc.budget {
			t.Errorf("%s: max running %d, batch tokens %d; want %d, %d", tc.name, c.MaxRunning, c.MaxBatchTokens, tc.seqs, tc.budget)
		}
		e := newTestEngine(t, tc.cfg, nil)
		if err := e.Add(&Request{ID: "r", Prompt: seq(1, 5000), OutputLen: 1}, 0); err != nil {
			t.Fatal(err)
		}
		if res := e.Step(0, 0); res.Tokens != tc.firstStepTokens {
			t.Errorf("%s: first step computed %d tokens, want %d", tc.name, res.Tokens, tc.firstStepTokens)
		}
	}
	bad := l40s
	bad.MaxNumSeqs = -1
	if err := (Config{Profile: bad, MaxRunning: 1}).Defaults().Validate(); err == nil || !containsStr(err.Error(), "batch defaults") {
		t.Errorf("negative profile batch default: %v", err)
	}
}

func TestFusedStepsMatchSingleSteps(t *testing.T) {
	calls := map[int]int{}
	run := func(fused int) ([]Result, [][]kvevents.Event, []time.Duration) {
		sink := &recSink{}
		e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 80, CPUBlocks: 16, MaxFusedSteps: fused, RecordTokenTimes: true}, sink)
		var reqs []*Request
		arrivals := []time.Duration{0, 0, 3 * time.Millisecond, 40 * time.Millisecond, 41 * time.Millisecond}
		for i := range arrivals {
			reqs = append(reqs, &Request{Prompt: seq(1+(i%2)*7, 9+i*5), OutputLen: 20 + 7*i})
		}
		now, next := time.Duration(0), 0
		for steps := 0; next < len(reqs) || !e.Idle(); steps++ {
			for next < len(reqs) && arrivals[next] <= now {
				if err := e.Add(reqs[next], now); err != nil {
					t.Fatal(err)
				}
				next++
			}
			until := time.Duration(1 << 62)
			if next < len(reqs) {
				until = arrivals[next]
			}
			res := e.Step(now, until)
			calls[fused]++
			if res.Steps == 0 {
				now = until
				continue
			}
			now = res.End
			checkInvariants(t, e)
		}
		var out []Result
		for _, r := range reqs {
			out = append(out, r.Result())
		}
		return out, sink.batches, sink.times
	}
	r1, b1, t1 := run(1)
	r2, b2, t2 := run(64)
	if calls[64]*2 > calls[1] {
		t.Fatalf("fusing saved too little: %d calls fused, %d single", calls[64], calls[1])
	}
	for i := range r1 {
		a, b := r1[i], r2[i]
		if a.TTFT != b.TTFT || a.E2E != b.E2E || a.CachedTokens != b.CachedTokens || !slices.Equal(a.TokenTimes, b.TokenTimes) {
			t.Fatalf("request %d differs:\n single %+v\n fused  %+v", i, a, b)
		}
	}
	if len(b1) != len(b2) || !slices.Equal(t1, t2) {
		t.Fatalf("event batches: %d vs %d", len(b1), len(b2))
	}
	for i := range b1 {
		if len(b1[i]) != len(b2[i]) {
			t.Fatalf("batch %d: %d vs %d events", i, len(b1[i]), len(b2[i]))
		}
		for j := range b1[i] {
			x, y := b1[i][j], b2[i][j]
			if x.Kind != y.Kind || !slices.Equal(x.BlockHashes, y.BlockHashes) || !slices.Equal(x.TokenIDs, y.TokenIDs) || x.ParentHash != y.ParentHash {
				t.Fatalf("batch %d event %d differs: %+v vs %+v", i, j, x, y)
			}
		}
	}
}

func TestResetPrefixCache(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 16, CPUBlocks: 4}, sink)
	r := &Request{Prompt: seq(1, 9), OutputLen: 3}
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	e.Step(0, 0)
	if err := e.ResetPrefixCache(0); !errors.Is(err, ErrBusy) {
		t.Fatalf("reset while running: %v, want ErrBusy", err)
	}
	now := runUntilIdle(t, e, 0, 0)
	sink.batches = nil
	if err := e.ResetPrefixCache(now); err != nil {
		t.Fatal(err)
	}
	evs := sink.all()
	if len(evs) != 1 || evs[0].Kind != kvevents.AllBlocksCleared {
		t.Fatalf("events %+v", evs)
	}
	if len(e.CachedBlocks(kvevents.TierGPU)) != 0 || e.Load().CachedBlocks != 0 {
		t.Fatal("cache not empty after reset")
	}
	r2 := &Request{Prompt: seq(1, 9), OutputLen: 1}
	_ = e.Add(r2, now)
	runUntilIdle(t, e, now, now)
	if r2.Result().CachedTokens != 0 {
		t.Fatal("hit after reset")
	}
}

func TestAbortFreesBlocks(t *testing.T) {
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 16}, nil)
	a := &Request{ID: "a", Prompt: seq(1, 9), OutputLen: 40}
	b := &Request{ID: "b", Prompt: seq(50, 9), OutputLen: 3}
	if err := errors.Join(e.Add(a, 0), e.Add(b, 0)); err != nil {
		t.Fatal(err)
	}
	e.Step(0, 0)
	if !e.Abort("a", time.Millisecond) || e.Abort("a", time.Millisecond) {
		t.Fatal("abort should succeed once")
	}
	checkInvariants(t, e)
	runUntilIdle(t, e, time.Millisecond, 0)
	if !a.Result().Aborted || !b.Done() || e.Load().UsedBlocks != 0 {
		t.Fatalf("a %+v b done %v used %d", a.Result(), b.Done(), e.Load().UsedBlocks)
	}
	if err := e.Add(&Request{ID: "a", Prompt: seq(1, 3), OutputLen: 1}, 0); err != nil {
		t.Fatalf("id reuse after abort: %v", err)
	}
}

func TestAddRejectsBadRequests(t *testing.T) {
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 4}, nil)
	cases := []struct {
		r    *Request
		want error
	}{
		{&Request{OutputLen: 1}, ErrBadRequest},
		{&Request{Prompt: seq(1, 2)}, ErrBadRequest},
		{&Request{Prompt: seq(1, 16), OutputLen: 1}, ErrTooLong},
	}
	for _, c := range cases {
		if err := e.Add(c.r, 0); !errors.Is(err, c.want) {
			t.Errorf("Add(%+v) = %v, want %v", c.r, err, c.want)
		}
	}
	_ = e.Add(&Request{ID: "x", Prompt: seq(1, 2), OutputLen: 1}, 0)
	if err := e.Add(&Request{ID: "x", Prompt: seq(1, 2), OutputLen: 1}, 0); !errors.Is(err, ErrDuplicateID) {
		t.Errorf("duplicate id: %v", err)
	}
}

func TestConfigValidateListsEveryProblem(t *testing.T) {
	err := Config{BlockSize: -1, GPUBlocks: -2, CPUBlocks: -1, MaxRunning: -1}.Defaults().Validate()
	if !errors.Is(err, ErrInvalidConfig) {
		t.Fatalf("got %v", err)
	}
	for _, s := range []string{"block size", "gpu blocks", "cpu blocks", "max running"} {
		if !containsStr(err.Error(), s) {
			t.Errorf("error %q does not mention %q", err, s)
		}
	}
	if _, err := LookupProfile("nope"); !errors.Is(err, ErrUnknownProfile) {
		t.Fatal(err)
	}
}

func containsStr(s, sub string) bool {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return true
		}
	}
	return false
}

func TestTimingModelProportions(t *testing.T) {
	for _, name := range ProfileNames() {
		p, _ := LookupProfile(name)
		if !(p.PrefillTime(0, 2000) > p.PrefillTime(0, 1000) && p.PrefillTime(0, 1000) > p.PrefillTime(1000, 100)) {
			t.Errorf("%s: prefill must grow with uncached tokens", name)
		}
		if !(p.PrefillTime(8000, 500) > p.PrefillTime(0, 500)) {
			t.Errorf("%s: prefill must grow with context (attention)", name)
		}
		if !(p.DecodeStepTime(64, 64*1000) > p.DecodeStepTime(8, 8*1000) && p.DecodeStepTime(8, 100000) > p.DecodeStepTime(8, 8000)) {
			t.Errorf("%s: decode must grow with batch and context", name)
		}
	}
	p, _ := LookupProfile("7b-h100")
	// Sanity against published vLLM numbers: ~5–8 ms per decode step at small batch,
	// 1k-token prefill in tens of milliseconds.
	if d := p.DecodeStepTime(1, 1000); d < 4*time.Millisecond || d > 10*time.Millisecond {
		t.Errorf("7b-h100 decode step %v", d)
	}
	if d := p.PrefillTime(0, 1000); d < 20*time.Millisecond || d > 80*time.Millisecond {
		t.Errorf("7b-h100 1k prefill %v", d)
	}
}

func TestDeterministicAndSeeded(t *testing.T) {
	hashes := func(seed uint64) []uint64 {
		sink := &recSink{}
		e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 16, HashSeed: seed}, sink)
		_ = e.Add(&Request{Prompt: seq(1, 9), OutputLen: 5}, 0)
		runUntilIdle(t, e, 0, 0)
		var hs []uint64
		for _, ev := range sink.all() {
			hs = append(hs, ev.BlockHashes...)
		}
		return hs
	}
	if !slices.Equal(hashes(1), hashes(1)) || slices.Equal(hashes(1), hashes(2)) {
		t.Fatal("hashes must be a function of the seed")
	}
}

func TestCacheSaltIsolates(t *testing.T) {
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 32}, nil)
	a := &Request{Prompt: seq(1, 9), OutputLen: 1, CacheSalt: "alice"}
	_ = e.Add(a, 0)
	now := runUntilIdle(t, e, 0, 0)
	b := &Request{Prompt: seq(1, 9), OutputLen: 1, CacheSalt: "bob"}
	_ = e.Add(b, now)
	now = runUntilIdle(t, e, now, now)
	c := &Request{Prompt: seq(1, 9), OutputLen: 1, CacheSalt: "alice"}
	_ = e.Add(c, now)
	runUntilIdle(t, e, now, now)
	if b.CachedTokens() != 0 || c.CachedTokens() != 8 {
		t.Fatalf("salted hits: bob %d alice %d", b.CachedTokens(), c.CachedTokens())
	}
}

// The engine sends a request's salt and LoRA name as vLLM does, in the
// blocks' extra_keys (salt in block 0 only; no cache_salt field), and a
// consumer keying the events gets the keys of the salted LoRA request.
func TestSaltAndLoRAInExtraKeys(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 32}, sink)
	r := &Request{Prompt: seq(1, 17), OutputLen: 1, CacheSalt: "alice", LoraName: "sql"}
	_ = e.Add(r, 0)
	runUntilIdle(t, e, 0, 0)
	var keys []uint64
	parent := map[uint64]uint64{}
	for _, ev := range sink.all() {
		if ev.Kind != kvevents.BlockStored {
			continue
		}
		if ev.CacheSalt != "" {
			t.Fatalf("cache_salt field %q: vLLM has none", ev.CacheSalt)
		}
		first := !ev.HasParent
		want := kvevents.AppendExtraKeys(nil, len(ev.BlockHashes), first, "sql", "alice")
		if !slices.Equal(ev.ExtraKeys, want) {
			t.Fatalf("extra_keys %x, want %x", ev.ExtraKeys, want)
		}
		n := len(ev.TokenIDs) / ev.BlockSize
		ks := kvevents.AppendStoredKeys(nil, "m", &ev, parent[ev.ParentHash], n, ev.BlockSize)
		for i, k := range ks {
			parent[ev.BlockHashes[i]] = k
		}
		keys = append(keys, ks...)
	}
	want := kvevents.AppendKeys(nil, kvevents.Root("m", "sql", "alice"), seq(1, 16), 4)
	if !slices.Equal(keys, want) {
		t.Fatalf("keys %x, want %x", keys, want)
	}
}

func TestPreemptAllThenReset(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 32}, sink)
	a := &Request{Prompt: seq(1, 9), OutputLen: 5}
	b := &Request{Prompt: seq(100, 9), OutputLen: 5}
	if err := errors.Join(e.Add(a, 0), e.Add(b, 0)); err != nil {
		t.Fatal(err)
	}
	now := e.Step(0, 0).End
	e.PreemptAll()
	checkInvariants(t, e)
	if err := e.ResetPrefixCache(now); err != nil {
		t.Fatal(err)
	}
	if e.waiting.front() != a || e.Load().Preemptions != 2 {
		t.Fatal("preempted requests lost their order")
	}
	runUntilIdle(t, e, now, now)
	if a.Generated() != 5 || b.Generated() != 5 || a.Result().Preemptions != 1 {
		t.Fatalf("after reset: %+v %+v", a.Result(), b.Result())
	}
}

// TestGeneratedTokensMatchTheEngine: Config.GeneratedTokens predicts what
// an added request generates, for short and long prompts (the prompt seed
// hashes in chunks of the engine's buffer), other block sizes, samples and
// seeds.
func TestGeneratedTokensMatchTheEngine(t *testing.T) {
	for _, c := range []struct {
		bs, prompt, sample int
		seed               uint64
	}{{16, 10, 0, 0}, {16, 700, 0, 7}, {16, 700, 3, 7}, {512, 1500, 1, 9}} {
		cfg := Config{BlockSize: c.bs, GPUBlocks: 400, HashSeed: c.seed}
		e := newTestEngine(t, cfg, nil)
		r := &Request{Prompt: seq(5, c.prompt), OutputLen: 4, Sample: c.sample}
		if err := e.Add(r, 0); err != nil {
			t.Fatal(err)
		}
		want := r.OutputTokens(nil, 0, 40)
		if got := cfg.GeneratedTokens(nil, r.Prompt, c.sample, 40); !slices.Equal(got, want) {
			t.Errorf("%+v: predicted %v, the engine's %v", c, got[:4], want[:4])
		}
	}
}
