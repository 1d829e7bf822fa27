package pd

import (
	"errors"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/policies"
	"github.com/kvmesh/kvmesh/scheduler/registry"
)

const bs = 16

// eng is a test engine: role, group, load and how many of the request's
// leading blocks it caches on the GPU.
type eng struct {
	id      string
	role    scheduler.Role
	group   string
	running int
	waiting int
	queued  int // queued prefill tokens
	cached  int // leading blocks of the request cached
	tpot    time.Duration
	local   int // this router's in-flight prefill tokens there
	// prefillOnly: a prefill engine that cannot serve a whole request.
	prefillOnly bool
	proto       string  // P/D protocol ("" NIXL, "sglang")
	blocks      int     // GPU KV blocks (0: 30,000)
	kvUsage     float64 // the snapshot's KV usage
	active      int     // this router's in-flight prompt + output tokens there
	kv          int     // of those, the KV beyond the prefixes they matched there
	blockSize   int     // the engine's KV block size (0: unknown)
}

type setup struct {
	prompt  int
	output  int
	engines []eng
}

// route builds a real index holding each engine's cached prefix, a
// scheduler over it and a Router with p, and routes one request. The
// prompt is keyed at bs and, as the ingress keys it, at every other block
// size an engine reports (Request.Chains); an engine's cached blocks are
// of its own size.
func route(t *testing.T, s setup, p Policy) (Plan, error) {
	t.Helper()
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	toks := make([]uint32, s.prompt)
	for i := range toks {
		toks[i] = uint32(1000 + i%7919)
	}
	root := kvevents.Root("m", "", "")
	keys := kvevents.AppendKeys(nil, root, toks, bs)
	var chains []scheduler.Chain
	keysAt := func(size int) []uint64 {
		if size <= 0 || size == bs {
			return keys
		}
		for _, c := range chains {
			if c.BlockSize == size {
				return c.Keys
			}
		}
		chains = append(chains, scheduler.Chain{BlockSize: size, Keys: kvevents.AppendKeys(nil, root, toks, size)})
		return chains[len(chains)-1].Keys
	}
	var es []scheduler.Engine
	for _, e := range s.engines {
		if k := keysAt(e.blockSize); e.cached > 0 {
			idx.Store(e.id, kvevents.TierGPU, k[:min(e.cached, len(k))])
		}
		blocks := e.blocks
		if blocks == 0 {
			blocks = 30000
		}
		es = append(es, scheduler.Engine{ID: e.id, Healthy: true, Model: "m", Role: e.role, Group: e.group,
			Running: e.running, Waiting: e.waiting, QueuedPrefillTokens: e.queued, InFlight: e.running + e.waiting,
			GPUBlocks: blocks, KVUsage: e.kvUsage, LocalActiveTokens: e.active, LocalKVTokens: e.kv, TPOT: e.tpot, LocalPrefillTokens: e.local,
			PrefillOnly: e.prefillOnly, PDProtocol: e.proto, BlockSize: e.blockSize})
	}
	sc := scheduler.DefaultConfig()
	sc.Policy = "kvmesh"
	sched, err := registry.New(sc, idx, nil)
	if err != nil {
		t.Fatal(err)
	}
	r, err := NewRouter(sched, p)
	if err != nil {
		t.Fatal(err)
	}
	out := s.output
	if out == 0 {
		out = 256
	}
	req := scheduler.Request{Keys: keys, BlockSize: bs, Chains: chains, PromptTokens: s.prompt, OutputTokens: out, Model: "m"}
	var plan Plan
	err = r.Route(&req, es, &plan)
	return plan, err
}

