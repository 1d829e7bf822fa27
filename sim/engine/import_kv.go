package engine

import "time"

// ImportPrefix stores the full blocks of prompt in the GPU prefix cache as
// if their KV had just been written by a remote engine (a P/D decode engine
// reading a prefill engine's blocks), emitting the BlockStored events vLLM
// emits for them. Blocks already cached are kept (and refreshed); new ones
// take free blocks, evicting the least recently used, and stop when none is
// free. The blocks end at the most-recently-used end of the free queue, so
// a request added right after ImportPrefix finds them as prefix hits and
// computes only its last partial block. It returns how many blocks were
// written (not already cached). Call it between Steps, from the owner.
func (e *Engine) ImportPrefix(prompt []uint32, loraName, cacheSalt string, now time.Duration) int {
	n := (len(prompt) - 1) / e.bs // at most what a lookup can hit
	if n <= 0 {
		return 0
	}
	r := &Request{Prompt: prompt, LoraName: loraName, CacheSalt: cacheSalt}
	r.root = rootFor(e.none, loraName, cacheSalt)
	r.numTokens = len(prompt)
	r.blocks = make([]int32, 0, n)
	e.resetEvents()
	written := 0
	for j := 0; j < n; j++ {
		if b := e.pool.lookup(e.hashOf(r, j)); b >= 0 {
			e.pool.touch(b)
			r.blocks = append(r.blocks, b)
			continue
		}
		if e.pool.numFree == 0 {
			break
		}
		r.blocks = append(r.blocks, e.popBlock())
		written++
	}
	e.cacheBlocks(r, len(r.blocks)*e.bs)
	e.freeBlocks(r)
	e.flushEvents(now)
	return written
}
