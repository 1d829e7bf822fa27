// Package meshtest holds helpers for the mesh tests: a map-backed index (the
// materializer's Index, with exact per-tier sets to compare), a small
// vLLM-like cache model that publishes real KV events over ZMQ through
// kvtest.Publisher (for package tests that must not depend on the
// simulator), and a waitFor helper. Test code only.
package meshtest

import (
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/kvmesh/kvmesh/ingress/materialize"
	"github.com/kvmesh/kvmesh/kvevents"
)

// MapIndex is an exact Index: per engine and tier, a set of keys. It fails
// loudly (Errors) when the materializer breaks the Index contract: storing a
// key that is already stored or removing one that is not.
type MapIndex struct {
	mu     sync.Mutex
	sets   map[string]*[kvevents.NumTiers]map[uint64]struct{}
	Errors []string
}

var _ materialize.Index = (*MapIndex)(nil)

// NewMapIndex returns an empty index.
func NewMapIndex() *MapIndex {
	return &MapIndex{sets: map[string]*[kvevents.NumTiers]map[uint64]struct{}{}}
}

func (x *MapIndex) engine(e string) *[kvevents.NumTiers]map[uint64]struct{} {
	s := x.sets[e]
	if s == nil {
		s = &[kvevents.NumTiers]map[uint64]struct{}{{}, {}, {}}
		x.sets[e] = s
	}
	return s
}

// Store implements materialize.Index.
func (x *MapIndex) Store(engine string, tier kvevents.Tier, keys []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	set := x.engine(engine)[tier]
	for _, k := range keys {
		if _, ok := set[k]; ok {
			x.Errors = append(x.Errors, fmt.Sprintf("store of stored key %x on %s/%s", k, engine, tier))
		}
		set[k] = struct{}{}
	}
}

// Remove implements materialize.Index.
func (x *MapIndex) Remove(engine string, tier kvevents.Tier, keys []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	set := x.engine(engine)[tier]
	for _, k := range keys {
		if _, ok := set[k]; !ok {
			x.Errors = append(x.Errors, fmt.Sprintf("remove of absent key %x on %s/%s", k, engine, tier))
		}
		delete(set, k)
	}
}

// ClearEngine implements materialize.Index.
func (x *MapIndex) ClearEngine(engine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.sets, engine)
}

// Keys returns the sorted keys of one engine's tier.
func (x *MapIndex) Keys(engine string, tier kvevents.Tier) []uint64 {
	x.mu.Lock()
	defer x.mu.Unlock()
	s := x.sets[engine]
	if s == nil {
		return nil
	}
	return slices.Sorted(maps.Keys(s[tier]))
}

// Engines returns the engines with any state.
func (x *MapIndex) Engines() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Sorted(maps.Keys(x.sets))
}

// Problems returns the contract violations seen so far.
func (x *MapIndex) Problems() []string {
	x.mu.Lock()
	defer x.mu.Unlock()
	return slices.Clone(x.Errors)
}

// Sorted returns keys sorted (nil for empty), for comparisons.
func Sorted(keys []uint64) []uint64 {
	if len(keys) == 0 {
		return nil
	}
	s := slices.Clone(keys)
	slices.Sort(s)
	return s
}

// SortedSet returns the keys of a set, sorted (nil for empty).
func SortedSet(set map[uint64]struct{}) []uint64 {
	if len(set) == 0 {
		return nil
	}
	return slices.Sorted(maps.Keys(set))
}

// Cache is a small vLLM-like prefix cache that emits real KV events: a GPU
// tier of GPUBlocks with LRU eviction and an optional CPU tier that receives
// evicted blocks first (as vLLM's offloading connector: a CPU location update,
// then the GPU removal). Engine hashes are opaque ids unrelated to kvmesh
// keys. Not safe for concurrent use.
type Cache struct {
	Model     string
	BlockSize int
	GPUBlocks int
	CPUBlocks int
	Pub       *kvtest.Publisher

	rng    *rand.Rand
	salt   uint64
	hashOf map[uint64]uint64 // key → engine hash (stable per incarnation)
	gpu    *lru
	cpu    *lru
	events []kvevents.Event
}

// NewCache publishes on a new ZMQ publisher bound to a random loopback port
// with replay.
func NewCache(model string, blockSize, gpuBlocks, cpuBlocks int, seed uint64) (*Cache, error) {
	pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{
		Endpoint: "tcp://127.0.0.1:*", ReplayEndpoint: "tcp://127.0.0.1:*", BufferSteps: 100000,
	})
	if err != nil {
		return nil, err
	}
	c := &Cache{Model: model, BlockSize: blockSize, GPUBlocks: gpuBlocks, CPUBlocks: cpuBlocks, Pub: pub,
		rng: rand.New(rand.NewPCG(seed, 7))}
	c.Restart()
	return c, nil
}

// Restart forgets the cache (as a restarted engine) with new engine hashes.
// It does not emit anything; call Pub.Restart too to reset the sequence.
func (c *Cache) Restart() {
	c.salt = c.rng.Uint64()
	c.hashOf = map[uint64]uint64{}
	c.gpu, c.cpu = newLRU(), newLRU()
}