func mustPolicy(t *testing.T, c Config) Policy {
	t.Helper()
	p, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

var (
	P = scheduler.RolePrefill
	D = scheduler.RoleDecode
	M = scheduler.RoleMixed
)

func TestKVMeshDecision(t *testing.T) {
	tests := []struct {
		name                    string
		cfg                     Config
		s                       setup
		mode                    Mode
		prefill, decode, reason string
	}{
		{name: "long uncached prompt, busy decode: disaggregate",
			s:    setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 64}}},
			mode: Disaggregated, prefill: "p0", decode: "d0", reason: "disaggregated-cheaper"},
		{name: "prompt cached on the decode engine: aggregated",
			s:    setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 64, cached: 511}}},
			mode: Aggregated, decode: "d0", reason: "aggregated-cheaper"},
		{name: "idle decode engine: local prefill costs no stream, no transfer",
			s:    setup{prompt: 2048, engines: []eng{{id: "p0", role: P, queued: 20000, running: 2}, {id: "d0", role: D}}},
			mode: Aggregated, decode: "d0", reason: "aggregated-cheaper"},
		{name: "prefill queue longer than the stall: aggregated",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P, running: 4, waiting: 60, queued: 400000}, {id: "d0", role: D, running: 4}}},
			mode: Aggregated, decode: "d0", reason: "aggregated-cheaper"},
		{name: "slow network: the transfer outweighs the stall",
			cfg:  Config{TransferGbps: 0.05},
			s:    setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 16}}},
			mode: Aggregated, decode: "d0", reason: "aggregated-cheaper"},
		{name: "pairs only within a group",
			s: setup{prompt: 8192, engines: []eng{{id: "pa", role: P, group: "a"}, {id: "pb", role: P, group: "b", running: 8, queued: 30000},
				{id: "db", role: D, group: "b", running: 64}}},
			mode: Disaggregated, prefill: "pb", decode: "db", reason: "disaggregated-cheaper"},
		{name: "joint choice: the decode engine holding the prefix needs less transfer",
			s: setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 64},
				{id: "d1", role: D, running: 64, cached: 256}}},
			mode: Disaggregated, prefill: "p0", decode: "d1", reason: "disaggregated-cheaper"},
		{name: "no prefill engine",
			s:    setup{prompt: 8192, engines: []eng{{id: "m0", role: M, running: 64}, {id: "m1", role: M, running: 8}}},
			mode: Aggregated, decode: "m1", reason: "aggregated-no-prefill"},
		{name: "always: no bypass on decode engines",
			cfg:  Config{Policy: "kvmesh-always"},
			s:    setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, running: 64, cached: 511}}},
			mode: Disaggregated, prefill: "p0", decode: "d0", reason: "disaggregated-always"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, tc.s, mustPolicy(t, tc.cfg))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Mode != tc.mode || plan.Prefill != tc.prefill || plan.Decode != tc.decode || plan.Reason != tc.reason {
				t.Fatalf("plan %v %q→%q (%s), want %v %q→%q (%s); options %+v", plan.Mode, plan.Prefill, plan.Decode, plan.Reason,
					tc.mode, tc.prefill, tc.decode, tc.reason, plan.Options)
			}
			if len(plan.Options) == 0 || plan.Options[0].Prefill != plan.Prefill || plan.Options[0].Decode != plan.Decode {
				t.Fatalf("options %+v do not start with the plan", plan.Options)
			}
			for i := 1; i < len(plan.Options); i++ {
				if plan.Options[i].Score > plan.Options[i-1].Score {
					t.Fatalf("options not ranked: %+v", plan.Options)
				}
			}
		})
	}
}

