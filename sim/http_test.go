package sim

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/sim/engine"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// streamResult is what a strict SSE client saw.
type streamResult struct {
	ttft   time.Duration
	text   string
	finish string
	usage  *openai.Usage
	chunks int
	roles  []string
}

// stream posts a streaming request and parses it with the strict reader.
func stream(t *testing.T, url string, body map[string]any) streamResult {
	t.Helper()
	body["stream"] = true
	b, _ := json.Marshal(body)
	start := time.Now()
	resp, err := http.Post(url, "application/json", bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		msg, _ := io.ReadAll(resp.Body)
		t.Fatalf("status %d %q: %s", resp.StatusCode, resp.Header.Get("Content-Type"), msg)
	}
	var res streamResult
	chat := strings.HasSuffix(url, "/chat/completions")
	err = openai.ReadAll(resp.Body, func(p []byte) error {
		if _, isErr := openai.DecodeError(p); isErr {
			return errors.New("error event: " + string(p))
		}
		res.chunks++
		if chat {
			var c openai.ChatCompletionChunk
			if err := json.Unmarshal(p, &c); err != nil {
				return err
			}
			if c.Usage != nil {
				res.usage = c.Usage
			}
			for _, ch := range c.Choices {
				if ch.Delta.Role != "" {
					res.roles = append(res.roles, ch.Delta.Role)
				}
				if ch.Delta.Content != nil && *ch.Delta.Content != "" && res.ttft == 0 {
					res.ttft = time.Since(start)
				}
				if ch.Delta.Content != nil {
					res.text += *ch.Delta.Content
				}
				if ch.FinishReason != nil {
					res.finish = *ch.FinishReason
				}
			}
			return nil
		}
		var c openai.Completion
		if err := json.Unmarshal(p, &c); err != nil {
			return err
		}
		if c.Object != openai.ObjectCompletion {
			return errors.New("object " + c.Object)
		}
		if c.Usage != nil {
			if len(c.Choices) != 0 {
				return errors.New("usage chunk with choices")
			}
			res.usage = c.Usage
		}
		for _, ch := range c.Choices {
			if res.ttft == 0 {
				res.ttft = time.Since(start)
			}
			res.text += ch.Text
			if ch.FinishReason != nil {
				res.finish = *ch.FinishReason
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return res
}

// A repeated prompt reports cached tokens and a shorter TTFT than its first
// run. What it compares is the engine's modelled prefill time
// (vllm:request_prefill_time_seconds: first token less scheduled), which
// is the part of the TTFT that prefix caching shortens. The TTFT itself
// also holds the queue time, and that includes how late the driver
// goroutine woke for an idle engine's arrival (stamped from wall time):
// on a loaded machine the repeat's TTFT read 0.0458 s against the first
// run's 0.1480 s, nearly all of it a starved wake-up. Once scheduled,
// the steps chain in modelled time, so a busy host cannot move the
// prefill time.
func TestRepeatedPromptCachedTokensAndShorterTTFT(t *testing.T) {
	s := startSim(t, func(c *Config) {
		c.Engine = engine.Config{BlockSize: 16, GPUBlocks: 2048, Profile: mustProfile(t, "7b-h100")}
		c.TimeScale = 2 // a 4,000-token prefill is ~150 ms modelled, ~75 ms wall
	})
	prompt := tokens(1, 4000)
	body := func() map[string]any {
		return map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 2, "ignore_eos": true,
			"stream_options": map[string]any{"include_usage": true}}
	}
	first := stream(t, s.URL()+"/v1/completions", body())
	if first.usage == nil || first.usage.CachedTokens() != 0 {
		t.Fatalf("first run usage %+v", first.usage)
	}
	firstPrefill, firstTTFT := metricSum(t, s, "vllm:request_prefill_time_seconds_sum"), metricSum(t, s, "vllm:time_to_first_token_seconds_sum")
	again := stream(t, s.URL()+"/v1/completions", body())
	if again.usage == nil || again.usage.CachedTokens() != 3984 {
		t.Fatalf("repeat: usage %+v, want 3984 cached tokens", again.usage)
	}
	repeatPrefill := metricSum(t, s, "vllm:request_prefill_time_seconds_sum") - firstPrefill
	repeatTTFT := metricSum(t, s, "vllm:time_to_first_token_seconds_sum") - firstTTFT
	if repeatPrefill <= 0 || repeatPrefill >= firstPrefill/4 {
		t.Fatalf("modelled prefill %.4fs on the repeat, %.4fs the first time (want well under a quarter)", repeatPrefill, firstPrefill)
	}
	t.Logf("modelled prefill first %.4fs, repeat %.4fs; modelled TTFT %.4fs and %.4fs; wall %v and %v",
		firstPrefill, repeatPrefill, firstTTFT, repeatTTFT, first.ttft, again.ttft)
}

// metricSum reads the sum over every series of one engine metric line
// (here a histogram's _sum, in modelled seconds) from /metrics.
func metricSum(t *testing.T, s *Server, name string) float64 {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 || f[0] != name && !strings.HasPrefix(f[0], name+"{") {
			continue
		}
		v, err := strconv.ParseFloat(f[len(f)-1], 64)
		if err != nil {
			t.Fatalf("metrics line %q: %v", line, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		t.Fatalf("no %s in /metrics", name)
	}
	return sum
}

func TestStreamingCompletionAndChatParseStrictly(t *testing.T) {
	s := startSim(t, nil)
	r := stream(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": "hello there",
		"max_tokens": 7, "stream_options": map[string]any{"include_usage": true}})
	if r.finish != "length" || r.usage == nil || r.usage.CompletionTokens != 7 || r.usage.PromptTokens != len("hello there") ||
		r.usage.TotalTokens != 7+len("hello there") || r.text == "" {
		t.Fatalf("completion stream %+v usage %+v", r, r.usage)
	}
	// Non-streaming gives the same deterministic text.
	code, b, hdr := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": "hello there", "max_tokens": 7},
		"X-Request-Id", "my-id")
	var c openai.Completion
	if code != 200 || json.Unmarshal(b, &c) != nil || c.Choices[0].Text != r.text || c.ID != "cmpl-my-id" || hdr.Get("X-Request-Id") != "my-id" {
		t.Fatalf("non-streaming %d %s (stream text %q)", code, b, r.text)
	}
	cr := stream(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model",
		"messages":   []map[string]any{{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}},
		"max_tokens": 5, "stream_options": map[string]any{"include_usage": true}})
	if len(cr.roles) != 1 || cr.roles[0] != "assistant" || cr.finish != "length" || cr.usage == nil || cr.usage.CompletionTokens != 5 {
		t.Fatalf("chat stream %+v", cr)
	}
	// Without include_usage there is no usage chunk.
	nr := stream(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": []int{1, 2, 3}, "max_tokens": 2})
	if nr.usage != nil {
		t.Fatal("usage chunk without include_usage")
	}
	// Several prompts: one choice each.
	code, b, _ = post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": [][]int{{1, 2, 3}, {4, 5}}, "max_tokens": 3})
	if code != 200 || json.Unmarshal(b, &c) != nil || len(c.Choices) != 2 || c.Usage.PromptTokens != 5 || c.Usage.CompletionTokens != 6 {
		t.Fatalf("two prompts: %d %s", code, b)
	}
}

func TestMinTokensAndEOS(t *testing.T) {
	s := startSim(t, func(c *Config) { c.EOSRate = 0.3 })
	stops := 0
	for i := 0; i < 10; i++ {
		code, b, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": tokens(10*i+1, 5),
			"max_tokens": 40, "min_tokens": 4})
		var c openai.Completion
		if code != 200 || json.Unmarshal(b, &c) != nil {
			t.Fatalf("%d %s", code, b)
		}
		n := c.Usage.CompletionTokens
		if n < 4 || n > 40 {
			t.Fatalf("generated %d outside [min_tokens, max_tokens]", n)
		}
		if *c.Choices[0].FinishReason == "stop" {
			stops++
			if n == 40 {
				t.Fatal("stop at max_tokens")
			}
		}
	}
	if stops == 0 {
		t.Fatal("EOSRate 0.3 never stopped early in 10 requests of 40 tokens")
	}
	// ignore_eos always runs to max_tokens.
	c := complete(t, s, tokens(1, 5), 40)
	if c.Usage.CompletionTokens != 40 || *c.Choices[0].FinishReason != "length" {
		t.Fatalf("ignore_eos: %+v", c.Usage)
	}
}

