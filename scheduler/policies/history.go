package policies

import "sync"

// History is a router's own record of where it sent which prompt blocks:
// the approximate prefix view SGLang's and Ray's routers (character radix
// trees), llm-d's approximate prefix producer and Kthena's prefix-cache
// plugin (hash LRUs) keep instead of listening to KV events. It never
// learns of an engine's evictions; it forgets by its own capacity only.
//
// Keys are kvmesh chain keys (each identifies its whole prefix), so one
// key per block stands for a radix-tree node or an upstream block hash.
// Upstream hashes text blocks (SGLang and Ray characters; llm-d 16 tokens ×
// 4 characters; Kthena 64 bytes ≈ 16 tokens); the DES's 16-token blocks
// are the same granularity (docs/EMULATIONS.md).
//
// Each engine holds at most Capacity keys (0 = unbounded) and evicts the
// least recently used. Insert touches a prompt's keys deepest first, so
// that within one prompt the deepest block is the oldest and eviction
// removes leaves before their parents, as a radix tree's leaf eviction
// (SGLang evict_tenant_by_size) and Kthena's Add do. Safe for concurrent
// use.
type History struct {
	// Capacity is the per-engine key bound (0 = unbounded).
	Capacity int
	// MaxBlocks caps how many leading blocks of a prompt are recorded and
	// matched (0 = all).
	MaxBlocks int

	mu      sync.Mutex
	engines map[string]*lru
}

// NewHistory returns an empty History.
func NewHistory(capacity, maxBlocks int) *History {
	return &History{Capacity: capacity, MaxBlocks: maxBlocks, engines: make(map[string]*lru)}
}

func (h *History) clip(keys []uint64) []uint64 {
	if h.MaxBlocks > 0 && len(keys) > h.MaxBlocks {
		return keys[:h.MaxBlocks]
	}
	return keys
}

// Prefix is the number of leading keys engine holds contiguously from the
// first: a radix tree's match length.
func (h *History) Prefix(engine string, keys []uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.engines[engine]
	if l == nil {
		return 0
	}
	keys = h.clip(keys)
	n := 0
	for n < len(keys) && l.has(keys[n]) {
		n++
	}
	return n
}

// Deepest is one plus the position of the deepest key engine holds (0 for
// none): Kthena's FindTopMatches, which searches from the end and takes a
// hit at i as a match of i+1 blocks.
func (h *History) Deepest(engine string, keys []uint64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.engines[engine]
	if l == nil {
		return 0
	}
	keys = h.clip(keys)
	for i := len(keys) - 1; i >= 0; i-- {
		if l.has(keys[i]) {
			return i + 1
		}
	}
	return 0
}

// Size is how many keys engine holds (a tree's size, in blocks).
func (h *History) Size(engine string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	if l := h.engines[engine]; l != nil {
		return len(l.idx)
	}
	return 0
}

// Insert records that keys were routed to engine.
func (h *History) Insert(engine string, keys []uint64) { h.InsertCap(engine, keys, h.Capacity) }

// InsertCap is Insert with engine's bound set to capacity (0 = unbounded)
// instead of Capacity: a router that sizes each server's record by the
// capacity the server reports (llm-d's autoTune). A bound that shrinks
// evicts down to it at this insert.
func (h *History) InsertCap(engine string, keys []uint64, capacity int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.engines[engine]
	if l == nil {
		if h.engines == nil {
			h.engines = make(map[string]*lru)
		}
		l = newLRU()
		h.engines[engine] = l
	}
	keys = h.clip(keys)
	for i := len(keys) - 1; i >= 0; i-- {
		l.touch(keys[i])
		for capacity > 0 && len(l.idx) > capacity {
			l.evictOldest()
		}
	}
}

// Forget drops engine's record (the engine left the cluster), as SGLang's
// router removes a worker's tree when the worker is removed.
func (h *History) Forget(engine string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.engines, engine)
}

// Engines is how many engines have a record.
func (h *History) Engines() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.engines)
}

// Touch marks keys that engine already holds as just used, deepest first
// (as Insert orders them), adding none: a radix tree's timestamp update on a
// match.
func (h *History) Touch(engine string, keys []uint64) {
	h.mu.Lock()
	defer h.mu.Unlock()
	l := h.engines[engine]
	if l == nil {
		return
	}
	keys = h.clip(keys)
	for i := len(keys) - 1; i >= 0; i-- {
		if l.has(keys[i]) {
			l.touch(keys[i])
		}
	}
}

// lru is a set of keys in recency order: a slab-backed doubly linked list
// (head = most recent) and a key → slot map.
type lru struct {
	idx        map[uint64]int32
	nodes      []lruNode
	free       []int32
	head, tail int32
}

type lruNode struct {
	key        uint64
	prev, next int32
}

func newLRU() *lru { return &lru{idx: make(map[uint64]int32), head: -1, tail: -1} }

func (l *lru) has(k uint64) bool { _, ok := l.idx[k]; return ok }

func (l *lru) unlink(i int32) {
	n := &l.nodes[i]
	if n.prev >= 0 {
		l.nodes[n.prev].next = n.next
	} else {
		l.head = n.next
	}
	if n.next >= 0 {
		l.nodes[n.next].prev = n.prev
	} else {
		l.tail = n.prev
	}
}

func (l *lru) pushFront(i int32) {
	n := &l.nodes[i]
	n.prev, n.next = -1, l.head
	if l.head >= 0 {
		l.nodes[l.head].prev = i
	}
	l.head = i
	if l.tail < 0 {
		l.tail = i
	}
}

func (l *lru) touch(k uint64) {
	if i, ok := l.idx[k]; ok {
		l.unlink(i)
		l.pushFront(i)
		return
	}
	var i int32
	if n := len(l.free); n > 0 {
		i, l.free = l.free[n-1], l.free[:n-1]
		l.nodes[i].key = k
	} else {
		i = int32(len(l.nodes))
		l.nodes = append(l.nodes, lruNode{key: k})
	}
	l.idx[k] = i
	l.pushFront(i)
}

func (l *lru) evictOldest() {
	i := l.tail
	if i < 0 {
		return
	}
	l.unlink(i)
	delete(l.idx, l.nodes[i].key)
	l.free = append(l.free, i)
}
