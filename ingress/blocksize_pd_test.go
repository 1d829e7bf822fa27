package ingress

import (
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/pd"
)

// The prefill leg's load charge is the prompt tokens beyond the prefill
// engine's matched prefix, counted in that engine's own blocks: with the
// prompt keyed per block size its match is (scheduler.Candidate.MatchBlock).
// A block-16 prefill engine matching 500 of a 16,000-token prompt's blocks
// in a model whose most common size is 32 computes 8,000 tokens; it was
// charged 16,000 − 500×32 = 0 (tester h-reg8 F2).
func TestPrefillChargeAtItsOwnBlockSize(t *testing.T) {
	c := &call{block: 32, promptTokens: 16000,
		cands: []scheduler.Engine{{ID: "p16", Role: scheduler.RolePrefill, BlockSize: 16},
			{ID: "d32", Role: scheduler.RoleDecode, BlockSize: 32}, {ID: "d32b", Role: scheduler.RoleDecode, BlockSize: 32}},
		chains: []scheduler.Chain{{BlockSize: 16, Keys: make([]uint64, 1000)}}}
	c.pd.prefill, c.pd.pmatch = "p16", index.Match{GPU: 500, Spec: 500}
	p := &pdState{pending: make(map[string]pendingLoad)}
	c.reservePrefill(p)
	if got := p.pending["p16"].pre; got != 8000 {
		t.Errorf("the block-16 prefill engine is reserved %d prompt tokens, want 8000", got)
	}
	if got := c.prefillLegTokens(); got != 8000 {
		t.Errorf("its leg charges %d prompt tokens, want 8000", got)
	}
	// One block size: the request's.
	c.chains, c.block = nil, 16
	if got := c.prefillLegTokens(); got != 8000 {
		t.Errorf("one block size: the leg charges %d prompt tokens, want 8000", got)
	}
}

// The picker API's speculative index entry for the engine the data plane
// starts on is keyed at that engine's block size, as the proxy's is: an
// entry of the most common size's keys never matched an engine of another
// (tester h-reg8 F5).
func TestPickSpeculativeAtEngineBlockSize(t *testing.T) {
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	const url = "http://127.0.0.1:1" // never dialled: the picker runs no request
	mem := engineList{
		{Engine: scheduler.Engine{ID: "a16", Model: "m", Healthy: true}, URL: url, BlockSize: 16},
		{Engine: scheduler.Engine{ID: "b16", Model: "m", Healthy: true}, URL: url, BlockSize: 16},
		{Engine: scheduler.Engine{ID: "e32", Model: "m", Healthy: true}, URL: url, BlockSize: 32},
	}
	s := startIngress(t, testConfig(StaticEngine{ID: "a16", Model: "m", URL: url}), Deps{Membership: mem, Index: idx})
	toks := make([]uint32, 1024)
	for i := range toks {
		toks[i] = uint32(1 + i*37%30000)
	}
	pk, err := s.Pick(PickInput{Body: []byte(tokenIDsBody(toks, 2))})
	if err != nil {
		t.Fatal(err)
	}
	if err := pk.Start("e32"); err != nil {
		t.Fatal(err)
	}
	pk.Done(200)
	wantSpeculativeAt(t, idx, toks, 32, "e32")
}

// wantSpeculativeAt checks that engine's speculative index entries hold
// the whole prompt toks keyed at its own block size bs.
func wantSpeculativeAt(t *testing.T, idx *index.Index, toks []uint32, bs int, engine string) {
	t.Helper()
	keys := kvevents.AppendKeys(nil, kvevents.Root("m", "", ""), toks, bs)
	var res index.Result
	out := make([]index.Match, 1)
	idx.LookupFor(keys, []string{engine}, &res, out)
	if out[0].Spec != len(keys) {
		t.Errorf("%s's speculative match of the prompt at its block size: %d of %d blocks", engine, out[0].Spec, len(keys))
	}
}

