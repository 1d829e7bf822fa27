package sidecar

import (
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// cacheInfo is vLLM's cache config info series of one DP engine.
func cacheInfo(engine, blocks string) string {
	return `vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="` + engine + `",enable_prefix_caching="True",model_name="m",num_cpu_blocks="0",num_gpu_blocks="` + blocks + `"} 1` + "\n"
}

// The engine's KV capacity: vLLM's num_gpu_blocks label (each DP engine's
// series carries the front end's sum over them, so the largest is taken,
// not their sum), SGLang's token capacity. A label that is no block count
// is left out, and reported as bad for the warning.
func TestParseLoadCapacity(t *testing.T) {
	const typ = "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n# TYPE vllm:cache_config_info gauge\n"
	for _, tc := range []struct {
		name, text string
		blocks     int
		tokens     int64
		bad        string
	}{
		{"vllm", typ + cacheInfo("0", "4096"), 4096, 0, ""},
		{"vllm dp engines", typ + cacheInfo("0", "8192") + cacheInfo("1", "8192"), 8192, 0, ""},
		{"vllm none", typ + cacheInfo("0", "None"), 0, 0, "None"},
		{"vllm zero", typ + cacheInfo("0", "0"), 0, 0, "0"},
		{"vllm negative", typ + cacheInfo("0", "-5"), 0, 0, "-5"},
		{"vllm fraction", typ + cacheInfo("0", "12.5"), 0, 0, "12.5"},
		{"vllm absurd", typ + cacheInfo("0", "99999999999"), 0, 0, "99999999999"},
		{"vllm one bad series", typ + cacheInfo("0", "None") + cacheInfo("1", "2048"), 2048, 0, "None"},
		{"vllm no label", "vllm:cache_config_info{block_size=\"16\"} 1\n", 0, 0, ""},
		{"sglang", "# TYPE sglang:max_total_num_tokens gauge\nsglang:max_total_num_tokens{model_name=\"m\",tp_rank=\"0\"} 471258\n", 0, 471258, ""},
		{"sglang broken", "sglang:max_total_num_tokens NaN\n", 0, 0, ""},
		{"sglang negative", "sglang:max_total_num_tokens -3\n", 0, 0, ""},
	} {
		got, err := parseLoad(strings.NewReader(tc.text))
		if err != nil || got.GPUBlocks != tc.blocks || got.KVTokens != tc.tokens || got.badGPUBlocks != tc.bad {
			t.Errorf("%s: got blocks %d tokens %d bad %q, %v; want %d, %d, %q", tc.name, got.GPUBlocks, got.KVTokens, got.badGPUBlocks, err, tc.blocks, tc.tokens, tc.bad)
		}
	}
	for _, tc := range []struct {
		l         Load
		blockSize int
		want      int
	}{
		{Load{GPUBlocks: 4096}, 16, 4096},
		{Load{GPUBlocks: 4096}, 0, 4096}, // vLLM's count needs no block size
		{Load{KVTokens: 471258}, 16, 29453},
		{Load{KVTokens: 471258}, 1, 471258},
		{Load{KVTokens: 471258}, 0, 0},                     // block size not known yet
		{Load{KVTokens: 1 << 40}, 1, 0},                    // absurd
		{Load{GPUBlocks: 100, KVTokens: 1 << 20}, 16, 100}, // vLLM's count first
		{Load{}, 16, 0},
	} {
		if got := tc.l.capacity(tc.blockSize); got != tc.want {
			t.Errorf("capacity of %+v at block size %d: %d, want %d", tc.l, tc.blockSize, got, tc.want)
		}
	}
}

// The capacity is read at every scrape: an engine restarted with another
// cache size is gossiped with the new one, and one whose label turns bad
// with none (0: the terms sized by it stay off), warned about once.
func TestScrapeFollowsCapacity(t *testing.T) {
	var body atomic.Value
	body.Store("vllm:num_requests_running 1\n" + cacheInfo("0", "4096"))
	var hits atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		hits.Add(1)
		_, _ = w.Write([]byte(body.Load().(string)))
	}))
	t.Cleanup(srv.Close)
	var logs testutil.SyncBuffer
	_, e := polledEngine(t, srv.URL, &logs, true)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); e.scrapeLoop(ctx, http.DefaultClient, srv.URL) }()
	defer func() { cancel(); <-done }()
	blocks := func() int { e.mu.Lock(); defer e.mu.Unlock(); return e.load.capacity(e.st.blockSize) }

	testutil.WaitFor(t, 10*time.Second, "the capacity scraped", func() bool { return blocks() == 4096 })
	body.Store("vllm:num_requests_running 1\n" + cacheInfo("0", "8192"))
	testutil.WaitFor(t, 10*time.Second, "the restarted engine's capacity", func() bool { return blocks() == 8192 })
	body.Store("vllm:num_requests_running 1\n" + cacheInfo("0", "None"))
	testutil.WaitFor(t, 10*time.Second, "a bad capacity dropped", func() bool { return blocks() == 0 })
	n := hits.Load()
	testutil.WaitFor(t, 10*time.Second, "more scrapes of the bad capacity", func() bool { return hits.Load() >= n+3 })
	if c := strings.Count(logs.String(), "not a block count"); c != 1 {
		t.Fatalf("%d warnings of one bad capacity:\n%s", c, logs.String())
	}
}
