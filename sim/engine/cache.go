package engine

// pool is the GPU block pool with vLLM's BlockPool semantics: every block not
// referenced by a running request sits in one free queue in eviction order
// (LRU at the front); a freed block keeps its hash and stays findable by prefix
// lookups until it is popped for reuse, which evicts it (BlockRemoved). The
// same hash may live in several blocks (two requests computed the same prefix
// in the same step); each copy is stored and removed with its own event.
//
// Everything is index-based arrays so a 1,000-engine benchmark stays compact
// and nothing allocates per block.
type pool struct {
	n      int
	ref    []int32
	hash   []uint64
	hashed []bool
	// free queue: doubly linked through prev/next; index n is the sentinel.
	prev, next []int32
	inFree     []bool
	numFree    int
	numHashed  int              // blocks holding a hash (duplicates included)
	byHash     map[uint64]int32 // hash → first block holding it
	dup        []int32          // next block with the same hash, -1 = none

	// Kept only with Config.KeepBlockTokens (CachedBlocks).
	keep      bool
	bs        int
	parent    []uint64
	hasParent []bool
	toks      []uint32 // bs tokens per block
	extra     []extraKeys
	key       []uint64 // Config.Keyer key, when a keyer is set
}

// extraKeys are the request-level extra keys of a cached block's chain.
type extraKeys struct{ lora, salt string }

func newPool(n, bs int, keep, keyed bool) *pool {
	p := &pool{
		n: n, ref: make([]int32, n), hash: make([]uint64, n), hashed: make([]bool, n),
		prev: make([]int32, n+1), next: make([]int32, n+1), inFree: make([]bool, n),
		byHash: make(map[uint64]int32, n), dup: make([]int32, n), keep: keep, bs: bs,
	}
	if keep {
		p.parent = make([]uint64, n)
		p.hasParent = make([]bool, n)
		p.toks = make([]uint32, n*bs)
		p.extra = make([]extraKeys, n)
	}
	if keyed {
		p.key = make([]uint64, n)
	}
	s := int32(n)
	p.prev[s], p.next[s] = s, s
	for i := 0; i < n; i++ {
		p.dup[i] = -1
		p.pushBack(int32(i))
	}
	return p
}

func (p *pool) pushBack(b int32) {
	s := int32(p.n)
	last := p.prev[s]
	p.next[last], p.prev[b] = b, last
	p.next[b], p.prev[s] = s, b
	p.inFree[b] = true
	p.numFree++
}

func (p *pool) unlink(b int32) {
	p.next[p.prev[b]] = p.next[b]
	p.prev[p.next[b]] = p.prev[b]
	p.inFree[b] = false
	p.numFree--
}

// front is the next block to reuse, -1 when none is free.
func (p *pool) front() int32 {
	f := p.next[p.n]
	if int(f) == p.n {
		return -1
	}
	return f
}

// lookup returns a block caching hash h, -1 if none.
func (p *pool) lookup(h uint64) int32 {
	if b, ok := p.byHash[h]; ok {
		return b
	}
	return -1
}

// touch takes a reference on a cached block (prefix hit).
func (p *pool) touch(b int32) {
	if p.ref[b] == 0 && p.inFree[b] {
		p.unlink(b)
	}
	p.ref[b]++
}

// release drops a reference; at zero the block joins the free queue's tail.
func (p *pool) release(b int32) {
	p.ref[b]--
	if p.ref[b] == 0 {
		p.pushBack(b)
	}
}

// setHash registers b in the prefix cache under h.
func (p *pool) setHash(b int32, h uint64) {
	p.hash[b], p.hashed[b] = h, true
	p.numHashed++
	if head, ok := p.byHash[h]; ok {
		p.dup[b] = p.dup[head]
		p.dup[head] = b
		return
	}
	p.byHash[h] = b
	p.dup[b] = -1
}

// unhash removes b from the prefix cache (eviction or reset).
func (p *pool) unhash(b int32) {
	h := p.hash[b]
	p.hashed[b] = false
	p.numHashed--
	head := p.byHash[h]
	switch {
	case head == b && p.dup[b] < 0:
		delete(p.byHash, h)
	case head == b:
		p.byHash[h] = p.dup[b]
	default:
		for x := head; x >= 0; x = p.dup[x] {
			if p.dup[x] == b {
				p.dup[x] = p.dup[b]
				break
			}
		}
	}
	p.dup[b] = -1
}

// blockTokens returns the kept tokens of b (KeepBlockTokens only).
func (p *pool) blockTokens(b int32) []uint32 { return p.toks[int(b)*p.bs : int(b+1)*p.bs] }

// cpuTier is the host-memory tier: an LRU set of block hashes with the chain
// data needed to report them. Hashes are unique here (a copy is only stored
// once); it receives blocks evicted from the GPU.
type cpuTier struct {
	n          int
	slot       map[uint64]int32
	hash       []uint64
	prev, next []int32 // LRU list, sentinel n; front = least recently used
	used       int
	free       []int32

	keep      bool
	bs        int
	parent    []uint64
	hasParent []bool
	toks      []uint32
	extra     []extraKeys
	key       []uint64
}

func newCPUTier(n, bs int, keep, keyed bool) *cpuTier {
	c := &cpuTier{n: n, slot: make(map[uint64]int32, n), hash: make([]uint64, n),
		prev: make([]int32, n+1), next: make([]int32, n+1), free: make([]int32, 0, n), keep: keep, bs: bs}
	if keep {
		c.parent = make([]uint64, n)
		c.hasParent = make([]bool, n)
		c.toks = make([]uint32, n*bs)
		c.extra = make([]extraKeys, n)
	}
	if keyed {
		c.key = make([]uint64, n)
	}
	s := int32(n)
	c.prev[s], c.next[s] = s, s
	for i := n - 1; i >= 0; i-- {
		c.free = append(c.free, int32(i))
	}
	return c
}

func (c *cpuTier) linkBack(i int32) {
	s := int32(c.n)
	last := c.prev[s]
	c.next[last], c.prev[i] = i, last
	c.next[i], c.prev[s] = s, i
}

func (c *cpuTier) unlink(i int32) {
	c.next[c.prev[i]] = c.next[i]
	c.prev[c.next[i]] = c.prev[i]
}

// has reports whether h is in the tier and, if so, makes it most recent.
func (c *cpuTier) touch(h uint64) bool {
	i, ok := c.slot[h]
	if ok {
		c.unlink(i)
		c.linkBack(i)
	}
	return ok
}

func (c *cpuTier) contains(h uint64) bool { _, ok := c.slot[h]; return ok }

// insert stores h, evicting the least recently used hash when full. It
// returns the slot used (-1 if h was already present, just touched) and the
// evicted hash.
func (c *cpuTier) insert(h uint64) (slot int32, evicted uint64, didEvict bool) {
	if c.touch(h) {
		return -1, 0, false
	}
	var i int32
	if n := len(c.free); n > 0 {
		i = c.free[n-1]
		c.free = c.free[:n-1]
	} else {
		i = c.next[c.n]
		evicted, didEvict = c.hash[i], true
		delete(c.slot, evicted)
		c.unlink(i)
		c.used--
	}
	c.hash[i] = h
	c.slot[h] = i
	c.linkBack(i)
	c.used++
	return i, evicted, didEvict
}

// clear empties the tier.
func (c *cpuTier) clear() {
	clear(c.slot)
	s := int32(c.n)
	c.prev[s], c.next[s] = s, s
	c.free = c.free[:0]
	for i := c.n - 1; i >= 0; i-- {
		c.free = append(c.free, int32(i))
	}
	c.used = 0
}
