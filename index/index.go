package index

import (
	"errors"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/kvevents"
)

// ErrTooManyEngines is returned (and counted) when more than MaxEngines
// distinct engines are stored in one Index.
var ErrTooManyEngines = errors.New("index: too many engines")

// DefaultSpeculativeTTL is Config.SpeculativeTTL's default, the ingress's
// (ingress.DefaultConfig) and the DES's (loadtest/des): one value, so the
// benchmarks measure what a deployment runs.
const DefaultSpeculativeTTL = 5 * time.Second

// Config configures an Index. The zero value is usable after Defaults.
type Config struct {
	// SpeculativeTTL is how long a speculative entry (a key just routed to an
	// engine) counts before the engine's own events confirm it. Long enough to
	// cover the request's queue wait (an engine emits a block's stored event
	// when it schedules the prefill step computing it) plus event
	// propagation, short enough that a request that failed or was evicted
	// stops attracting traffic.
	// Default DefaultSpeculativeTTL.
	SpeculativeTTL time.Duration
	// InitialKeys sizes the table up front to avoid growth pauses. Default 0
	// (starts at 1,024 buckets and doubles).
	InitialKeys int
	// ExactLookup makes every lookup read each key of the chain (up to the
	// first that extends no engine) instead of searching it. The search is
	// exact when every engine holds, per tier, a prefix of each chain it
	// holds keys of, which vLLM's eviction order guarantees on the GPU
	// (search.go); set this when a source breaks that (an offload tier with
	// its own eviction order) and a lookup must never look past a hole.
	ExactLookup bool
}

// Defaults fills zero fields with their defaults.
func (c *Config) Defaults() {
	if c.SpeculativeTTL == 0 {
		c.SpeculativeTTL = DefaultSpeculativeTTL
	}
}

// Validate lists every problem with c.
func (c Config) Validate() error {
	var errs []error
	if c.SpeculativeTTL < 0 {
		errs = append(errs, fmt.Errorf("index: SpeculativeTTL %v is negative", c.SpeculativeTTL))
	}
	if c.InitialKeys < 0 {
		errs = append(errs, fmt.Errorf("index: InitialKeys %d is negative", c.InitialKeys))
	}
	return errors.Join(errs...)
}

// Index maps chain keys to the engines holding them, per tier, plus
// speculative entries. See the package doc for the concurrency contract.
type Index struct {
	cfg Config

	mu sync.RWMutex // guards everything below
	t  *table
	// slots maps an engine id to its small slot; names is the reverse
	// ("" for a released slot). names is copied on write once a slot is
	// released: lookup Results keep the slice they saw, read without mu.
	slots map[string]uint16
	names []string
	// free lists released slots (ClearEngine), reused before new ones, so
	// engines that come and go do not use up MaxEngines.
	free []uint16
	// gens[slot] counts the slot's releases: speculative records of an
	// earlier holder of the slot are void.
	gens []uint32
	// counts[slot][tier] is how many keys the engine holds per tier;
	// counts[slot][3] its live speculative keys.
	counts [][4]int
	spec   specQueue
	// dropped counts writes refused because the engine table was full.
	dropped uint64
}

// New returns an empty Index. cfg is defaulted; an invalid cfg is an error.
func New(cfg Config) (*Index, error) {
	cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &Index{
		cfg:   cfg,
		t:     newTable(cfg.InitialKeys * maxLoadDen / maxLoadNum),
		slots: make(map[string]uint16),
	}, nil
}

// slotLocked returns engine's slot, assigning one when create is set.
// Callers hold mu for writing when create is set.
func (x *Index) slotLocked(engine string, create bool) (uint16, bool) {
	if s, ok := x.slots[engine]; ok {
		return s, true
	}
	if !create || len(x.slots) >= MaxEngines {
		if create {
			x.dropped++
		}
		return 0, false
	}
	if n := len(x.free); n > 0 {
		s := x.free[n-1]
		x.free = x.free[:n-1]
		x.slots[engine] = s
		x.setName(s, engine)
		return s, true
	}
	s := uint16(len(x.names))
	x.slots[engine] = s
	x.names = append(x.names, engine)
	x.gens = append(x.gens, 0)
	x.counts = append(x.counts, [4]int{})
	return s, true
}

