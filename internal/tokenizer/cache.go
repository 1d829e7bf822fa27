package tokenizer

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"unicode"
	"unicode/utf8"

	"github.com/zeebo/xxh3"
)

// CacheConfig sizes a CachingTokenizer.
type CacheConfig struct {
	// ChunkBytes is the target distance in bytes between cache cut points.
	// Smaller chunks reuse more of a partly shared prefix but cost more
	// lookups and entries. Default 256 (about 50–60 tokens of English).
	ChunkBytes int
	// MaxTokens bounds the ids held by the cache (4 bytes each, plus about
	// 64 bytes of bookkeeping per chunk); least recently used chunks (clock
	// approximation) are evicted beyond it. Default 1<<20 (about 6 MB).
	MaxTokens int
}

// DefaultCacheConfig returns the defaults described on CacheConfig.
func DefaultCacheConfig() CacheConfig {
	return CacheConfig{ChunkBytes: 256, MaxTokens: 1 << 20}
}

// ErrConfig is wrapped by Validate errors.
var ErrConfig = errors.New("tokenizer: invalid config")

// Validate lists every problem.
func (c CacheConfig) Validate() error {
	var errs []error
	if c.ChunkBytes < 16 {
		errs = append(errs, fmt.Errorf("%w: ChunkBytes %d < 16", ErrConfig, c.ChunkBytes))
	}
	if c.MaxTokens < 1 {
		errs = append(errs, fmt.Errorf("%w: MaxTokens %d < 1", ErrConfig, c.MaxTokens))
	}
	return errors.Join(errs...)
}

// CachingTokenizer remembers the ids of text chunks keyed by everything
// before them, so a request that starts with text already seen (a shared
// system prompt, a growing chat) only pays for its new part. Ids are always
// identical to a cold Encode: chunks end only at cut points where the
// tokenizer's pipeline provably cannot join across (an ASCII space after a
// non-space, for pipelines whose parts are all cut-safe). For any other
// tokenizer it passes through to the inner one.
//
// Concurrency: safe for concurrent use; lookups take a read lock, inserts and
// eviction a write lock.
type CachingTokenizer struct {
	*Native
	cfg CacheConfig

	mu      sync.RWMutex // guards entries, clock, tokens
	entries map[xxh3.Uint128]*cacheEntry
	clock   []xxh3.Uint128 // insertion ring for eviction
	hand    int
	tokens  int

	hits, misses atomic.Uint64
}

var _ Tokenizer = (*CachingTokenizer)(nil)

type cacheEntry struct {
	ids []uint32
	ref atomic.Bool // set on use; cleared by the clock hand
}

// NewCachingTokenizer wraps t with a prefix cache.
func NewCachingTokenizer(t *Native, cfg CacheConfig) (*CachingTokenizer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new caching tokenizer: %w", err)
	}
	return &CachingTokenizer{Native: t, cfg: cfg, entries: map[xxh3.Uint128]*cacheEntry{}}, nil
}

// CacheStats reports hits and misses (in chunks) and the ids held.
type CacheStats struct {
	Hits, Misses uint64
	Tokens       int
	Chunks       int
}

// Stats returns a snapshot of the counters.
func (c *CachingTokenizer) Stats() CacheStats {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return CacheStats{Hits: c.hits.Load(), Misses: c.misses.Load(), Tokens: c.tokens, Chunks: len(c.entries)}
}

// Encode implements Tokenizer.
func (c *CachingTokenizer) Encode(text string, addSpecialTokens bool) []uint32 {
	return c.AppendEncode(make([]uint32, 0, len(text)/3+4), text, addSpecialTokens)
}

// AppendEncode implements Tokenizer.
func (c *CachingTokenizer) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	dst, _ = c.appendEncode(dst, text, addSpecialTokens, nil)
	return dst
}

