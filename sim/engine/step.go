package engine

import (
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// StepResult describes the work one Step call did.
type StepResult struct {
	Start  time.Duration // now as passed in
	End    time.Duration // when the engine is free again = when the next step is due
	Steps  int           // engine steps executed (0 when idle or blocked)
	Tokens int           // tokens computed (prefill + decode)
	// Finished lists requests that completed during the call, in order. The
	// slice is reused by the next Step; the requests themselves stay valid.
	Finished []*Request
}

// Step runs the engine from time now: it schedules a batch exactly as vLLM's
// v1 scheduler does (running requests first, in order, each taking its next
// chunk within the token budget, preempting the most recently admitted request
// when blocks run out; then, if nobody was preempted, waiting requests in FCFS
// order while sequences, budget and blocks allow), emits that step's KV events,
// and advances every scheduled request by the step's modelled duration.
//
// When every running request is decoding and no waiting request could be
// admitted, Step fuses consecutive decode steps (up to Config.MaxFusedSteps,
// never past a request's last token) as long as each fused step starts before
// until, so the caller pays per event rather than per token. Pass the time of
// your next external input (an arrival, an abort) as until, or now to run
// exactly one step. Results, events and timings are identical either way; only
// the number of calls differs.
//
// Call Step again at End. When the engine is idle it returns Steps == 0 and
// End == now: wait for the next Add.
func (e *Engine) Step(now, until time.Duration) StepResult {
	e.finished = e.finished[:0]
	if e.Idle() {
		return StepResult{Start: now, End: now}
	}
	if k := e.fusable(now, until); k > 1 {
		return e.stepFused(now, until, k)
	}
	return e.stepOne(now)
}

func (e *Engine) stepOne(now time.Duration) StepResult {
	e.resetEvents()
	e.sched = e.sched[:0]
	budget := e.cfg.MaxBatchTokens
	var w stepWork
	preempted := false
	for i := 0; i < len(e.running) && budget > 0; i++ {
		r := e.running[i]
		n := min(r.numTokens-r.computed, budget)
		if n <= 0 {
			continue
		}
		ok := true
		for !e.allocate(r, nil, 0, n) {
			victim := e.running[len(e.running)-1]
			e.running = e.running[:len(e.running)-1]
			e.preempt(victim)
			preempted = true
			if victim == r {
				ok = false
				break
			}
		}
		if !ok {
			break
		}
		e.schedule(r, n, now, &w)
		budget -= n
	}
	if !preempted {
		for e.waiting.len() > 0 && len(e.running) < e.cfg.MaxRunning && budget > 0 {
			r := e.waiting.front()
			hits, cpuHits := e.lookup(r)
			hitTok := (len(hits) + cpuHits) * e.bs
			ext := e.external(r, hitTok)
			n := min(r.numTokens-hitTok-ext, budget)
			if !e.allocate(r, hits, cpuHits, ext+n) {
				break // FCFS: the head waits for blocks; nobody overtakes it
			}
			e.waiting.popFront()
			if !r.looked {
				r.looked = true
				r.cachedTokens, r.cpuTokens, r.remoteTokens = len(hits)*e.bs, cpuHits*e.bs, ext
				e.load.PrefixQueries += uint64(r.numTokens)
				e.load.PrefixHits += uint64(r.cachedTokens)
				e.load.CPUPrefixHits += uint64(r.cpuTokens)
				e.load.RemoteTokens += uint64(ext)
				e.load.PromptTokens += uint64(len(r.Prompt))
			}
			r.extUsed = r.extUsed || r.ExternalTokens > 0
			e.queuedPrefill -= hitTok + ext
			r.computed, r.nCached = hitTok+ext, len(hits)
			r.state = stateRunning
			e.running = append(e.running, r)
			w.loadTokens += cpuHits * e.bs
			if ext > 0 {
				e.cacheBlocks(r, r.computed) // the transferred blocks enter the prefix cache
			}
			e.schedule(r, n, now, &w)
			budget -= n
		}
	}
	e.flushEvents(now)
	if len(e.sched) == 0 {
		return StepResult{Start: now, End: now}
	}
	end := now + e.cfg.Profile.stepTime(&w)
	for _, s := range e.sched {
		r := s.r
		r.computed += s.n
		if r.computed >= r.numTokens {
			e.emitTokens(r, 1, now, end)
		}
	}
	e.compactRunning()
	e.load.Steps++
	return StepResult{Start: now, End: end, Steps: 1, Tokens: w.tokens, Finished: e.finished}
}

// schedule adds n tokens of r to the step: caches its newly full blocks (the
// BlockStored event, at schedule time as vLLM does) and accounts the work.
func (e *Engine) schedule(r *Request, n int, now time.Duration, w *stepWork) {
	c := r.computed
	if c < r.prefillEnd {
		e.queuedPrefill -= n
	}
	e.cacheBlocks(r, c+n)
	w.seqs++
	w.tokens += n
	w.attnPairs += float64(n) * (float64(c) + float64(n+1)/2)
	w.ctxTokens += float64(c + n)
	e.sched = append(e.sched, scheduled{r, n})
	if !r.wasScheduled {
		r.wasScheduled, r.scheduled = true, now
	}
}

// emitTokens records k sampled tokens of r, the last at end; with
// RecordTokenTimes the per-token times come from e.stepDur (fused) or end.
func (e *Engine) emitTokens(r *Request, k int, start, end time.Duration) {
	if r.generated == 0 {
		r.firstToken = end
	}
	if e.cfg.RecordTokenTimes {
		if k == 1 {
			r.tokenTimes = append(r.tokenTimes, end)
		} else {
			r.tokenTimes = append(r.tokenTimes, e.stepDur[:k]...)
		}
	}
	r.generated += k
	r.numTokens += k
	r.lastToken = end
	e.load.GenerationTokens += uint64(k)
	if r.generated >= r.OutputLen {
		if r.HoldBlocks {
			r.holding = true
			e.held[r] = struct{}{}
			e.load.HeldRequests++
			e.load.HeldBlocks += len(r.blocks)
		} else {
			e.freeBlocks(r)
		}
		r.state = stateDone
		r.finished = end
		delete(e.active, r.ID)
		e.finished = append(e.finished, r)
		e.load.Finished++
	}
}

func (e *Engine) compactRunning() {
	j := 0
	for _, r := range e.running {
		if r.state == stateRunning {
			e.running[j] = r
			j++
		}
	}
	clear(e.running[j:])
	e.running = e.running[:j]
}

// fusable returns how many decode steps may be fused from now (1 = don't).
func (e *Engine) fusable(now, until time.Duration) int {
	if e.cfg.MaxFusedSteps <= 1 || until <= now || len(e.running) == 0 {
		return 1
	}
	if len(e.running) > e.cfg.MaxBatchTokens {
		return 1
	}
	if e.waiting.len() > 0 && len(e.running) < e.cfg.MaxRunning && e.headFits() {
		return 1 // the next step admits someone
	}
	k := e.cfg.MaxFusedSteps
	for _, r := range e.running {
		// Decoding = prefill done and one sampled token to compute. A chunked
		// prefill with one prompt token left also has one token to compute,
		// but it is not decoding (it produces the first token).
		if r.numTokens-r.computed != 1 || r.computed < r.prefillEnd {
			return 1
		}
		k = min(k, r.OutputLen-r.generated)
	}
	if k <= 1 {
		return 1
	}
	need := 0
	for _, r := range e.running {
		need += (r.computed+k+e.bs-1)/e.bs - len(r.blocks)
	}
	if need > e.pool.numFree {
		return 1 // a fused step could preempt: take them one at a time
	}
	return k
}

// headFits reports whether the head of the waiting queue could be admitted
// next to the running decodes now. If it cannot, it cannot during a fused
// window either: decodes only take blocks (numFree falls), evictions only
// turn the head's hits into misses or CPU hits (it needs more), the budget
// left after the decodes is constant, and no request finishes inside the
// window — so admission stays impossible and fusing is exact.
func (e *Engine) headFits() bool {
	budget := e.cfg.MaxBatchTokens - len(e.running)
	if budget <= 0 {
		return false
	}
	r := e.waiting.front()
	hits, cpuHits := e.lookup(r)
	hitTok := (len(hits) + cpuHits) * e.bs
	ext := e.external(r, hitTok)
	n := min(r.numTokens-hitTok-ext, budget)
	need := (hitTok+ext+n+e.bs-1)/e.bs - len(hits)
	evictable := 0
	for _, b := range hits {
		if e.pool.ref[b] == 0 {
			evictable++
		}
	}
	return need <= e.pool.numFree-evictable
}

// stepFused runs k (or fewer, see until) decode-only steps. Per-sequence work
// happens only at block boundaries, found through buckets of the sequences'
// phase within a block; events are flushed per step like stepOne does.
func (e *Engine) stepFused(now, until time.Duration, k int) StepResult {
	n := len(e.running)
	ctx0 := 0
	for _, r := range e.running {
		ctx0 += r.computed + 1
	}
	e.stepDur = e.stepDur[:0]
	t := now
	for j := 0; j < k; j++ {
		if j > 0 && t >= until {
			break
		}
		ctx := float64(ctx0 + j*n)
		w := stepWork{seqs: n, tokens: n, attnPairs: ctx, ctxTokens: ctx}
		t += e.cfg.Profile.stepTime(&w)
		e.stepDur = append(e.stepDur, t) // end of step j
	}
	k = len(e.stepDur)
	for p := range e.phase {
		e.phase[p] = e.phase[p][:0]
	}
	for _, r := range e.running {
		p := r.computed % e.bs
		e.phase[p] = append(e.phase[p], r)
	}
	e.resetEvents()
	for j := 0; j < k; j++ {
		start := now
		if j > 0 {
			start = e.stepDur[j-1]
		}
		// Token computed in step j is r.computed+j; it needs a new block when
		// that is a multiple of bs and fills one when the next index is.
		pAlloc := (e.bs - j%e.bs) % e.bs
		pFull := ((e.bs-1-j)%e.bs + e.bs) % e.bs
		e.fusedBoundary(pAlloc, pFull, j)
		e.flushEvents(start)
	}
	end := e.stepDur[k-1]
	for _, r := range e.running {
		r.computed += k
		e.emitTokens(r, k, now, end)
	}
	e.compactRunning()
	e.load.Steps += uint64(k)
	return StepResult{Start: now, End: end, Steps: k, Tokens: k * n, Finished: e.finished}
}

// fusedBoundary does step j's block work for the sequences of the two phase
// buckets, merged back into running order (bucket order is running order, so
// comparing the requests' positions is by a merge over the two lists).
func (e *Engine) fusedBoundary(pAlloc, pFull, j int) {
	a, f := e.phase[pAlloc], e.phase[pFull]
	if pAlloc == pFull {
		f = nil
	}
	do := func(r *Request) {
		t := r.computed + j
		if need := (t + 1 + e.bs - 1) / e.bs; need > len(r.blocks) {
			r.blocks = append(r.blocks, e.popBlock())
		}
		if (t+1)%e.bs == 0 {
			e.cacheBlocks(r, t+1)
		}
	}
	// Both buckets hold requests in running order; merge by arrival in
	// e.running, which we find by walking it once when both are non-empty.
	if len(a) == 0 || len(f) == 0 {
		for _, r := range a {
			do(r)
		}
		for _, r := range f {
			do(r)
		}
		return
	}
	i, m := 0, 0
	for _, r := range e.running {
		if i < len(a) && a[i] == r {
			do(r)
			i++
		} else if m < len(f) && f[m] == r {
			do(r)
			m++
		}
		if i == len(a) && m == len(f) {
			break
		}
	}
}

// lookup finds r's prefix hits: leading blocks cached on the GPU, then the
// following ones in the CPU tier. At most (numTokens−1)/bs blocks hit, so at
// least one token is computed (vLLM's max_cache_hit_length).
func (e *Engine) lookup(r *Request) ([]int32, int) {
	hits := e.hitBuf[:0]
	if r.computed != 0 {
		return hits, 0
	}
	maxBlocks := (r.numTokens - 1) / e.bs
	j := 0
	for ; j < maxBlocks; j++ {
		b := e.pool.lookup(e.hashOf(r, j))
		if b < 0 {
			break
		}
		hits = append(hits, b)
	}
	e.hitBuf = hits
	cpuHits := 0
	if e.cpu != nil {
		for ; j < maxBlocks && e.cpu.contains(e.hashOf(r, j)); j++ {
			cpuHits++
		}
	}
	return hits, cpuHits
}

// allocate gives r the blocks for its hits plus n more tokens, or reports
// false without changing anything (vLLM's allocate_slots returning None).
func (e *Engine) allocate(r *Request, hits []int32, cpuHits, n int) bool {
	total := r.computed + (len(hits)+cpuHits)*e.bs + n
	need := (total+e.bs-1)/e.bs - len(r.blocks) - len(hits)
	evictable := 0
	for _, b := range hits {
		if e.pool.ref[b] == 0 {
			evictable++
		}
	}
	if need > e.pool.numFree-evictable {
		return false
	}
	for _, b := range hits {
		e.pool.touch(b)
		r.blocks = append(r.blocks, b)
	}
	if e.cpu != nil {
		for j := len(hits); j < len(hits)+cpuHits; j++ {
			e.cpu.touch(e.hashOf(r, j))
		}
	}
	for i := 0; i < need; i++ {
		r.blocks = append(r.blocks, e.popBlock())
	}
	return true
}

// popBlock takes the least recently used free block, evicting its cached
// hash (to the CPU tier when there is one). The caller checked numFree.
func (e *Engine) popBlock() int32 {
	p := e.pool
	b := p.front()
	p.unlink(b)
	if p.hashed[b] {
		h := p.hash[b]
		if e.cpu != nil {
			e.offload(b, h)
		}
		p.unhash(b)
		e.emitRemoved(h, e.cfg.Medium)
	}
	p.ref[b] = 1
	return b
}

// offload copies GPU block b (hash h) into the CPU tier. The CPU BlockStored
// is emitted before the GPU BlockRemoved so a consumer resolving the hash
// through its hash → key map still knows it.
func (e *Engine) offload(b int32, h uint64) {
	slot, evicted, didEvict := e.cpu.insert(h)
	if didEvict {
		e.emitRemoved(evicted, "CPU")
	}
	if slot < 0 {
		return
	}
	p, c := e.pool, e.cpu
	if c.keep {
		c.parent[slot], c.hasParent[slot] = p.parent[b], p.hasParent[b]
		copy(c.toks[int(slot)*c.bs:int(slot+1)*c.bs], p.blockTokens(b))
		c.extra[slot] = p.extra[b]
	}
	if c.key != nil {
		c.key[slot] = p.key[b]
	}
	if e.sink != nil {
		hs := len(e.hashBuf)
		e.hashBuf = append(e.hashBuf, h)
		e.events = append(e.events, kvevents.Event{Kind: kvevents.BlockStored,
			BlockHashes: e.hashBuf[hs:len(e.hashBuf):len(e.hashBuf)], BlockSize: e.bs, Medium: "CPU"})
	}
}

// cacheBlocks registers r's full blocks below token upto in the prefix cache
// and emits one BlockStored for the new ones (vLLM's cache_full_blocks).
func (e *Engine) cacheBlocks(r *Request, upto int) {
	nFull := upto / e.bs
	if nFull <= r.nCached {
		return
	}
	p := e.pool
	hs, ts := len(e.hashBuf), len(e.tokBuf)
	first := -1
	for j := r.nCached; j < nFull; j++ {
		h := e.hashOf(r, j)
		b := r.blocks[j]
		if p.hashed[b] {
			continue // a prefix hit, cached already
		}
		if first < 0 {
			first = j
		}
		p.setHash(b, h)
		if p.key != nil {
			p.key[b] = e.keyOf(r, j)
		}
		if p.keep {
			p.parent[b], p.hasParent[b] = 0, j > 0
			if j > 0 {
				p.parent[b] = r.hashes[j-1]
			}
			r.appendTokens(p.blockTokens(b)[:0], j*e.bs, (j+1)*e.bs)
			p.extra[b] = extraKeys{lora: r.LoraName, salt: r.CacheSalt}
		}
		if e.sink != nil {
			e.hashBuf = append(e.hashBuf, h)
			e.tokBuf = r.appendTokens(e.tokBuf, j*e.bs, (j+1)*e.bs)
		}
	}
	r.nCached = nFull
	if e.sink == nil || first < 0 {
		return
	}
	ev := kvevents.Event{Kind: kvevents.BlockStored,
		BlockHashes: e.hashBuf[hs:len(e.hashBuf):len(e.hashBuf)],
		TokenIDs:    e.tokBuf[ts:len(e.tokBuf):len(e.tokBuf)],
		BlockSize:   e.bs, Medium: e.cfg.Medium, LoraName: r.LoraName}
	if first > 0 {
		ev.ParentHash, ev.HasParent = r.hashes[first-1], true
	}
	if r.LoraName != "" || first == 0 && r.CacheSalt != "" {
		// As vLLM: the LoRA name in every block's extra keys, the salt in the
		// request's first block's (there is no cache_salt field). Plain
		// requests send none, as vLLM before extra_keys.
		xs := len(e.extraBuf)
		e.extraBuf = kvevents.AppendExtraKeys(e.extraBuf, len(ev.BlockHashes), first == 0, r.LoraName, r.CacheSalt)
		ev.ExtraKeys = e.extraBuf[xs:len(e.extraBuf):len(e.extraBuf)]
	}
	e.events = append(e.events, ev)
}

// hashOf returns the engine hash of r's block j, extending r's hash chain.
func (e *Engine) hashOf(r *Request, j int) uint64 {
	for len(r.hashes) <= j {
		k := len(r.hashes)
		parent := r.root
		if k > 0 {
			parent = r.hashes[k-1]
		}
		toks := r.appendTokens(e.blockBuf[:0], k*e.bs, (k+1)*e.bs)
		r.hashes = append(r.hashes, blockHash(parent, toks, e.byteBuf))
	}
	return r.hashes[j]
}

// keyOf returns Config.Keyer's key of r's block j, extending r's key chain.
func (e *Engine) keyOf(r *Request, j int) uint64 {
	for len(r.keys) <= j {
		k := len(r.keys)
		parent := uint64(0)
		if k == 0 {
			parent = e.cfg.Keyer.Root(r.LoraName, r.CacheSalt)
		} else {
			parent = r.keys[k-1]
		}
		toks := r.appendTokens(e.blockBuf[:0], k*e.bs, (k+1)*e.bs)
		r.keys = append(r.keys, e.cfg.Keyer.Chain(parent, toks))
	}
	return r.keys[j]
}

// freeBlocks releases r's blocks, tail first, so the free queue evicts a
// request's last blocks before its shared prefix (vLLM frees in reverse).
func (e *Engine) freeBlocks(r *Request) {
	for i := len(r.blocks) - 1; i >= 0; i-- {
		e.pool.release(r.blocks[i])
	}
	r.blocks = r.blocks[:0]
}

// preempt frees a running request's blocks and puts it back at the head of
// the waiting queue to recompute everything it has (vLLM's RECOMPUTE mode).
func (e *Engine) preempt(r *Request) {
	e.freeBlocks(r)
	if r.computed < r.prefillEnd {
		e.queuedPrefill -= r.prefillEnd - r.computed
	}
	r.computed, r.nCached = 0, 0
	r.prefillEnd = r.numTokens
	e.queuedPrefill += r.numTokens
	r.state = stateWaiting
	r.preemptions++
	e.load.Preemptions++
	e.waiting.pushFront(r)
}

func (e *Engine) emitRemoved(h uint64, medium string) {
	if e.sink == nil {
		return
	}
	hs := len(e.hashBuf)
	e.hashBuf = append(e.hashBuf, h)
	e.events = append(e.events, kvevents.Event{Kind: kvevents.BlockRemoved,
		BlockHashes: e.hashBuf[hs:len(e.hashBuf):len(e.hashBuf)], Medium: medium})
}

func (e *Engine) resetEvents() {
	e.events = e.events[:0]
	e.hashBuf = e.hashBuf[:0]
	e.tokBuf = e.tokBuf[:0]
	e.extraBuf = e.extraBuf[:0]
}

func (e *Engine) flushEvents(now time.Duration) {
	if e.sink != nil && len(e.events) > 0 {
		e.sink.KVEvents(now, e.events)
	}
	e.resetEvents()
}

// waitQueue is the FCFS waiting queue; preempted requests go back to its head.
type waitQueue struct {
	q    []*Request
	head int
}

func (w *waitQueue) len() int        { return len(w.q) - w.head }
func (w *waitQueue) front() *Request { return w.q[w.head] }
func (w *waitQueue) pushBack(r *Request) {
	if w.head > 0 && w.head >= len(w.q)/2 {
		n := copy(w.q, w.q[w.head:])
		clear(w.q[n:])
		w.q, w.head = w.q[:n], 0
	}
	w.q = append(w.q, r)
}

func (w *waitQueue) pushFront(r *Request) {
	if w.head > 0 {
		w.head--
		w.q[w.head] = r
		return
	}
	w.q = append(w.q, nil)
	copy(w.q[1:], w.q)
	w.q[0] = r
}

func (w *waitQueue) popFront() {
	w.q[w.head] = nil
	w.head++
	if w.head == len(w.q) {
		w.q, w.head = w.q[:0], 0
	}
}

func (w *waitQueue) remove(r *Request) {
	for i := w.head; i < len(w.q); i++ {
		if w.q[i] == r {
			copy(w.q[i:], w.q[i+1:])
			w.q[len(w.q)-1] = nil
			w.q = w.q[:len(w.q)-1]
			if w.head == len(w.q) {
				w.q, w.head = w.q[:0], 0
			}
			return
		}
	}
}