// An SGLang pair whose engines' block size is not the model's most common
// (16 beside three engines of 32): the prefill engine's load is charged
// the prompt tokens beyond its match counted in its own blocks, and the
// decode leg's speculative index entry is keyed at the decode engine's
// size. The charge multiplied its match by 32, and the entry held the
// 32-token keys, which never match a block-16 engine (tester h-reg8 F2, F5).
func TestSGLangPairAtItsOwnBlockSize(t *testing.T) {
	var srv atomic.Pointer[Server] // set before any request: the handler reads it on the engine's goroutine
	charged := make(chan int64, 1)
	p0 := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case charged <- srv.Load().ups.lookup("p0").prefill.Load():
		default:
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"id":"cmpl-p","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":"x","finish_reason":"length"}]}`)
	}))
	t.Cleanup(p0.Close)
	d := startFakePD(t, false)
	idx, err := index.New(index.Config{})
	if err != nil {
		t.Fatal(err)
	}
	// p0 matches the prompt's first two blocks of 16 tokens.
	two := index.Match{GPU: 2, CPU: 2, Other: 2, Spec: 2}
	plan := pd.Plan{Mode: pd.Disaggregated, Prefill: "p0", Decode: "d0", PrefillMatch: two, Policy: "fixed", Reason: "test",
		Options: []pd.Choice{{Prefill: "p0", Decode: "d0", PrefillMatch: two}}}
	pre, dec := sglangPrefillAt("p0", p0.URL), pdEngine("d0", scheduler.RoleDecode, d.url())
	pre.BlockSize, dec.BlockSize = 16, 16
	m := roleMembership{pre, dec}
	for _, id := range []string{"x0", "x1", "x2"} {
		x := pdEngine(id, scheduler.RoleDecode, "http://127.0.0.1:1") // never planned
		x.BlockSize = 32
		m = append(m, x)
	}
	s := startIngress(t, testConfig(), Deps{PD: fixedPlanner{plan}, Membership: m, Index: idx})
	srv.Store(s)
	toks := make([]uint32, 64)
	for i := range toks {
		toks[i] = uint32(1 + i*37%30000)
	}
	st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", tokenIDsBody(toks, 2))
	if st != 200 || hdr.Get("X-Kvmesh-Engine") != "d0" {
		t.Fatalf("status %d engine %q: %s", st, hdr.Get("X-Kvmesh-Engine"), b)
	}
	if got := <-charged; got != 32 {
		t.Errorf("p0 was charged %d prefill tokens during its leg, want 32 (64 beyond its 2 blocks of 16)", got)
	}
	wantSpeculativeAt(t, idx, toks, 16, "d0")
}

// kvCall is a streamed call of s with a 1,024-token prompt whose first
// `shared` tokens are the same for every seed, keyed at 16 (the model's
// most common size) and at 32, among engines e16/d16 (block 16) and
// e32/d32 (block 32).
func kvCall(s *Server, seed, shared int) *call {
	toks := make([]uint32, 1024)
	for i := range toks {
		toks[i] = uint32(1 + i)
		if i >= shared {
			toks[i] = uint32(100000*seed + i)
		}
	}
	c := new(call)
	c.reset()
	c.s, c.start = s, time.Now()
	c.promptTokens, c.block, c.req.stream, c.req.maxTokens = len(toks), 16, true, 20
	root := kvevents.Root("m", "", "")
	c.keys = kvevents.AppendKeys(nil, root, toks, 16)
	c.chains = []scheduler.Chain{{BlockSize: 32, Keys: kvevents.AppendKeys(nil, root, toks, 32)}}
	for _, id := range []string{"e16", "d16", "e32", "d32"} {
		bs := 16
		if id[1:] == "32" {
			bs = 32
		}
		c.cands = append(c.cands, scheduler.Engine{ID: id, Model: "m", Healthy: true, BlockSize: bs})
	}
	return c
}

// The KV a request in flight charges its engine (LocalKVTokens: the
// prompt blocks no other request there holds, its tail and its output)
// and the P/D reservation of its decode leg count that engine's own blocks,
// keyed at its size: two prompts sharing 48 tokens share three blocks of
// 16 but one of 32, so a block-32 engine holds 16 tokens more than a
// block-16 one. Both were counted at the model's most common size (16).
func TestKVChargeAtItsOwnBlockSize(t *testing.T) {
	s := startIngress(t, testConfig(StaticEngine{ID: "e16", Model: "m", URL: "http://127.0.0.1:1"}), Deps{})
	tests := []struct {
		engine, decode string
		want           int // tokens: the first request's 1,024 + 20, the second's unshared blocks + 20
	}{
		{engine: "e16", decode: "d16", want: 1044 + (64-3)*16 + 20},
		{engine: "e32", decode: "d32", want: 1044 + (32-1)*32 + 20},
	}
	for _, tc := range tests {
		t.Run(tc.engine, func(t *testing.T) {
			up, err := s.ups.get(tc.engine, "http://127.0.0.1:1")
			if err != nil {
				t.Fatal(err)
			}
			a, b := kvCall(s, 1, 48), kvCall(s, 2, 48)
			a.engine, b.engine = tc.engine, tc.engine
			a.startAttempt(up, 0)
			b.startAttempt(up, 0)
			if got := up.kvTokens(); got != tc.want {
				t.Errorf("two requests in flight charge %s %d KV tokens, want %d", tc.engine, got, tc.want)
			}
			a.endAttempt(up)
			b.endAttempt(up)
			up.kvMu.Lock()
			refs := len(up.kvRefs)
			up.kvMu.Unlock()
			if up.kvTokens() != 0 || refs != 0 {
				t.Errorf("after both ended: %d KV tokens, %d blocks still charged", up.kvTokens(), refs)
			}

			// The decode leg's reservation, with the first request in
			// flight on the decode engine.
			dup, err := s.ups.get(tc.decode, "http://127.0.0.1:1")
			if err != nil {
				t.Fatal(err)
			}
			a.engine = tc.decode
			a.startAttempt(dup, 0)
			defer a.endAttempt(dup)
			b.pd.plan.Decode = tc.decode
			p := &pdState{pending: make(map[string]pendingLoad)}
			b.reserve(p)
			if got, want := p.pending[tc.decode].kv, tc.want-1044; got != want {
				t.Errorf("the decode leg reserves %d KV tokens on %s, want %d", got, tc.decode, want)
			}
		})
	}
}