// AppendEncodeBounded is Native.AppendEncodeBounded through the cache; a
// chunk the bound stopped is not stored.
func (c *CachingTokenizer) AppendEncodeBounded(dst []uint32, text string, addSpecialTokens bool, b Bound) ([]uint32, error) {
	return c.appendEncode(dst, text, addSpecialTokens, &b)
}

func (c *CachingTokenizer) appendEncode(dst []uint32, text string, addSpecialTokens bool, b *Bound) ([]uint32, error) {
	if !c.prefixSafe || len(text) < 2*c.cfg.ChunkBytes {
		if b == nil {
			return c.Native.AppendEncode(dst, text, addSpecialTokens), nil
		}
		return c.Native.AppendEncodeBounded(dst, text, addSpecialTokens, *b)
	}
	start := len(dst)
	var key xxh3.Uint128
	pos := 0
	missing := false
	var err error
	// Polls the deadline across chunks (each appendRawBound polls only
	// within its own chunk).
	bd := newBound(b, start)
	for {
		cut := nextCut(text, pos+c.cfg.ChunkBytes)
		if cut < 0 {
			break
		}
		chunk := text[pos:cut]
		key = xxh3.HashString128Seed(chunk, key.Lo^key.Hi*0x9E3779B97F4A7C15)
		var e *cacheEntry
		if !missing {
			c.mu.RLock()
			e = c.entries[key]
			c.mu.RUnlock()
		}
		if e != nil {
			e.ref.Store(true)
			dst = append(dst, e.ids...)
			c.hits.Add(1)
			if bd.on && bd.after(len(dst), len(chunk)) {
				return dst[:start], bd.err
			}
		} else {
			// Later keys chain through this chunk, so they are new too (barring
			// a chunk evicted before its successors): skip their lookups.
			missing = true
			n := len(dst)
			if dst, err = c.appendRawBound(dst, chunk, pos == 0, b, start); err != nil {
				return dst[:start], err
			}
			c.misses.Add(1)
			c.insert(key, dst[n:])
			if bd.on && bd.after(len(dst), len(chunk)) {
				return dst[:start], bd.err
			}
		}
		pos = cut
	}
	if dst, err = c.appendRawBound(dst, text[pos:], pos == 0, b, start); err != nil {
		return dst[:start], err
	}
	if addSpecialTokens && c.post != nil {
		dst = c.post.apply(dst, start)
	}
	return dst, nil
}

// nextCut returns the first cut point at or after from: an index b with
// text[b] == ' ' and text[b-1] not whitespace, or -1. The cut is kept clear of
// the end so the text after it always has its first rune.
func nextCut(text string, from int) int {
	for b := max(from, 1); b < len(text)-1; b++ {
		if text[b] != ' ' {
			continue
		}
		switch text[b-1] {
		case ' ', '\t', '\n', '\r', '\v', '\f':
			continue
		}
		if text[b-1] >= 0x80 {
			// A multi-byte rune may be Unicode whitespace (e.g. U+3000).
			if r, _ := utf8.DecodeLastRuneInString(text[:b]); unicode.IsSpace(r) {
				continue
			}
		}
		return b
	}
	return -1
}

func (c *CachingTokenizer) insert(key xxh3.Uint128, ids []uint32) {
	e := &cacheEntry{ids: append([]uint32(nil), ids...)}
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[key]; ok {
		return
	}
	c.entries[key] = e
	c.clock = append(c.clock, key)
	c.tokens += len(ids)
	// Clock eviction: skip (and clear) recently used entries once.
	for c.tokens > c.cfg.MaxTokens && len(c.clock) > 0 {
		if c.hand >= len(c.clock) {
			c.hand = 0
		}
		k := c.clock[c.hand]
		old := c.entries[k]
		if old != nil && old.ref.Swap(false) {
			c.hand++
			continue
		}
		if old != nil {
			c.tokens -= len(old.ids)
			delete(c.entries, k)
		}
		last := len(c.clock) - 1
		c.clock[c.hand] = c.clock[last]
		c.clock = c.clock[:last]
	}
}
