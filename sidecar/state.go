package sidecar

import (
	"slices"
	"strings"

	"github.com/kvmesh/kvmesh/kvevents"
)

// hashEntry is one engine block hash known on one rank: its kvmesh key,
// the hash of the block before it (a location update of an offloaded block
// of several engine blocks names only its last: the others are found through
// parent) and how many copies each tier holds (vLLM can store one hash more
// than once).
type hashEntry struct {
	key       uint64
	parent    uint64
	refs      [kvevents.NumTiers]uint32
	hasParent bool
}

// spanKey names a hash of one rank held in one tier for more engine blocks
// than its own: an offload tier's block of k engine blocks (an LMCache
// chunk, an OffloadingConnector block), named by one hash.
type spanKey struct {
	hash uint64
	tier kvevents.Tier
}

// stateCounters are the anomalies the state machine absorbs instead of failing.
type stateCounters struct {
	orphanParents   uint64 // BlockStored whose parent hash is unknown: its blocks stay unknown
	orphanLocations uint64 // CPU/other location updates for unknown hashes
	unknownRemoves  uint64 // BlockRemoved of a hash (or tier) not held
	keyConflicts    uint64 // a known hash stored again with different tokens
	// skippedGroups: events of non-full-attention KV groups (not
	// routable), stores and removals alike.
	skippedGroups uint64
	// badEvents: events without the fields they need, or an offload
	// tier's blocks whose size is no multiple of the engine's.
	badEvents uint64
	// blockSizeChanges: events of a block size other than the one in
	// effect (the engine restarted with another): the state was dropped.
	blockSizeChanges uint64
}

// state is one engine's authoritative key set: the union over its DP ranks.
// Not safe for concurrent use; the sidecar guards it with engine.mu.
type state struct {
	model string
	// blockSize is the size the keys are made with and gossiped: the
	// config's, or learned from the first event carrying one. An event
	// with another size replaces it (changeBlockSize); an engine restart
	// that leaves the engine empty forgets a learned one (restarted).
	blockSize    int
	cfgBlockSize int

	ranks []map[uint64]hashEntry
	// spans, per rank: the keys a hash held in a tier stands for besides
	// its own, in chain order, while the tier holds it (hashEntry.refs).
	spans []map[spanKey][]uint64
	// keyRefs: key → number of (rank, hash) entries and spans holding it
	// in the tier.
	keyRefs [kvevents.NumTiers]map[uint64]uint32
	digests [kvevents.NumTiers]kvevents.Digest
	// unrouted holds the KV-cache group indexes whose stores said they are
	// not routable (sliding window, Mamba): their removals are skipped too,
	// since vLLM names the same hash in every group.
	unrouted map[int64]bool

	pending     []kvevents.Op // ops since the last delta, in order; consecutive same-kind ops coalesce
	pendingKeys int
	scratch     []uint64
	c           stateCounters
}

func newState(model string, blockSize, dpSize int) *state {
	s := &state{model: model, blockSize: blockSize, cfgBlockSize: blockSize}
	s.ranks = make([]map[uint64]hashEntry, max(dpSize, 1))
	s.spans = make([]map[spanKey][]uint64, len(s.ranks))
	for r := range s.ranks {
		s.ranks[r] = map[uint64]hashEntry{}
	}
	for t := range s.keyRefs {
		s.keyRefs[t] = map[uint64]uint32{}
	}
	return s
}

func (s *state) rank(r int) map[uint64]hashEntry {
	for r >= len(s.ranks) { // a rank beyond the configured DP size: grow rather than drop events
		s.ranks = append(s.ranks, map[uint64]hashEntry{})
		s.spans = append(s.spans, nil)
	}
	return s.ranks[r]
}

// apply applies one engine batch of rank r. It returns whether an event had
// an unknown parent (the caller's resync policy decides what that costs).
func (s *state) apply(r int, b *kvevents.Batch) (orphan bool) {
	for i := range b.Events {
		ev := &b.Events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			if !s.stored(r, ev) {
				orphan = true
			}
		case kvevents.BlockRemoved:
			s.removed(r, ev)
		case kvevents.AllBlocksCleared:
			s.dropRank(r) // the engine cleared every tier (reset_prefix_cache)
		default:
			s.c.badEvents++
		}
	}
	return orphan
}