func TestErrorsAreOpenAIBodies(t *testing.T) {
	s := startSim(t, nil)
	cases := []struct {
		path string
		body any
		want int
	}{
		{"/v1/completions", map[string]any{"model": "other", "prompt": "x"}, http.StatusNotFound},
		{"/v1/completions", map[string]any{"model": "test-model"}, http.StatusBadRequest},
		{"/v1/completions", map[string]any{"model": "test-model", "prompt": "x", "max_tokens": 100000}, http.StatusBadRequest},
		{"/v1/completions", map[string]any{"model": "test-model", "prompt": []int{-1}}, http.StatusBadRequest},
		{"/v1/chat/completions", map[string]any{"model": "test-model", "messages": []any{}}, http.StatusBadRequest},
		{"/v1/nothing", map[string]any{}, http.StatusNotFound},
	}
	for _, c := range cases {
		code, b, _ := post(t, s.URL()+c.path, c.body)
		d, ok := openai.DecodeError(b)
		if code != c.want || !ok || d.Message == "" || d.Type == "" {
			t.Errorf("%s %v: %d %s", c.path, c.body, code, b)
		}
	}
	code, b, _ := post(t, s.URL()+"/v1/completions", "{not json")
	if _, ok := openai.DecodeError(b); code != http.StatusBadRequest || !ok {
		t.Errorf("bad json: %d %s", code, b)
	}
}