func (c *Cache) hash(key uint64) uint64 {
	h, ok := c.hashOf[key]
	if !ok {
		h = kvevents.MixKey(key ^ c.salt)
		c.hashOf[key] = h
	}
	return h
}

// Request caches the full blocks of tokens (as a prefill would) and publishes
// the resulting events as one batch.
func (c *Cache) Request(tokens []uint32) error {
	root := kvevents.Root(c.Model, "", "")
	keys := kvevents.AppendKeys(nil, root, tokens, c.BlockSize)
	pinned := map[uint64]bool{}
	var newHashes []uint64
	var newTokens []uint32
	var parent uint64
	hasParent := false
	flush := func() {
		if len(newHashes) > 0 {
			c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: newHashes,
				ParentHash: parent, HasParent: hasParent, TokenIDs: newTokens, BlockSize: c.BlockSize, Medium: "GPU"})
			newHashes, newTokens = nil, nil
		}
	}
	for i, k := range keys {
		h := c.hash(k)
		pinned[h] = true
		if c.gpu.has(h) {
			flush()
			c.gpu.touch(h, k)
			parent, hasParent = h, true
			continue
		}
		c.evict(pinned)
		if len(newHashes) == 0 && i > 0 {
			parent, hasParent = c.hash(keys[i-1]), true
		}
		newHashes = append(newHashes, h)
		newTokens = append(newTokens, tokens[i*c.BlockSize:(i+1)*c.BlockSize]...)
		c.gpu.touch(h, k)
	}
	flush()
	return c.publish()
}

// evict makes room for one GPU block, never evicting pinned blocks.
func (c *Cache) evict(pinned map[uint64]bool) {
	for c.gpu.len() >= c.GPUBlocks {
		h, k, ok := c.gpu.oldest(pinned)
		if !ok {
			return
		}
		if c.CPUBlocks > 0 && !c.cpu.has(h) {
			for c.cpu.len() >= c.CPUBlocks {
				ch, _, _ := c.cpu.oldest(nil)
				c.cpu.remove(ch)
				c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{ch}, Medium: "CPU"})
			}
			c.cpu.touch(h, k)
			c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockStored, BlockHashes: []uint64{h}, Medium: "CPU"})
		}
		c.gpu.remove(h)
		c.events = append(c.events, kvevents.Event{Kind: kvevents.BlockRemoved, BlockHashes: []uint64{h}, Medium: "GPU"})
	}
}

// Clear drops both tiers and publishes AllBlocksCleared (reset_prefix_cache).
func (c *Cache) Clear() error {
	c.gpu, c.cpu = newLRU(), newLRU()
	c.events = append(c.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	return c.publish()
}

func (c *Cache) publish() error {
	if len(c.events) == 0 {
		return nil
	}
	b := kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, Events: c.events}
	_, err := c.Pub.Publish(&b)
	c.events = c.events[:0]
	return err
}

// Truth returns the kvmesh keys the cache holds per tier, sorted.
func (c *Cache) Truth() (out [kvevents.NumTiers][]uint64) {
	out[kvevents.TierGPU] = c.gpu.keys()
	out[kvevents.TierCPU] = c.cpu.keys()
	return out
}

// RandomPrompt returns a prompt of one of groups shared prefixes (prefix
// blocks long) followed by up to suffix random blocks.
func (c *Cache) RandomPrompt(groups, prefix, suffix int) []uint32 {
	g := c.rng.IntN(groups)
	n := (prefix + c.rng.IntN(suffix+1)) * c.BlockSize
	toks := make([]uint32, n)
	for i := range toks {
		if i < prefix*c.BlockSize {
			toks[i] = uint32(g*100000 + i)
		} else {
			toks[i] = c.rng.Uint32N(50000)
		}
	}
	return toks
}

// lru is a tiny LRU set of engine hashes with their keys.
type lru struct {
	tick  uint64
	last  map[uint64]uint64 // hash → last use
	keyOf map[uint64]uint64
}

func newLRU() *lru { return &lru{last: map[uint64]uint64{}, keyOf: map[uint64]uint64{}} }

func (l *lru) has(h uint64) bool { _, ok := l.last[h]; return ok }
func (l *lru) len() int          { return len(l.last) }
func (l *lru) touch(h, k uint64) { l.tick++; l.last[h] = l.tick; l.keyOf[h] = k }
func (l *lru) remove(h uint64)   { delete(l.last, h); delete(l.keyOf, h) }

func (l *lru) oldest(pinned map[uint64]bool) (h, k uint64, ok bool) {
	best := ^uint64(0)
	for x, t := range l.last {
		if !pinned[x] && t < best {
			best, h, ok = t, x, true
		}
	}
	return h, l.keyOf[h], ok
}

func (l *lru) keys() []uint64 {
	out := make([]uint64, 0, len(l.keyOf))
	for _, k := range l.keyOf {
		out = append(out, k)
	}
	return Sorted(out)
}