func TestEmulations(t *testing.T) {
	tests := []struct {
		name            string
		policy          string
		s               setup
		mode            Mode
		prefill, decode string
		fallbacks       int // options after the first
	}{
		{name: "kthena: no bypass even when the decode engine caches everything", policy: "kthena",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, cached: 255}}},
			mode: Disaggregated, prefill: "p0", decode: "d0"},
		{name: "kthena: best decode by least-request+prefix, then best prefill of its group", policy: "kthena",
			s: setup{prompt: 4096, engines: []eng{{id: "pa", role: P, group: "a", cached: 200}, {id: "pb1", role: P, group: "b", running: 3},
				{id: "pb2", role: P, group: "b", cached: 100}, {id: "da", role: D, group: "a", waiting: 2}, {id: "db", role: D, group: "b", cached: 128}}},
			mode: Disaggregated, prefill: "pb2", decode: "db", fallbacks: 1},
		{name: "llmd: decode hit leaves fewer than 16 uncached tokens: local", policy: "llmd",
			s:    setup{prompt: 4090, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, cached: 255}}},
			mode: Aggregated, decode: "d0"},
		{name: "llmd: otherwise disaggregate, aggregated as the fallback", policy: "llmd",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P}, {id: "p1", role: P, cached: 128}, {id: "d0", role: D, cached: 200}}},
			mode: Disaggregated, prefill: "p1", decode: "d0", fallbacks: 1},
		{name: "dynamo: eff_isl < 2048 and ratio < 0.7: local", policy: "dynamo",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D, cached: 160}}},
			mode: Aggregated, decode: "d0"},
		{name: "dynamo: short but uncached (ratio 1): remote", policy: "dynamo",
			s:    setup{prompt: 1024, engines: []eng{{id: "p0", role: P}, {id: "d0", role: D}}},
			mode: Disaggregated, prefill: "p0", decode: "d0", fallbacks: 1},
		{name: "dynamo: long uncached: remote, prefill worker by overlap", policy: "dynamo",
			s:    setup{prompt: 8192, engines: []eng{{id: "p0", role: P}, {id: "p1", role: P, cached: 300}, {id: "d0", role: D}}},
			mode: Disaggregated, prefill: "p1", decode: "d0", fallbacks: 1},
		{name: "sglang: cache_aware prefill, one decode", policy: "sglang",
			s:    setup{prompt: 4096, engines: []eng{{id: "p0", role: P}, {id: "p1", role: P, cached: 200}, {id: "d0", role: D, running: 3}}},
			mode: Disaggregated, prefill: "p1", decode: "d0"},
		{name: "aibrix: lowest normalized sum", policy: "aibrix",
			s: setup{prompt: 4096, engines: []eng{{id: "p0", role: P, queued: 8000}, {id: "p1", role: P},
				{id: "d0", role: D, running: 1}, {id: "d1", role: D, running: 9}}},
			mode: Disaggregated, prefill: "p1", decode: "d0", fallbacks: 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			plan, err := route(t, tc.s, mustPolicy(t, Config{Policy: tc.policy}))
			if err != nil {
				t.Fatal(err)
			}
			if plan.Mode != tc.mode || plan.Prefill != tc.prefill || plan.Decode != tc.decode {
				t.Fatalf("plan %v %q→%q (%s), want %v %q→%q; options %+v", plan.Mode, plan.Prefill, plan.Decode, plan.Reason,
					tc.mode, tc.prefill, tc.decode, plan.Options)
			}
			if got := len(plan.Options) - 1; got != tc.fallbacks {
				t.Fatalf("%d fallbacks, want %d: %+v", got, tc.fallbacks, plan.Options)
			}
		})
	}
}