func TestModelsTokenizeHealth(t *testing.T) {
	s := startSim(t, nil)
	resp, err := http.Get(s.URL() + "/health")
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("health %v %v", resp, err)
	}
	resp.Body.Close()
	resp, err = http.Get(s.URL() + "/v1/models")
	if err != nil {
		t.Fatal(err)
	}
	var ml openai.ModelList
	if err := json.NewDecoder(resp.Body).Decode(&ml); err != nil || len(ml.Data) != 1 || ml.Data[0].ID != "test-model" || ml.Data[0].MaxModelLen != 1024 {
		t.Fatalf("models %+v %v", ml, err)
	}
	resp.Body.Close()
	code, b, _ := post(t, s.URL()+"/tokenize", map[string]any{"model": "test-model", "prompt": "abc"})
	var tr openai.TokenizeResponse
	if code != 200 || json.Unmarshal(b, &tr) != nil || tr.Count != 3 || tr.Tokens[0] != 'a' {
		t.Fatalf("tokenize %d %s", code, b)
	}
	// Chat tokenization equals what the chat endpoint sends to the engine.
	msgs := []map[string]any{{"role": "user", "content": "hi"}}
	code, b, _ = post(t, s.URL()+"/tokenize", map[string]any{"model": "test-model", "messages": msgs})
	if code != 200 || json.Unmarshal(b, &tr) != nil {
		t.Fatalf("tokenize chat %d %s", code, b)
	}
	code, b, _ = post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 1})
	var cc openai.ChatCompletion
	if code != 200 || json.Unmarshal(b, &cc) != nil || cc.Usage.PromptTokens != tr.Count || cc.Object != openai.ObjectChat {
		t.Fatalf("chat %d %s vs tokenize count %d", code, b, tr.Count)
	}
}

// scrape returns one sample value per "name{label=value}" (histograms: _count and _sum).
func scrape(t *testing.T, s *Server) map[string]float64 {
	t.Helper()
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("metrics do not parse: %v", err)
	}
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			key := name
			for _, l := range m.GetLabel() {
				if l.GetName() == "finished_reason" || l.GetName() == "engine" {
					key += "{" + l.GetName() + "=" + l.GetValue() + "}"
				}
			}
			switch f.GetType().String() {
			case "COUNTER":
				out[key] = m.GetCounter().GetValue()
			case "GAUGE":
				out[key] = m.GetGauge().GetValue()
			case "HISTOGRAM":
				out[key+"_count"] = float64(m.GetHistogram().GetSampleCount())
				out[key+"_sum"] = m.GetHistogram().GetSampleSum()
			}
			out["type:"+name] = float64(f.GetType())
		}
	}
	return out
}

