package engine

import (
	"testing"

	"github.com/kvmesh/kvmesh/kvevents"
)

// TestImportPrefix: imported blocks are announced with BlockStored and a
// request for the same prompt then finds them as prefix hits.
func TestImportPrefix(t *testing.T) {
	sink := &recSink{}
	e := newTestEngine(t, Config{BlockSize: 4, GPUBlocks: 64}, sink)
	prompt := seq(100, 41) // 10 full blocks + 1 token
	if n := e.ImportPrefix(prompt, "", "", 0); n != 10 {
		t.Fatalf("imported %d blocks, want 10", n)
	}
	stored := 0
	for _, ev := range sink.all() {
		if ev.Kind == kvevents.BlockStored {
			stored += len(ev.BlockHashes)
		}
	}
	if stored != 10 {
		t.Fatalf("%d blocks announced, want 10", stored)
	}
	if n := e.ImportPrefix(prompt, "", "", 0); n != 0 {
		t.Fatalf("second import wrote %d blocks, want 0 (cached)", n)
	}
	r := &Request{Prompt: prompt, OutputLen: 2}
	if err := e.Add(r, 0); err != nil {
		t.Fatal(err)
	}
	runUntilIdle(t, e, 0, 0)
	if got := r.Result().CachedTokens; got != 40 {
		t.Fatalf("cached tokens %d, want 40", got)
	}
}
