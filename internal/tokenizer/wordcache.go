package tokenizer

import (
	"sync"
	"sync/atomic"
)

// Like tokenizers' BPE cache: the merge result of recent words, so the
// common words of a language are merged once. Bounded: once full it stops
// inserting (tokenizers' policy), which keeps the hot set of the first
// traffic and never evicts under lock.
const (
	wordCacheCapacity = 32768 // words; at most ~2 MB with maxCachedWord
	maxCachedWord     = 32    // bytes; longer words are rare and cheap to skip
	wordCacheShards   = 32
)

// wordCache is safe for concurrent use: reads take a shard's read lock.
type wordCache struct {
	shards [wordCacheShards]struct {
		mu sync.RWMutex // guards m
		m  map[string][]uint32
		_  [40]byte // keep shards on separate cache lines
	}
	size atomic.Int64
	cap  int64
}

func newWordCache(capacity int) *wordCache {
	c := &wordCache{cap: int64(capacity)}
	for i := range c.shards {
		c.shards[i].m = make(map[string][]uint32)
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

func (c *wordCache) get(w string) ([]uint32, bool) {
	s := &c.shards[shardOf(w)]
	s.mu.RLock()
	ids, ok := s.m[w]
	s.mu.RUnlock()
	return ids, ok
}

func (c *wordCache) put(w string, ids []uint32) {
	if c.size.Load() >= c.cap {
		return
	}
	s := &c.shards[shardOf(w)]
	s.mu.Lock()
	if _, ok := s.m[w]; !ok {
		s.m[w] = append([]uint32(nil), ids...)
		c.size.Add(1)
	}
	s.mu.Unlock()
}