func routable(kind string) bool {
	return kind == "" || strings.Contains(kind, "full") || strings.Contains(kind, "mla")
}

// skipGroup says whether ev belongs to a KV-cache group kvmesh does not
// index, and learns from a store which groups those are. vLLM's hybrid
// models store and remove the same hash in every group, and only stores
// say the group's kind; removals (and location updates) name the group by
// its index alone, so a group's index is known unrouted from its stores.
func (s *state) skipGroup(ev *kvevents.Event) bool {
	if ev.SpecKind != "" {
		if !routable(ev.SpecKind) {
			if ev.HasGroupIdx {
				if s.unrouted == nil {
					s.unrouted = map[int64]bool{}
				}
				s.unrouted[ev.GroupIdx] = true
			}
			return true
		}
		if ev.HasGroupIdx && s.unrouted[ev.GroupIdx] {
			delete(s.unrouted, ev.GroupIdx)
		}
		return false
	}
	return ev.HasGroupIdx && s.unrouted[ev.GroupIdx]
}

func (s *state) stored(r int, ev *kvevents.Event) bool {
	if s.skipGroup(ev) {
		s.c.skippedGroups++
		return true
	}
	tier := ev.Tier()
	hashes := s.rank(r)
	if len(ev.TokenIDs) == 0 {
		s.located(r, ev, tier)
		return true
	}
	bs := ev.BlockSize
	if bs <= 0 {
		bs = s.blockSize
	}
	if bs <= 0 {
		s.c.badEvents++
		return true
	}
	if bs != s.blockSize && tier != kvevents.TierGPU {
		// An offload tier's blocks (LMCache's chunks): never the engine's
		// block size.
		s.storedSpans(r, ev, tier, bs)
		return true
	}
	if bs != s.blockSize {
		s.changeBlockSize(bs)
		hashes = s.rank(r) // changeBlockSize may have replaced the rank's map
	}
	var parent uint64
	if ev.HasParent {
		pe, ok := hashes[ev.ParentHash]
		if !ok {
			s.c.orphanParents++
			return false
		}
		parent = pe.key
	}
	n := min(len(ev.BlockHashes), len(ev.TokenIDs)/bs)
	if n < len(ev.BlockHashes) {
		s.c.badEvents++ // fewer tokens than blocks: key what we can
	}
	// The root (no parent) comes from the event's LoRA and cache salt, which
	// vLLM sends in block 0's extra keys; blocks with extra keys the ingress
	// cannot reproduce (multimodal, prompt embeds) get keys no text request
	// has (kvevents.AppendStoredKeys).
	s.scratch = kvevents.AppendStoredKeys(s.scratch[:0], s.model, ev, parent, n, bs)
	ph, hasParent := ev.ParentHash, ev.HasParent
	for i, key := range s.scratch {
		h := ev.BlockHashes[i]
		e, ok := hashes[h]
		if !ok {
			e.key, e.parent, e.hasParent = key, ph, hasParent
		} else if e.key != key {
			s.c.keyConflicts++ // keep the first: its key is what the index holds
		}
		s.addRef(r, h, e, tier, nil)
		ph, hasParent = h, true
	}
	return true
}

// located applies a location update (CPU offloading): the hashes are known
// chain blocks. A block_size of k engine blocks (vLLM's OffloadingConnector
// with an offloaded block larger than the engine's) names each offloaded
// block by its last engine block's hash: the k-1 blocks before it in the
// chain come with it.
func (s *state) located(r int, ev *kvevents.Event, tier kvevents.Tier) {
	hashes := s.rank(r)
	k := 1
	if s.blockSize > 0 && ev.BlockSize > s.blockSize && ev.BlockSize%s.blockSize == 0 {
		// No chain is longer than the rank's hashes: this bounds the walk
		// when a hash removed and stored again made its parents a cycle.
		k = min(ev.BlockSize/s.blockSize, len(hashes))
	}
	for _, h := range ev.BlockHashes {
		e, ok := hashes[h]
		if !ok {
			s.c.orphanLocations++
			continue
		}
		var span []uint64
		if k > 1 && e.refs[tier] == 0 {
			span = s.scratch[:0]
			for p := e; len(span) < k-1 && p.hasParent; {
				if p, ok = hashes[p.parent]; !ok {
					break // evicted from every tier: the blocks after it are still held
				}
				span = append(span, p.key)
			}
			slices.Reverse(span)
			s.scratch = span
		}
		s.addRef(r, h, e, tier, span)
	}
}