func TestMetricsParseAndMove(t *testing.T) {
	s := startSim(t, func(c *Config) { c.TimeScale = 1 }) // the long request streams for ~0.5 s
	m0 := scrape(t, s)
	for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info"} {
		if m0["type:"+name] != 1 { // GAUGE
			t.Errorf("%s: type %v, want gauge", name, m0["type:"+name])
		}
	}
	for _, name := range []string{"vllm:prefix_cache_queries_total", "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total", "vllm:generation_tokens_total", "vllm:num_preemptions_total"} {
		if v, ok := m0["type:"+name]; !ok || v != 0 { // COUNTER
			t.Errorf("%s: missing or not a counter", name)
		}
	}
	// The runtime's and the process's series, as every kvmesh process's.
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes"} {
		if _, ok := m0["type:"+name]; !ok {
			t.Errorf("%s missing from /metrics", name)
		}
	}
	e := "{engine=0}"
	// A long streaming request is visible as running while it streams.
	done := make(chan streamResult, 1)
	go func() {
		defer close(done) // a failing helper ends this goroutine; the test then stops below
		done <- stream(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": tokens(1, 40), "max_tokens": 400, "ignore_eos": true})
	}()
	testutil.WaitFor(t, 10*time.Second, "running gauge to show the request", func() bool {
		m := scrape(t, s)
		return m["vllm:num_requests_running"+e] == 1 && m["vllm:kv_cache_usage_perc"+e] > 0 && m["vllm:generation_tokens_total"+e] >= 3
	})
	// vLLM observes each token's gap as it is sampled: the histogram moves
	// while the request still runs (held: no step can finish it).
	s.ranks[0].hold(true)
	t.Cleanup(func() { s.ranks[0].hold(false) })
	testutil.WaitFor(t, 10*time.Second, "inter-token latency observed before the request finishes", func() bool {
		m := scrape(t, s)
		return m["vllm:num_requests_running"+e] == 1 && m["vllm:inter_token_latency_seconds"+e+"_count"] >= 2
	})
	s.ranks[0].hold(false)
	if _, ok := <-done; !ok {
		t.FailNow()
	}
	complete(t, s, tokens(1, 40), 1)
	m1 := scrape(t, s)
	checks := []struct {
		name string
		want float64
	}{
		{"vllm:num_requests_running" + e, 0},
		{"vllm:prompt_tokens_total" + e, 80},
		{"vllm:generation_tokens_total" + e, 401},
		{"vllm:prefix_cache_queries_total" + e, 80},
		{"vllm:prefix_cache_hits_total" + e, 36}, // (40-1)/4 = 9 blocks of 4
		{"vllm:request_success_total{engine=0}{finished_reason=length}", 2},
		{"vllm:time_to_first_token_seconds" + e + "_count", 2},
		{"vllm:inter_token_latency_seconds" + e + "_count", 399},
		{"vllm:e2e_request_latency_seconds" + e + "_count", 2},
	}
	for _, c := range checks {
		if got := m1[c.name]; got != c.want {
			t.Errorf("%s = %v, want %v", c.name, got, c.want)
		}
	}
	if m1["vllm:e2e_request_latency_seconds"+e+"_sum"] <= 0 {
		t.Error("e2e latency sum did not move")
	}
}

// TestCreatedIsTheRequestsTime: "created" is stamped per request, as vLLM
// does, not the server's start (a client sorting or expiring by it saw
// every answer as old as the process).
func TestCreatedIsTheRequestsTime(t *testing.T) {
	s := startSim(t, nil)
	started := time.Now().Unix()
	testutil.WaitFor(t, 5*time.Second, "the next second", func() bool { return time.Now().Unix() > started })
	sent := time.Now().Unix()
	if c := complete(t, s, tokens(0, 8), 2); c.Created < sent {
		t.Fatalf("created %d, sent at %d (the server started at %d)", c.Created, sent, started)
	}
}

// The cache config's num_gpu_blocks is the whole server's, every
// data-parallel engine's blocks summed on each engine's series, as vLLM's
// API server reports it (the sidecar gossips it as the engine's capacity).
func TestCacheConfigSumsDataParallelBlocks(t *testing.T) {
	s := startSim(t, func(c *Config) { c.DP = 2; c.Engine.GPUBlocks = 1500 })
	resp, err := http.Get(s.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	seen := 0
	for _, m := range fams["vllm:cache_config_info"].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "num_gpu_blocks" {
				seen++
				if l.GetValue() != "3000" {
					t.Errorf("num_gpu_blocks %s, want 3000 (2 ranks of 1500)", l.GetValue())
				}
			}
		}
	}
	if seen != 2 {
		t.Errorf("%d cache_config_info series, want one per rank (2)", seen)
	}
}
