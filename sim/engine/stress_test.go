package engine

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// mirror replays KV events the way a sidecar does (reference counts per tier
// and hash) so the event stream can be compared with the engine's own cache.
type mirror struct {
	count [kvevents.NumTiers]map[uint64]int
	t     *testing.T
}

func newMirror(t *testing.T) *mirror {
	m := &mirror{t: t}
	for i := range m.count {
		m.count[i] = map[uint64]int{}
	}
	return m
}

func (m *mirror) KVEvents(_ time.Duration, evs []kvevents.Event) {
	for _, ev := range evs {
		tier := ev.Tier()
		switch ev.Kind {
		case kvevents.BlockStored:
			for _, h := range ev.BlockHashes {
				m.count[tier][h]++
			}
		case kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if m.count[tier][h] <= 0 {
					m.t.Fatalf("BlockRemoved(%s) of %x that was never stored", tier, h)
				}
				m.count[tier][h]--
				if m.count[tier][h] == 0 {
					delete(m.count[tier], h)
				}
			}
		case kvevents.AllBlocksCleared:
			for i := range m.count {
				clear(m.count[i])
			}
		}
	}
}

// runRandomWorkload drives an engine with a random mix of shared-prefix
// arrivals, aborts and resets, checking invariants after every step and the
// event stream against the engine's cache at the end.
func runRandomWorkload(t *testing.T, seed uint64, steps int) {
	rng := rand.New(rand.NewPCG(seed, seed^0xabcdef))
	m := newMirror(t)
	cfg := Config{
		BlockSize: 1 + rng.IntN(8), GPUBlocks: 16 + rng.IntN(64), CPUBlocks: rng.IntN(32),
		MaxRunning: 1 + rng.IntN(8), MaxBatchTokens: 4 + rng.IntN(64), MaxFusedSteps: 1 + rng.IntN(16),
		Profile: profiles["tiny"], HashSeed: seed, KeepBlockTokens: true,
	}
	e, err := New(cfg, m)
	if err != nil {
		t.Fatal(err)
	}
	maxLen := cfg.GPUBlocks * cfg.BlockSize
	var reqs []*Request
	now := time.Duration(0)
	for i := 0; i < steps; i++ {
		switch op := rng.IntN(10); {
		case op < 4: // arrival: one of 4 shared prefixes + a random tail
			n := 1 + rng.IntN(max(1, maxLen/3))
			p := make([]uint32, n)
			base := uint32(rng.IntN(4)) * 1000
			for j := range p {
				if j < n/2 {
					p[j] = base + uint32(j)
				} else {
					p[j] = uint32(rng.IntN(50))
				}
			}
			r := &Request{Prompt: p, OutputLen: 1 + rng.IntN(max(1, maxLen-n))}
			if err := e.Add(r, now); err != nil {
				t.Fatalf("add: %v", err)
			}
			reqs = append(reqs, r)
		case op == 4 && len(reqs) > 0: // abort
			e.Abort(reqs[rng.IntN(len(reqs))].ID, now)
		case op == 5 && e.Idle():
			if err := e.ResetPrefixCache(now); err != nil {
				t.Fatalf("reset while idle: %v", err)
			}
		default:
			until := now + time.Duration(rng.IntN(20))*time.Millisecond
			res := e.Step(now, until)
			if res.Steps > 0 {
				now = res.End
			}
		}
		checkInvariants(t, e)
	}
	runUntilIdle(t, e, now, now+time.Hour)
	for _, r := range reqs {
		if !r.Done() || (!r.aborted && r.Generated() != r.OutputLen) {
			t.Fatalf("%s: done %v aborted %v generated %d of %d", r.ID, r.Done(), r.aborted, r.Generated(), r.OutputLen)
		}
	}
	for _, tier := range []kvevents.Tier{kvevents.TierGPU, kvevents.TierCPU} {
		var got, want []uint64
		for _, b := range e.CachedBlocks(tier) {
			want = append(want, b.Hash)
		}
		copies := 0
		for h, c := range m.count[tier] {
			got = append(got, h)
			copies += c
		}
		slices.Sort(got)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Fatalf("%s: events say %d hashes, engine has %d", tier, len(got), len(want))
		}
		if tier == kvevents.TierGPU && copies != e.pool.numHashed {
			t.Fatalf("events count %d GPU copies, engine holds %d", copies, e.pool.numHashed)
		}
	}
}

