package tokenizer

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unsafe"
)

type stopWith struct{ err error }

func (s stopWith) Stopped() error { return s.err }

var errGone = errors.New("client gone")

// TestBoundMaxTokens: an encoding with more ids than MaxTokens stops with
// ErrTooManyTokens and leaves dst as it came; one with exactly MaxTokens
// does not stop and gives the unbounded ids; through the cache too, where
// the stopped chunks are not stored.
func TestBoundMaxTokens(t *testing.T) {
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	text := longText(t)
	want := tk.Encode(text, true)
	raw := len(tk.Encode(text, false))
	cache := newCache(t, tk, DefaultCacheConfig())
	for name, enc := range map[string]func([]uint32, string, bool, Bound) ([]uint32, error){
		"native": tk.AppendEncodeBounded, "cache": cache.AppendEncodeBounded,
	} {
		dst := []uint32{7, 8}
		got, err := enc(dst, text, true, Bound{MaxTokens: raw})
		if err != nil || !slices.Equal(got[2:], want) {
			t.Fatalf("%s: at the limit: err %v, ids equal %v", name, err, slices.Equal(got[2:], want))
		}
		got, err = enc(dst, text, true, Bound{MaxTokens: raw - 1})
		if !errors.Is(err, ErrTooManyTokens) || !slices.Equal(got, dst) {
			t.Fatalf("%s: over the limit: err %v, dst %d ids", name, err, len(got))
		}
	}
	// A run of spaces is one word: stopped after it, not inside it.
	if _, err := tk.AppendEncodeBounded(nil, strings.Repeat(" ", 1<<16), false, Bound{MaxTokens: 10}); !errors.Is(err, ErrTooManyTokens) {
		t.Fatalf("run: %v", err)
	}
	fresh := newCache(t, tk, DefaultCacheConfig())
	if _, err := fresh.AppendEncodeBounded(nil, text, true, Bound{MaxTokens: 100}); !errors.Is(err, ErrTooManyTokens) {
		t.Fatal(err)
	}
	if st := fresh.Stats(); st.Tokens > 100+len(want)/10 {
		t.Fatalf("cache holds %d tokens of a stopped encoding", st.Tokens)
	}
}

// TestBoundStopsLongWord: a past deadline or a Stopper that says stop ends
// the merge of one long word (128 KiB of spaces: some 30 polls of pollMerges steps,
// twice pollBytes) and of many chunks of ordinary text, with the reason.
func TestBoundStopsLongWord(t *testing.T) {
	tk := withoutWordCache(loadNamed(t, "Meta-Llama-3-8B-Instruct"))
	cache := newCache(t, tk, DefaultCacheConfig())
	spaces := strings.Repeat(" ", 1<<17)
	text := strings.Repeat(longText(t), 4)
	past := time.Now().Add(-time.Second)
	for _, tc := range []struct {
		b    Bound
		want error
	}{
		{Bound{Deadline: past}, ErrDeadline},
		{Bound{Stop: stopWith{errGone}}, errGone},
	} {
		for name, enc := range map[string]func([]uint32, string, bool, Bound) ([]uint32, error){
			"native": tk.AppendEncodeBounded, "cache": cache.AppendEncodeBounded,
		} {
			for _, in := range []string{spaces, text} {
				if ids, err := enc(nil, in, true, tc.b); !errors.Is(err, tc.want) || len(ids) != 0 {
					t.Fatalf("%s, %d bytes: err %v (want %v), %d ids", name, len(in), err, tc.want, len(ids))
				}
			}
		}
	}
	// A Stopper that never stops and a future deadline change nothing.
	want := tk.Encode(spaces, true)
	got, err := tk.AppendEncodeBounded(nil, spaces, true, Bound{Deadline: time.Now().Add(time.Hour), Stop: stopWith{}})
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("unstopped: %v", err)
	}
}

// TestWordCacheEvicts: a cache filled with junk words still takes new
// words (the old cache stopped inserting once full), and stays bounded.
func TestWordCacheEvicts(t *testing.T) {
	c := newWordCache(wordCacheCapacity)
	for i := range 2 * wordCacheCapacity {
		c.put(fmt.Sprintf("junk%07d", i), []uint32{uint32(i)})
	}
	if n := c.len(); n > wordCacheCapacity {
		t.Fatalf("%d words cached, capacity %d", n, wordCacheCapacity)
	}
	// A word used since the hand's last pass survives a turn of inserts.
	c.put("hello", []uint32{1, 2})
	for i := range 40 {
		if _, ok := c.appendIDs(nil, "hello"); !ok {
			t.Fatalf("hello evicted after %d rounds", i)
		}
		for k := range wordCacheCapacity / 4 {
			c.put(fmt.Sprintf("%05d-more%04d", k, i), []uint32{3})
		}
	}
	if ids, ok := c.appendIDs([]uint32{9}, "hello"); !ok || !slices.Equal(ids, []uint32{9, 1, 2}) {
		t.Fatalf("hello: %v %v", ids, ok)
	}
}

// TestWordCacheCopiesWord: a cached word is copied, so a caller reusing the
// buffer under it (the ingress encodes views of request bodies) cannot
// change what the cache holds. Before, the map kept the caller's view: once
// the buffer held another word, a lookup of that word found the first
// word's ids whenever the two hashes' control bits agreed (1 in 128 per
// trial here, so the trials make that certain in practice). Each trial
// needs a new map (its hash seed is the chance), not a full-size cache: a
// slot a shard suffices, where wordCacheCapacity allocated 100 KB a trial
// (420 MB in all, 49 s under -race on a loaded machine).
func TestWordCacheCopiesWord(t *testing.T) {
	const trials = 4000
	// Words of each shard, for the word b of a's shard: formatted once, as
	// formatting a word per shard tried each trial was most of the cost.
	var byShard [wordCacheShards][]string
	for i, full := 0, 0; full < wordCacheShards; i++ {
		w := fmt.Sprintf("bz%08d", i)
		if sh := &byShard[shardOf(w)]; len(*sh) < trials/wordCacheShards {
			if *sh = append(*sh, w); len(*sh) == trials/wordCacheShards {
				full++
			}
		}
	}
	for trial := range trials {
		c := newWordCache(wordCacheShards)
		a := fmt.Sprintf("aw%08d", trial)
		sh := byShard[shardOf(a)]
		b := sh[trial%len(sh)]
		buf := []byte(a)
		c.put(unsafe.String(&buf[0], len(buf)), []uint32{1})
		copy(buf, b)
		if ids, ok := c.appendIDs(nil, strings.Clone(b)); ok {
			t.Fatalf("trial %d: %q, never stored, has the ids %v of %q", trial, b, ids, a)
		}
		if _, ok := c.appendIDs(nil, a); !ok {
			t.Fatalf("trial %d: %q lost", trial, a)
		}
	}
}
