package tokenizer

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

func newCache(t testing.TB, tk *Native, cfg CacheConfig) *CachingTokenizer {
	t.Helper()
	c, err := NewCachingTokenizer(tk, cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// TestCacheIdenticalToCold: shared prefixes with many different suffixes,
// cut at arbitrary points, give the ids of a cold encode, and the cache is used.
func TestCacheIdenticalToCold(t *testing.T) {
	for _, name := range modelNames {
		t.Run(name, func(t *testing.T) {
			tk := loadNamed(t, name)
			if !tk.prefixSafe {
				t.Fatalf("%s should be prefix-safe", name)
			}
			c := newCache(t, tk, CacheConfig{ChunkBytes: 64, MaxTokens: 1 << 20})
			text := longText(t)[:8000]
			var texts []string
			for _, g := range loadGolden(t, name).Cases {
				texts = append(texts, g.Text)
			}
			rng := rand.New(rand.NewPCG(1, 2))
			for i := 0; i < 20; i++ {
				cut := rng.IntN(len(text))
				suffix := texts[rng.IntN(len(texts))]
				texts = append(texts, text[:cut]+suffix, text[:cut], suffix+text[:cut])
			}
			for round := 0; round < 2; round++ {
				for i, s := range texts {
					for _, special := range []bool{round == 0, true} {
						want := tk.Encode(s, special)
						got := c.Encode(s, special)
						if d := firstDiff(got, want); d >= 0 {
							t.Fatalf("round %d text %d special=%v: differs from cold at %d", round, i, special, d)
						}
					}
				}
			}
			if st := c.Stats(); st.Hits == 0 || st.Chunks == 0 {
				t.Fatalf("cache unused: %+v", st)
			}
		})
	}
}

// TestCacheBounded: the cache never holds more than MaxTokens ids and still
// answers correctly after evictions.
func TestCacheBounded(t *testing.T) {
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	c := newCache(t, tk, CacheConfig{ChunkBytes: 32, MaxTokens: 500})
	text := longText(t)
	for i := 0; i < 30; i++ {
		s := text[i*1000 : i*1000+3000]
		if got, want := c.Encode(s, true), tk.Encode(s, true); !slices.Equal(got, want) {
			t.Fatalf("text %d differs from cold", i)
		}
		if st := c.Stats(); st.Tokens > 500 {
			t.Fatalf("cache holds %d ids > 500", st.Tokens)
		}
	}
	if st := c.Stats(); st.Chunks == 0 {
		t.Fatalf("nothing cached: %+v", st)
	}
}

// TestCacheConcurrent: many goroutines sharing prefixes (run with -race).
func TestCacheConcurrent(t *testing.T) {
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	c := newCache(t, tk, CacheConfig{ChunkBytes: 64, MaxTokens: 4000})
	base := longText(t)[:6000]
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for g := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range 10 {
				s := base[:1000+g*500] + fmt.Sprintf(" question %d from %d?", i, g)
				if !slices.Equal(c.Encode(s, false), tk.Encode(s, false)) {
					errs <- fmt.Errorf("goroutine %d text %d differs", g, i)
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}

func TestCacheConfigValidate(t *testing.T) {
	if err := DefaultCacheConfig().Validate(); err != nil {
		t.Fatal(err)
	}
	if _, err := NewCachingTokenizer(nil, CacheConfig{}); err == nil {
		t.Fatal("zero config accepted")
	}
}

// TestCacheMetrics: the collectors report the cache's counters.
func TestCacheMetrics(t *testing.T) {
	tk := loadNamed(t, "bert-base-uncased")
	c := newCache(t, tk, CacheConfig{ChunkBytes: 16, MaxTokens: 1000})
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(c.Collectors("bert")...)
	text := strings.Repeat("the quick brown fox jumps over the lazy dog ", 4)
	c.Encode(text, true)
	c.Encode(text, true)
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		m := mf.GetMetric()[0]
		if m.GetCounter() != nil {
			got[mf.GetName()] = m.GetCounter().GetValue()
		} else {
			got[mf.GetName()] = m.GetGauge().GetValue()
		}
	}
	st := c.Stats()
	if got["kvmesh_tokenizer_cache_hits_total"] != float64(st.Hits) || st.Hits == 0 ||
		got["kvmesh_tokenizer_cache_misses_total"] != float64(st.Misses) || st.Misses == 0 ||
		got["kvmesh_tokenizer_cache_tokens"] != float64(st.Tokens) {
		t.Fatalf("metrics %v, stats %+v", got, st)
	}
}