// storedSpans applies a BlockStored of a tier other than the GPU whose
// blocks are not the engine's: LMCache's chunks (256 tokens by default, or
// a partial last chunk's length), each named by LMCache's own chunk key and
// chained to the chunk before it. A chunk of k engine blocks is keyed at the
// engine's block size from its tokens, its hash standing for the k keys in
// the tier; any other size (a partial chunk of no whole number of engine
// blocks, or before the engine's block size is known) cannot be keyed and is
// counted in badEvents. An unknown parent chunk is counted, but asks for no
// reset: the GPU state is sound.
func (s *state) storedSpans(r int, ev *kvevents.Event, tier kvevents.Tier, bs int) {
	B := s.blockSize
	if B <= 0 || bs%B != 0 || len(ev.ExtraKeys) > 0 {
		s.c.badEvents++ // extra keys are per event block: not per engine block
		return
	}
	k := bs / B
	hashes := s.rank(r)
	var parent uint64
	if ev.HasParent {
		pe, ok := hashes[ev.ParentHash]
		if !ok {
			s.c.orphanParents++
			return
		}
		parent = pe.key
	}
	n := min(len(ev.BlockHashes), len(ev.TokenIDs)/bs)
	if n < len(ev.BlockHashes) {
		s.c.badEvents++
	}
	s.scratch = kvevents.AppendStoredKeys(s.scratch[:0], s.model, ev, parent, n*k, B)
	ph, hasParent := ev.ParentHash, ev.HasParent
	for i := range n {
		h, keys := ev.BlockHashes[i], s.scratch[i*k:(i+1)*k]
		e, ok := hashes[h]
		if !ok {
			e.key, e.parent, e.hasParent = keys[k-1], ph, hasParent
		} else if e.key != keys[k-1] {
			s.c.keyConflicts++
		}
		s.addRef(r, h, e, tier, keys[:k-1])
		ph, hasParent = h, true
	}
}

func (s *state) removed(r int, ev *kvevents.Event) {
	if ev.HasGroupIdx && s.unrouted[ev.GroupIdx] {
		s.c.skippedGroups++ // its stores were skipped: the hash is another group's
		return
	}
	tier := ev.Tier()
	hashes := s.rank(r)
	for _, h := range ev.BlockHashes {
		e, ok := hashes[h]
		if !ok || e.refs[tier] == 0 {
			s.c.unknownRemoves++
			continue
		}
		e.refs[tier]--
		if e.refs[tier] == 0 {
			s.keyDec(tier, e.key)
			s.spanDec(r, spanKey{h, tier})
		}
		if e.refs == ([kvevents.NumTiers]uint32{}) {
			delete(hashes, h)
		} else {
			hashes[h] = e
		}
	}
}

// addRef adds a copy of hash h to the tier. On the tier's first copy, span
// (keys the hash stands for besides its own) is kept with it.
func (s *state) addRef(r int, h uint64, e hashEntry, tier kvevents.Tier, span []uint64) {
	e.refs[tier]++
	if e.refs[tier] == 1 {
		s.keyInc(tier, e.key)
		if len(span) > 0 {
			if s.spans[r] == nil {
				s.spans[r] = map[spanKey][]uint64{}
			}
			s.spans[r][spanKey{h, tier}] = slices.Clone(span)
			for _, k := range span {
				s.keyInc(tier, k)
			}
		}
	}
	s.ranks[r][h] = e
}