// setName changes a slot's name in a copy of names (see Index.names).
func (x *Index) setName(s uint16, engine string) {
	names := make([]string, len(x.names), cap(x.names))
	copy(names, x.names)
	names[s] = engine
	x.names = names
}

// releaseLocked frees engine's slot, which holds nothing any more, for
// reuse by another engine.
func (x *Index) releaseLocked(engine string, s uint16) {
	delete(x.slots, engine)
	x.setName(s, "")
	x.gens[s]++
	x.counts[s] = [4]int{}
	x.free = append(x.free, s)
}

func tierBit(tier kvevents.Tier) uint16 {
	if tier > kvevents.TierOther {
		tier = kvevents.TierOther
	}
	return 1 << (tierShift + uint16(tier))
}

// Store records that engine holds keys in tier. It is idempotent per
// (key, engine, tier) and supersedes any speculative entry for the pair.
func (x *Index) Store(engine string, tier kvevents.Tier, keys []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.slotLocked(engine, true)
	if !ok {
		return
	}
	bit := tierBit(tier)
	c := &x.counts[slot]
	ti := tierIndex(tier)
	for _, k := range keys {
		before := x.t.update(k, slot, bit, specBit)
		if before&bit == 0 {
			c[ti]++
		}
		if before&specBit != 0 {
			c[3]--
		}
	}
}

// Remove records that engine no longer holds keys in tier. Unknown keys are
// ignored. A speculative entry for the pair is dropped too: the engine has
// just said it does not hold the block.
func (x *Index) Remove(engine string, tier kvevents.Tier, keys []uint64) {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.slotLocked(engine, false)
	if !ok {
		return
	}
	bit := tierBit(tier)
	c := &x.counts[slot]
	ti := tierIndex(tier)
	for _, k := range keys {
		before := x.t.clearBits(k, slot, bit|specBit)
		if before&bit != 0 {
			c[ti]--
		}
		if before&specBit != 0 {
			c[3]--
		}
	}
}

// ClearEngine drops everything engine holds, in every tier, speculative
// entries included, and releases its slot: the engine is forgotten until
// it is written again (maybe in another slot), and engines that come and
// go reuse slots instead of using up MaxEngines.
func (x *Index) ClearEngine(engine string) {
	x.mu.Lock()
	defer x.mu.Unlock()
	slot, ok := x.slotLocked(engine, false)
	if !ok {
		return
	}
	x.clearSlotLocked(slot)
	x.releaseLocked(engine, slot)
}

// clearSlotLocked walks the whole table: clears are rare (engine restart).
func (x *Index) clearSlotLocked(slot uint16) {
	t := x.t
	all := uint16(7<<tierShift | specBit)
	var victims []uint64
	for i := range t.b {
		k := t.b[i].key
		if k == 0 {
			continue
		}
		if hasSlot(t, &t.b[i].e, slot) {
			victims = append(victims, k)
		}
	}
	if t.zeroUsed && hasSlot(t, &t.zeroElem, slot) {
		victims = append(victims, 0)
	}
	for _, k := range victims {
		t.clearBits(k, slot, all)
	}
	x.counts[slot] = [4]int{}
}

// hasSlot reports whether slot has any bit (tier or speculative) for k,
// whose elements are e.
func hasSlot(t *table, e *[inlineN]uint16, slot uint16) bool {
	return t.elem(e, slot) != nil
}

func tierIndex(t kvevents.Tier) int {
	if t > kvevents.TierOther {
		return int(kvevents.TierOther)
	}
	return int(t)
}

