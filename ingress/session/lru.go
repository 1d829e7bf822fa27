package session

import (
	"sync"
	"time"

	"github.com/zeebo/xxh3"
)

// numShards splits an lru so concurrent requests rarely share a lock.
const numShards = 16

// lru is a bounded, sharded least-recently-used map from session id to V with an idle
// time-to-live. When a shard is full its least recently used entry is dropped and its
// node reused, so a full cache allocates nothing per insert of a new id beyond the id
// string the caller already holds.
type lru[V any] struct {
	ttl    time.Duration
	shards [numShards]shard[V]
}

type shard[V any] struct {
	mu    sync.Mutex // guards everything below
	cap   int
	items map[string]*node[V]
	head  node[V] // sentinel: head.next is the most recent, head.prev the least
}

type node[V any] struct {
	id         string
	val        V
	used       time.Time
	prev, next *node[V]
}

func newLRU[V any](capacity int, ttl time.Duration) *lru[V] {
	l := &lru[V]{ttl: ttl}
	per := max(1, (capacity+numShards-1)/numShards)
	for i := range l.shards {
		s := &l.shards[i]
		s.cap = per
		s.items = make(map[string]*node[V], min(per, 1024))
		s.head.next, s.head.prev = &s.head, &s.head
	}
	return l
}

func (l *lru[V]) shard(id string) *shard[V] {
	return &l.shards[xxh3.HashString(id)%numShards]
}

// get returns id's value if present and used within ttl, and marks it used now when
// touch is set.
func (l *lru[V]) get(id string, now time.Time, touch bool) (V, bool) {
	s := l.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	n, ok := s.items[id]
	if !ok {
		var zero V
		return zero, false
	}
	if l.ttl > 0 && now.Sub(n.used) > l.ttl {
		s.unlink(n)
		delete(s.items, id)
		var zero V
		return zero, false
	}
	if touch {
		n.used = now
		s.unlink(n)
		s.pushFront(n)
	}
	return n.val, true
}

// put sets id's value and marks it used now.
func (l *lru[V]) put(id string, v V, now time.Time) {
	s := l.shard(id)
	s.mu.Lock()
	defer s.mu.Unlock()
	if n, ok := s.items[id]; ok {
		n.val, n.used = v, now
		s.unlink(n)
		s.pushFront(n)
		return
	}
	var n *node[V]
	if len(s.items) >= s.cap {
		n = s.head.prev // evict the least recently used and reuse its node
		s.unlink(n)
		delete(s.items, n.id)
	} else {
		n = new(node[V])
	}
	n.id, n.val, n.used = id, v, now
	s.items[id] = n
	s.pushFront(n)
}

func (l *lru[V]) remove(id string) {
	s := l.shard(id)
	s.mu.Lock()
	if n, ok := s.items[id]; ok {
		s.unlink(n)
		delete(s.items, id)
	}
	s.mu.Unlock()
}

// removeIf drops every entry whose value matches; it walks every shard.
func (l *lru[V]) removeIf(match func(V) bool) int {
	removed := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		for id, n := range s.items {
			if match(n.val) {
				s.unlink(n)
				delete(s.items, id)
				removed++
			}
		}
		s.mu.Unlock()
	}
	return removed
}

func (l *lru[V]) len() int {
	total := 0
	for i := range l.shards {
		s := &l.shards[i]
		s.mu.Lock()
		total += len(s.items)
		s.mu.Unlock()
	}
	return total
}

func (s *shard[V]) unlink(n *node[V]) {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (s *shard[V]) pushFront(n *node[V]) {
	n.prev, n.next = &s.head, s.head.next
	s.head.next.prev = n
	s.head.next = n
}