// spanDec drops the span of sk on rank r, if any: its tier no longer holds it.
func (s *state) spanDec(r int, sk spanKey) {
	span, ok := s.spans[r][sk]
	if !ok {
		return
	}
	delete(s.spans[r], sk)
	for _, k := range span {
		s.keyDec(sk.tier, k)
	}
}

func (s *state) keyInc(t kvevents.Tier, key uint64) {
	n := s.keyRefs[t][key]
	s.keyRefs[t][key] = n + 1
	if n == 0 {
		s.digests[t].Add(key)
		s.emit(kvevents.OpStore, t, key)
	}
}

func (s *state) keyDec(t kvevents.Tier, key uint64) {
	n := s.keyRefs[t][key]
	switch n {
	case 0:
		return
	case 1:
		delete(s.keyRefs[t], key)
		s.digests[t].Remove(key)
		s.emit(kvevents.OpRemove, t, key)
	default:
		s.keyRefs[t][key] = n - 1
	}
}

func (s *state) emit(kind kvevents.OpKind, t kvevents.Tier, key uint64) {
	if n := len(s.pending); n > 0 && s.pending[n-1].Kind == kind && s.pending[n-1].Tier == t {
		s.pending[n-1].Keys = append(s.pending[n-1].Keys, key)
	} else {
		s.pending = append(s.pending, kvevents.Op{Kind: kind, Tier: t, Keys: []uint64{key}})
	}
	s.pendingKeys++
}

// dropRank forgets everything rank r holds (engine restart, lost history,
// AllBlocksCleared). When no other rank holds anything the whole engine is
// empty and one clear op per tier replaces a long list of removes.
func (s *state) dropRank(r int) {
	hashes := s.rank(r)
	others := false
	for i, m := range s.ranks {
		if i != r && len(m) > 0 {
			others = true
		}
	}
	if !others {
		for t := range s.keyRefs {
			if len(s.keyRefs[t]) == 0 {
				continue
			}
			clear(s.keyRefs[t])
			s.digests[t] = kvevents.Digest{}
			s.pending = append(s.pending, kvevents.Op{Kind: kvevents.OpClear, Tier: kvevents.Tier(t)})
			s.pendingKeys++
		}
		s.ranks[r], s.spans[r] = map[uint64]hashEntry{}, nil
		return
	}
	for _, e := range hashes {
		for t, n := range e.refs {
			if n > 0 {
				s.keyDec(kvevents.Tier(t), e.key)
			}
		}
	}
	for sk, span := range s.spans[r] {
		for _, k := range span {
			s.keyDec(sk.tier, k)
		}
	}
	s.ranks[r], s.spans[r] = map[uint64]hashEntry{}, nil
}

// changeBlockSize makes bs the block size. Keys made with another size can
// never match a request the ingresses key with bs (the gossiped size), so
// every rank's state is dropped, as on an engine restart (an engine's block
// size changes only with one). Counted in blockSizeChanges unless learned
// for the first time.
func (s *state) changeBlockSize(bs int) {
	if s.blockSize != 0 {
		s.c.blockSizeChanges++
		for r := range s.ranks {
			s.dropRank(r)
		}
	}
	s.blockSize = bs
}

// restarted drops rank r after the engine restarted. When no rank holds
// anything any more (the whole engine restarted), a learned block size is
// forgotten too: the engine may have come back with another one, and the
// next event says which. While other ranks hold keys their size stays;
// a different size from the restarted rank then drops them
// (changeBlockSize).
func (s *state) restarted(r int) {
	s.dropRank(r)
	for _, m := range s.ranks {
		if len(m) > 0 {
			return
		}
	}
	s.blockSize = s.cfgBlockSize
}

// takePending hands the pending ops to a delta and starts a new list.
func (s *state) takePending() []kvevents.Op {
	ops := s.pending
	s.pending, s.pendingKeys = nil, 0
	return ops
}

// keys copies the key set of tier t.
func (s *state) keys(t kvevents.Tier) []uint64 {
	out := make([]uint64, 0, len(s.keyRefs[t]))
	for k := range s.keyRefs[t] {
		out = append(out, k)
	}
	return out
}
