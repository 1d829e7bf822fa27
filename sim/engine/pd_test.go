package engine

import (
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// A prefill leg holds its blocks after finishing; ReleaseHeld frees them
// to the free queue with their hashes (still prefix hits, no BlockRemoved).
func TestHoldBlocksUntilReleased(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 16}, sink)
	r := &Request{ID: "p", Prompt: seq(1, 10), OutputLen: 1, HoldBlocks: true}
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, 0, 0)
	if !r.Done() || !r.Holding() {
		t.Fatalf("done %v holding %v", r.Done(), r.Holding())
	}
	ids := r.BlockIDs(nil)
	if len(ids) != 3 { // 10 prompt tokens in blocks of 4
		t.Fatalf("block ids %v, want 3", ids)
	}
	if l := e.Load(); l.HeldRequests != 1 || l.HeldBlocks != 3 || l.UsedBlocks != 3 {
		t.Fatalf("load %+v", l)
	}
	if err := e.ResetPrefixCache(0); err == nil {
		t.Fatal("reset succeeded while blocks are held")
	}
	if !e.ReleaseHeld(r) || e.ReleaseHeld(r) {
		t.Fatal("ReleaseHeld: want true once, then false")
	}
	checkInvariants(t, e)
	if l := e.Load(); l.HeldRequests != 0 || l.HeldBlocks != 0 || l.UsedBlocks != 0 || l.CachedBlocks != 2 {
		t.Fatalf("after release: %+v", l)
	}
	for _, ev := range sink.all() {
		if ev.Kind == kvevents.BlockRemoved {
			t.Fatalf("release emitted %+v; freed blocks keep their hashes", ev)
		}
	}
}

// ExternalTokens skip the prefill of transferred tokens: the blocks are
// cached (BlockStored with their tokens) at admission, only the last prompt
// token is computed, and the request is faster than a local prefill.
func TestExternalTokensSkipPrefill(t *testing.T) {
	prompt := seq(100, 4000)
	local := newTestEngine(t, Config{BlockSize: 16, GPUBlocks: 512}, nil)
	lr := &Request{ID: "l", Prompt: prompt, OutputLen: 2}
	_ = local.Add(lr, 0)
	runUntilIdle(t, local, 0, 0)

	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 16, GPUBlocks: 512}, sink)
	r := &Request{ID: "d", Prompt: prompt, OutputLen: 2, ExternalTokens: len(prompt)}
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, 0, 0)
	res := r.Result()
	if res.RemoteTokens != len(prompt)-1 || r.CachedTokens() != len(prompt)-1 {
		t.Fatalf("remote tokens %d cached %d, want %d", res.RemoteTokens, r.CachedTokens(), len(prompt)-1)
	}
	if res.TTFT >= lr.Result().TTFT/4 {
		t.Fatalf("TTFT with transferred KV %v not far below local prefill %v", res.TTFT, lr.Result().TTFT)
	}
	stored := 0
	for _, ev := range sink.all() {
		if ev.Kind == kvevents.BlockStored {
			stored += len(ev.BlockHashes)
		}
	}
	if want := (len(prompt) + 1) / 16; stored != want { // prompt + 1 generated token computed into KV
		t.Fatalf("BlockStored blocks %d, want %d", stored, want)
	}
	if l := e.Load(); l.RemoteTokens != uint64(len(prompt)-1) || l.PrefixHits != 0 {
		t.Fatalf("load %+v", l)
	}
	// The transferred blocks serve a later local request.
	r2 := &Request{ID: "again", Prompt: prompt, OutputLen: 1}
	_ = e.Add(r2, time.Second)
	runUntilIdle(t, e, time.Second, time.Second)
	if got := r2.Result().CachedTokens; got != (len(prompt)-1)/16*16 {
		t.Fatalf("follow-up cached %d", got)
	}
}

func TestKVTransferTime(t *testing.T) {
	p := profiles["8b-h100"] // 128 KiB per token
	// 64 blocks of 16 tokens = 128 MiB; at 100 Gbit/s = 12.5 GB/s: 10.7 ms.
	got := p.KVTransferTime(64, 16, 100)
	bytes := 64.0 * 16 * 131072
	want := time.Duration(bytes * 8 / 100e9 * float64(time.Second))
	if got != want || got < 10*time.Millisecond || got > 11*time.Millisecond {
		t.Fatalf("transfer time %v, want %v", got, want)
	}
	if p.KVTransferTime(10, 16, 0) != 0 {
		t.Fatal("0 Gbps should mean no transfer cost")
	}
}