func TestNoOption(t *testing.T) {
	for _, name := range []string{"kthena", "sglang", "aibrix"} {
		_, err := route(t, setup{prompt: 1024, engines: []eng{{id: "d0", role: D}}}, mustPolicy(t, Config{Policy: name}))
		if !errors.Is(err, ErrNoOption) {
			t.Errorf("%s without prefill engines: err %v, want ErrNoOption", name, err)
		}
	}
	_, err := route(t, setup{prompt: 1024}, mustPolicy(t, Config{}))
	if !errors.Is(err, ErrNoOption) || !errors.Is(err, scheduler.ErrNoCandidates) {
		t.Errorf("no engines: err %v", err)
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []Config{{Policy: "nope"}, {TransferGbps: -1}, {KVBytesPerToken: -3}, {NonCachedTokens: -1}} {
		if _, err := New(c); !errors.Is(err, scheduler.ErrConfig) {
			t.Errorf("New(%+v): err %v, want ErrConfig", c, err)
		}
	}
	for _, n := range Names {
		p, err := New(Config{Policy: n})
		if err != nil || p.Name() != n {
			t.Errorf("New(%q) = %v, %v", n, p, err)
		}
	}
}

// TestKVMeshSLO: with SLOs, a prefill pool whose queue would miss the TTFT
// objective sends the request aggregated to a decode engine with TPOT
// slack; the router's stall ledger counts the local prefill it sent there,
// so the next such request goes to the other decode engine. Without SLOs
// the same state is priced in seconds: the stall on 48 running streams
// outweighs the prefill queue.
func TestKVMeshSLO(t *testing.T) {
	p := mustPolicy(t, Config{SLOTTFT: 2, SLOTPOT: 0.05})
	s := setup{prompt: 8192, engines: []eng{
		{id: "p0", role: P, running: 1, waiting: 6, local: 7 * 8192},
		{id: "d0", role: D, running: 48, tpot: 30 * time.Millisecond},
		{id: "d1", role: D, running: 48, tpot: 30 * time.Millisecond}}}
	var got []string
	for i := 0; i < 2; i++ {
		plan, err := route(t, s, p)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Mode != Aggregated {
			t.Fatalf("request %d: %v via %q, want aggregated (prefill queue past the TTFT objective)", i, plan.Mode, plan.Prefill)
		}
		got = append(got, plan.Decode)
	}
	if got[0] == got[1] {
		t.Fatalf("both local prefills on %s: the ledger did not price the first", got[0])
	}
	plan, err := route(t, s, mustPolicy(t, Config{}))
	if err != nil {
		t.Fatal(err)
	}
	if plan.Mode != Disaggregated {
		t.Fatalf("no SLO: plan %v, want disaggregated", plan.Mode)
	}
	// That plan needs the local prefill's stall at full weight (at the
	// aggregated policy's stallWeight 0.2 it went aggregated): the P/D step
	// keeps 1 whatever the cost config says.
	c := policies.DefaultKVMeshConfig()
	c.StallWeight = 0.2
	if k := NewKVMesh(policies.KVMeshFrom(c)); k.Cost.StallWeight != 1 {
		t.Fatalf("P/D stallWeight %v, want 1", k.Cost.StallWeight)
	}
}

func TestStallLedger(t *testing.T) {
	l := newStallLedger()
	t0 := time.Unix(1000, 0)
	for i := 0; i < ledgerSize+10; i++ {
		l.add("d", t0.Add(time.Duration(i)*time.Second), 1)
	}
	l.add("d", t0, 0) // nothing to record
	last := t0.Add(time.Duration(ledgerSize+9) * time.Second)
	if got := l.since("d", last.Add(-5500*time.Millisecond)); got != 6 {
		t.Errorf("since 5.5s before the last: %v, want 6", got)
	}
	if got := l.since("d", t0.Add(-time.Hour)); got != ledgerSize {
		t.Errorf("everything kept: %v, want the ring's %d", got, ledgerSize)
	}
	if got := l.since("other", t0); got != 0 {
		t.Errorf("unknown engine: %v", got)
	}
	var nilLedger *stallLedger
	nilLedger.add("d", t0, 1)
	if nilLedger.since("d", t0) != 0 {
		t.Error("nil ledger")
	}
}

// TestOptionsCarryPrefillMatch: every pair option names its own prefill
// engine's matched prefix and cached tokens (not the plan's best), so an
// ingress that moves a leg down the options charges that engine's load
// with its own uncached tokens; aggregated options carry none.
func TestOptionsCarryPrefillMatch(t *testing.T) {
	plan, err := route(t, setup{prompt: 4096, engines: []eng{{id: "p0", role: P, cached: 200}, {id: "p1", role: P, cached: 40},
		{id: "p2", role: P}, {id: "d0", role: D}}}, mustPolicy(t, Config{Policy: "kvmesh-always"}))
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{"p0": 200, "p1": 40, "p2": 0}
	pairs := 0
	for _, o := range plan.Options {
		if o.Prefill == "" {
			if o.PrefillMatch != (index.Match{}) || o.PrefillCached != 0 {
				t.Fatalf("aggregated option %+v carries a prefill match", o)
			}
			continue
		}
		pairs++
		if o.PrefillMatch.GPU != want[o.Prefill] || o.PrefillCached != want[o.Prefill]*bs {
			t.Fatalf("option %+v: prefill match %+v cached %d, want %d blocks", o, o.PrefillMatch, o.PrefillCached, want[o.Prefill])
		}
	}
	if pairs != 3 || plan.Options[0].PrefillMatch != plan.PrefillMatch {
		t.Fatalf("%d pairs, first option %+v, plan's prefill match %+v", pairs, plan.Options[0], plan.PrefillMatch)
	}
}

// TestPairsSpeakOneProtocol: an SGLang prefill server is paired only with
// SGLang decode engines, never with a mixed engine of the same group that
// speaks no SGLang (it would ignore the bootstrap room, prefill the prompt
// again, and the room would pin the prefill engine's KV until its abort
// timeout); the mixed engine stays an aggregated target. With every engine
// on NIXL ("" protocol) the mixed engine still decodes for the prefill
// engine. Every policy, with the mixed engine the lightest and best cached
// (the choice a protocol-blind pairing makes).
func TestPairsSpeakOneProtocol(t *testing.T) {
	engines := func(proto string) []eng {
		return []eng{{id: "p0", role: P, proto: proto, prefillOnly: proto == "sglang"}, {id: "p1", role: P, proto: proto, prefillOnly: proto == "sglang", running: 2},
			{id: "d0", role: D, proto: proto, running: 40, tpot: 45 * time.Millisecond}, {id: "d1", role: D, proto: proto, running: 30, tpot: 45 * time.Millisecond},
			{id: "m0", role: M, cached: 100}}
	}
	pairsWithM0 := func(policy, proto string) (n int, aggregatedM0 bool) {
		t.Helper()
		cfg := Config{Policy: policy, MixedPrefill: true, SLOTTFT: 2, SLOTPOT: 0.05}
		for _, prompt := range []int{512, 4096, 16384} {
			plan, err := route(t, setup{prompt: prompt, output: 64, engines: engines(proto)}, mustPolicy(t, cfg))
			if err != nil {
				t.Fatalf("%s %q: %v", policy, proto, err)
			}
			for _, o := range plan.Options {
				switch {
				case o.Prefill == "" && o.Decode == "m0":
					aggregatedM0 = true
				case o.Prefill != "" && (o.Decode == "m0" || o.Prefill == "m0"):
					n++
				}
			}
		}
		return n, aggregatedM0
	}
	nixl := 0
	for _, policy := range Names {
		n, agg := pairsWithM0(policy, "sglang")
		if n != 0 {
			t.Errorf("%s: %d options pair the SGLang engines with the mixed engine m0", policy, n)
		}
		if m, _ := pairsWithM0(policy, ""); m > 0 {
			nixl++
		}
		if policy == "kvmesh" && !agg {
			t.Errorf("%s: the mixed engine is no aggregated option beside SGLang engines", policy)
		}
	}
	if nixl == 0 {
		t.Fatal("no policy pairs a NIXL prefill engine with the mixed engine")
	}
	// aibrix offers every pair of a group: (p0, m0) and (p1, m0) for each prompt.
	if n, _ := pairsWithM0("aibrix", ""); n != 2*3 {
		t.Fatalf("aibrix: %d NIXL pairs with m0 over three prompts, want 6 (p0 and p1 each)", n)
	}
}

// TestPairsShareABlockSize: vLLM's NixlConnector reads a remote engine's
// blocks only at its own block size (the sim refuses "remote block size 16,
// local 32"), so no policy pairs engines whose sizes are both known and
// differ; an unknown size pairs with any. With no pair left, kvmesh and
// kvmesh-always serve the request aggregated on the decode engine, as when
// no prefill engine exists (tester h-reg8 F1).
func TestPairsShareABlockSize(t *testing.T) {
	tests := []struct {
		name  string
		sizes []int // p0, p1, d0, d1
		pairs bool  // some option pairs; every pair then shares a known size
	}{
		{name: "one size", sizes: []int{16, 16, 16, 16}, pairs: true},
		{name: "unknown sizes", sizes: []int{0, 0, 0, 0}, pairs: true},
		{name: "prefill size unknown", sizes: []int{0, 0, 32, 32}, pairs: true},
		{name: "decode size unknown", sizes: []int{16, 16, 0, 0}, pairs: true},
		{name: "one prefill engine of the decode size", sizes: []int{16, 32, 32, 32}, pairs: true},
		{name: "prefill 16, decode 32", sizes: []int{16, 16, 32, 32}},
		{name: "prefill 32, decode 16", sizes: []int{32, 32, 16, 16}},
	}
	for _, tc := range tests {
		for _, policy := range Names {
			t.Run(tc.name+"/"+policy, func(t *testing.T) {
				engines := []eng{{id: "p0", role: P, blockSize: tc.sizes[0]}, {id: "p1", role: P, blockSize: tc.sizes[1]},
					{id: "d0", role: D, blockSize: tc.sizes[2]}, {id: "d1", role: D, blockSize: tc.sizes[3]}}
				size := map[string]int{}
				for _, e := range engines {
					size[e.id] = e.blockSize
				}
				plan, err := route(t, setup{prompt: 8192, engines: engines}, mustPolicy(t, Config{Policy: policy}))
				pairs := 0
				for _, o := range plan.Options {
					if o.Prefill == "" {
						continue
					}
					pairs++
					if p, d := size[o.Prefill], size[o.Decode]; p > 0 && d > 0 && p != d {
						t.Errorf("option pairs %s (block size %d) with %s (%d)", o.Prefill, p, o.Decode, d)
					}
				}
				switch {
				case tc.pairs && (err != nil || pairs == 0):
					t.Errorf("no pair offered (err %v): %+v", err, plan.Options)
				case !tc.pairs && (policy == "kvmesh" || policy == "kvmesh-always"):
					// Served aggregated, as without prefill engines.
					if err != nil || plan.Mode != Aggregated || plan.Decode == "" || plan.Reason != "aggregated-no-pair" {
						t.Errorf("plan %v %q→%q (%s), err %v: want aggregated-no-pair on a decode engine", plan.Mode, plan.Prefill, plan.Decode, plan.Reason, err)
					}
				case !tc.pairs && err != nil && !errors.Is(err, ErrNoOption):
					t.Errorf("err %v, want nil or ErrNoOption", err)
				}
			})
		}
	}
}
