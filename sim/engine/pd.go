package engine

import "time"

// Prefill/decode disaggregation support. The engine knows nothing about
// side channels or protocols: a prefill leg is a request with HoldBlocks
// (its blocks stay referenced after it finishes, until ReleaseHeld), and a
// decode leg is a request with ExternalTokens (KV the caller already moved
// here). The simulator's HTTP layer (package sim) drives both.

// external is how many tokens past hitTok r's remote KV covers at admission:
// 0 once used (a preempted request recomputes; its transferred blocks
// usually still hit the local cache) and never the last prompt token.
func (e *Engine) external(r *Request, hitTok int) int {
	if r.ExternalTokens == 0 || r.extUsed || r.computed != 0 {
		return 0
	}
	return max(0, min(r.ExternalTokens, len(r.Prompt)-1)-hitTok)
}

// Holding reports whether r finished with HoldBlocks and still holds its
// blocks.
func (r *Request) Holding() bool { return r.holding }

// BlockIDs appends r's block table (the engine's physical block ids, prompt
// order) to dst: what a prefill engine reports as remote_block_ids.
func (r *Request) BlockIDs(dst []int32) []int32 { return append(dst, r.blocks...) }

// ReleaseHeld frees the blocks a finished HoldBlocks request still holds
// (tail first, like any finished request: they keep their hashes and serve
// prefix hits until reused). It reports false when r holds nothing (never
// held, or released already).
func (e *Engine) ReleaseHeld(r *Request) bool {
	if r == nil || !r.holding {
		return false
	}
	delete(e.held, r)
	e.load.HeldRequests--
	e.load.HeldBlocks -= len(r.blocks)
	e.freeBlocks(r)
	r.holding = false
	return true
}

// BlockBytes is the KV size of one block of bs tokens.
func (p Profile) BlockBytes(bs int) float64 { return p.KVBytesPerToken * float64(bs) }

// KVTransferTime is how long moving the KV of blocks blocks of bs tokens
// takes over a link of gbps gigabits per second (10⁹ bit/s): the simulator's
// KV-transfer cost, shared with the discrete-event benchmarks. 0 when gbps
// is not positive.
func (p Profile) KVTransferTime(blocks, bs int, gbps float64) time.Duration {
	if gbps <= 0 || blocks <= 0 {
		return 0
	}
	bytes := p.BlockBytes(bs) * float64(blocks)
	return time.Duration(bytes * 8 / (gbps * 1e9) * float64(time.Second))
}

// PrefixHitBlocks is how many leading blocks of prompt the GPU prefix cache
// holds now (at most (len(prompt)−1)/block size, as an admission would hit):
// what a decode engine need not read from the prefill engine.
func (e *Engine) PrefixHitBlocks(prompt []uint32, lora, salt string) int {
	if len(prompt) == 0 {
		return 0
	}
	r := &Request{Prompt: prompt, LoraName: lora, CacheSalt: salt, numTokens: len(prompt)}
	r.root = rootFor(e.none, lora, salt)
	hits, _ := e.lookup(r)
	return len(hits)
}