func TestRandomWorkloadsKeepEventsAndCacheInSync(t *testing.T) {
	for seed := uint64(1); seed <= 20; seed++ {
		runRandomWorkload(t, seed, 300)
	}
}

func FuzzEngineWorkload(f *testing.F) {
	for _, s := range []uint64{1, 2, 3, 99} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, seed uint64) { runRandomWorkload(t, seed, 300) })
}

// TestRandomFusedEqualsSingleSteps: for random configurations and arrival
// schedules, fusing decode steps changes nothing observable — per-request
// timings, token times and the timed event stream are identical.
func TestRandomFusedEqualsSingleSteps(t *testing.T) {
	type timedEvent struct {
		at   time.Duration
		kind kvevents.EventKind
		tier kvevents.Tier
		h    uint64
	}
	for seed := uint64(1); seed <= 40; seed++ {
		rng := rand.New(rand.NewPCG(seed, 77))
		base := Config{
			BlockSize: 1 + rng.IntN(8), GPUBlocks: 32 + rng.IntN(64), CPUBlocks: rng.IntN(16),
			MaxRunning: 1 + rng.IntN(8), MaxBatchTokens: 8 + rng.IntN(64),
			Profile: profiles["tiny"], HashSeed: seed, RecordTokenTimes: true,
		}
		type arrival struct {
			at     time.Duration
			prompt []uint32
			out    int
		}
		var arrivals []arrival
		maxLen := base.GPUBlocks * base.BlockSize
		at := time.Duration(0)
		for i := 0; i < 40; i++ {
			at += time.Duration(rng.IntN(30)) * time.Millisecond
			n := 1 + rng.IntN(maxLen/4)
			p := make([]uint32, n)
			for j := range p {
				p[j] = uint32(rng.IntN(3)*100 + min(j, 5+rng.IntN(40)))
			}
			arrivals = append(arrivals, arrival{at, p, 1 + rng.IntN(maxLen/2)})
		}
		run := func(fused int) ([]Result, []timedEvent) {
			var evs []timedEvent
			sink := sinkFunc(func(now time.Duration, batch []kvevents.Event) {
				for _, ev := range batch {
					for _, h := range ev.BlockHashes {
						evs = append(evs, timedEvent{now, ev.Kind, ev.Tier(), h})
					}
					if ev.Kind == kvevents.AllBlocksCleared {
						evs = append(evs, timedEvent{now, ev.Kind, 0, 0})
					}
				}
			})
			cfg := base
			cfg.MaxFusedSteps = fused
			e, err := New(cfg, sink)
			if err != nil {
				t.Fatal(err)
			}
			reqs := make([]*Request, len(arrivals))
			now, next := time.Duration(0), 0
			for next < len(arrivals) || !e.Idle() {
				for next < len(arrivals) && arrivals[next].at <= now {
					reqs[next] = &Request{Prompt: arrivals[next].prompt, OutputLen: arrivals[next].out}
					if err := e.Add(reqs[next], now); err != nil {
						t.Fatal(err)
					}
					next++
				}
				until := time.Duration(1 << 62)
				if next < len(arrivals) {
					until = arrivals[next].at
				}
				res := e.Step(now, until)
				if res.Steps == 0 {
					now = until
					continue
				}
				now = res.End
			}
			out := make([]Result, len(reqs))
			for i, r := range reqs {
				out[i] = r.Result()
			}
			return out, evs
		}
		r1, e1 := run(1)
		r2, e2 := run(1 + int(seed%40))
		for i := range r1 {
			a, b := r1[i], r2[i]
			if a.TTFT != b.TTFT || a.E2E != b.E2E || a.CachedTokens != b.CachedTokens || a.Preemptions != b.Preemptions || !slices.Equal(a.TokenTimes, b.TokenTimes) {
				t.Fatalf("seed %d request %d:\n single %+v\n fused  %+v", seed, i, a, b)
			}
		}
		if !slices.Equal(e1, e2) {
			t.Fatalf("seed %d: event streams differ (%d vs %d events)", seed, len(e1), len(e2))
		}
	}
}

type sinkFunc func(time.Duration, []kvevents.Event)

func (f sinkFunc) KVEvents(now time.Duration, evs []kvevents.Event) { f(now, evs) }
