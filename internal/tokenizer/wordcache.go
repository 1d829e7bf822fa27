package tokenizer

import (
	"sync"
	"sync/atomic"
	"unsafe"
)

// Like tokenizers' BPE cache: the merge result of recent words, so the
// common words of a language are merged once. Bounded, and unlike
// tokenizers' (which stops inserting once full) it evicts: a full shard
// replaces a word not used since the clock hand last passed it, so one
// request of junk words cannot fill the cache for the process's lifetime.
const (
	wordCacheCapacity = 32768 // words; ~3.4 MB when full (wordSlot)
	maxCachedWord     = 32    // bytes; longer words are rare and cheap to skip
	maxCachedIDs      = 16    // ids; a word with more is not cached
	wordCacheShards   = 32
)

// wordSlot holds one cached word and its ids inline, so replacing a word
// allocates nothing: the map's key is a view of key, deleted from the map
// before key is overwritten.
type wordSlot struct {
	key  [maxCachedWord]byte
	ids  [maxCachedIDs]uint32
	klen uint8
	n    uint8
	ref  atomic.Bool // used since the hand last passed
}

func (s *wordSlot) word() string { return unsafe.String(&s.key[0], int(s.klen)) }

// wordCache is safe for concurrent use: lookups take a shard's read lock,
// inserts its write lock.
type wordCache struct {
	shards [wordCacheShards]wordShard
	per    int // slots per shard
}

type wordShard struct {
	mu    sync.RWMutex // guards m, slots, hand (not slots[i].ref, atomic)
	m     map[string]int32
	slots []wordSlot // cap per from the first put (never reallocated); then slots are reused
	hand  int
	_     [40]byte // keep shards on separate cache lines
}

func newWordCache(capacity int) *wordCache {
	c := &wordCache{per: max(1, capacity/wordCacheShards)}
	for i := range c.shards {
		c.shards[i].m = make(map[string]int32)
	}
	return c
}

func shardOf(w string) int {
	// FNV-1a over a few bytes: cheap and spreads words well enough.
	h := uint32(2166136261)
	for i := 0; i < len(w) && i < 8; i++ {
		h = (h ^ uint32(w[i])) * 16777619
	}
	h = (h ^ uint32(len(w))) * 16777619
	return int(h % wordCacheShards)
}

// appendIDs appends w's cached ids to dst. They are copied under the lock:
// a slot may be reused as soon as it is released.
func (c *wordCache) appendIDs(dst []uint32, w string) ([]uint32, bool) {
	s := &c.shards[shardOf(w)]
	s.mu.RLock()
	i, ok := s.m[w]
	if ok {
		sl := &s.slots[i]
		if !sl.ref.Load() {
			sl.ref.Store(true)
		}
		dst = append(dst, sl.ids[:sl.n]...)
	}
	s.mu.RUnlock()
	return dst, ok
}

// put stores w's ids (w is copied: it may be a view of a buffer the caller
// reuses), replacing a word by the clock when the shard is full.
func (c *wordCache) put(w string, ids []uint32) {
	if len(w) == 0 || len(w) > maxCachedWord || len(ids) > maxCachedIDs {
		return
	}
	s := &c.shards[shardOf(w)]
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.m[w]; ok {
		return
	}
	var i int
	if len(s.slots) < c.per {
		if s.slots == nil {
			// Full size at once: map keys are views of the slots, which
			// must never move.
			s.slots = make([]wordSlot, 0, c.per)
		}
		s.slots = s.slots[:len(s.slots)+1]
		i = len(s.slots) - 1
	} else {
		// Clock: skip (and clear) words used since the last pass; at most
		// one full turn.
		for {
			if s.hand >= len(s.slots) {
				s.hand = 0
			}
			if !s.slots[s.hand].ref.Swap(false) {
				break
			}
			s.hand++
		}
		i = s.hand
		s.hand++
		delete(s.m, s.slots[i].word())
	}
	sl := &s.slots[i]
	sl.klen = uint8(copy(sl.key[:], w))
	sl.n = uint8(copy(sl.ids[:], ids))
	sl.ref.Store(false)
	s.m[sl.word()] = int32(i)
}

// len is the number of cached words (for tests).
func (c *wordCache) len() int {
	n := 0
	for i := range c.shards {
		s := &c.shards[i]
		s.mu.RLock()
		n += len(s.m)
		s.mu.RUnlock()
	}
	return n
}