// AddSpeculative records that keys were just routed to engine at now, so the
// next request sharing the prefix follows them before the engine's events
// arrive. Entries expire after Config.SpeculativeTTL; a confirmed Store
// supersedes them. Expired entries are dropped on every call.
//
// now should come from time.Now: expiry is read on its monotonic clock
// (internal/monotime), so a step of the wall clock neither holds entries
// past their TTL nor drops them early. A time without a monotonic reading
// is compared on its wall clock; a step back there drops the entries routed
// before it at once instead of keeping them for the step.
func (x *Index) AddSpeculative(engine string, keys []uint64, now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expireLocked(now)
	slot, ok := x.slotLocked(engine, true)
	if !ok {
		return
	}
	added := 0
	c := &x.counts[slot]
	for _, k := range keys {
		e := x.t.elemsOf(k)
		if e != nil && hasSlot(x.t, e, slot) {
			continue // already confirmed or speculative
		}
		x.t.setBits(k, slot, specBit)
		c[3]++
		added++
	}
	if added > 0 {
		x.spec.push(monotime.Of(now)+int64(x.cfg.SpeculativeTTL), slot, x.gens[slot], keys)
	}
}

// ExpireSpeculative drops speculative entries older than the TTL. The
// ingress calls it from a ticker when traffic is idle; writes call it anyway.
// now is read as in AddSpeculative.
func (x *Index) ExpireSpeculative(now time.Time) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.expireLocked(now)
}

func (x *Index) expireLocked(now time.Time) {
	n := monotime.Of(now)
	for {
		r, keys, ok := x.spec.popExpired(n, n+int64(x.cfg.SpeculativeTTL))
		if !ok {
			return
		}
		if r.gen != x.gens[r.slot] {
			continue // the slot was released since (ClearEngine cleared these)
		}
		c := &x.counts[r.slot]
		for _, k := range keys {
			if x.t.clearBits(k, r.slot, specBit)&specBit != 0 {
				c[3]--
			}
		}
	}
}

// EngineStats is one engine's key counts.
type EngineStats struct {
	Engine      string
	Keys        [kvevents.NumTiers]int // per tier
	Speculative int
}

// Engines returns per-engine key counts, in slot order (engines cleared
// with ClearEngine are not listed).
func (x *Index) Engines() []EngineStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	out := make([]EngineStats, 0, len(x.slots))
	for i, n := range x.names {
		if s, ok := x.slots[n]; !ok || int(s) != i {
			continue // released
		}
		c := x.counts[i]
		out = append(out, EngineStats{Engine: n, Keys: [3]int{c[0], c[1], c[2]}, Speculative: c[3]})
	}
	return out
}

// KeyCount returns how many keys engine holds in tier.
func (x *Index) KeyCount(engine string, tier kvevents.Tier) int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	s, ok := x.slots[engine]
	if !ok {
		return 0
	}
	return x.counts[s][tierIndex(tier)]
}

// MemStats describes the index's memory use.
type MemStats struct {
	Keys          int     // distinct keys
	Entries       int     // (key, engine) pairs with a confirmed tier or speculative bit
	Buckets       int     // hash table buckets
	OverflowKeys  int     // keys held by more than the inline engines (using chunks)
	TableBytes    int     // bytes of the hash table and the overflow chunk arena
	BytesPerEntry float64 // TableBytes / Entries
	Engines       int     // engines known now (released slots excluded)
	DroppedWrites uint64  // writes refused because MaxEngines was reached
}

// MemStats returns the current memory statistics. It walks the engine
// counts, not the table, so it is cheap.
func (x *Index) MemStats() MemStats {
	x.mu.RLock()
	defer x.mu.RUnlock()
	t := x.t
	m := MemStats{
		Keys:          t.used,
		Buckets:       len(t.b),
		OverflowKeys:  t.ovKeys,
		Engines:       len(x.slots),
		DroppedWrites: x.dropped,
	}
	if t.zeroUsed {
		m.Keys++
	}
	m.TableBytes = len(t.b)*int(unsafe.Sizeof(bucket{})) + len(t.ov)*int(unsafe.Sizeof(chunk{}))
	for _, c := range x.counts {
		m.Entries += c[0] + c[1] + c[2] + c[3]
	}
	if m.Entries > 0 {
		m.BytesPerEntry = float64(m.TableBytes) / float64(m.Entries)
	}
	return m
}
