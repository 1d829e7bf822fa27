package sim

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// TestParallelSampling: n > 1 answers n choices per prompt, as vLLM does
// (choice k = prompt i × n + sample j), each sample its own text and
// length; the usage counts each prompt once and every sample's tokens;
// temperature 0 makes the samples one; a stream opens every choice with
// its role, then streams each by index, and carries the same texts.
func TestParallelSampling(t *testing.T) {
	s := startSim(t, func(c *Config) { c.EOSRate = 0.15 })
	url := s.URL()

	// Completions: two prompts × n 3.
	prompts := [][]uint32{tokens(100, 12), tokens(300, 9)}
	code, b, _ := post(t, url+"/v1/completions", map[string]any{"model": "test-model", "prompt": prompts, "n": 3, "max_tokens": 24, "return_token_ids": true})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	var cr openai.Completion
	if err := json.Unmarshal(b, &cr); err != nil {
		t.Fatal(err)
	}
	if len(cr.Choices) != 6 {
		t.Fatalf("%d choices, want 6: %s", len(cr.Choices), b)
	}
	completion, lengths := 0, map[int]bool{}
	texts := map[string]bool{}
	for k, c := range cr.Choices {
		if c.Index != k || c.Text == "" {
			t.Errorf("choice %d: index %d text %q", k, c.Index, c.Text)
		}
		texts[c.Text] = true
		lengths[len(c.TokenIDs)] = true
		completion += len(c.TokenIDs)
	}
	if len(texts) != 6 {
		t.Errorf("%d distinct texts among 6 samples", len(texts))
	}
	if len(lengths) < 2 {
		t.Errorf("every sample the same length %v: samples draw their own EOS", lengths)
	}
	if u := cr.Usage; u.PromptTokens != 12+9 || u.CompletionTokens != completion || u.TotalTokens != u.PromptTokens+u.CompletionTokens {
		t.Errorf("usage %+v: want prompt 21 (each prompt once), completion %d (every sample)", u, completion)
	}

	// Chat, n 4, temperature 0: one answer four times.
	msgs := []map[string]string{{"role": "user", "content": "sample me"}}
	code, b, _ = post(t, url+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs, "n": 4, "temperature": 0, "max_tokens": 16})
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	var greedy openai.ChatCompletion
	if err := json.Unmarshal(b, &greedy); err != nil {
		t.Fatal(err)
	}
	if len(greedy.Choices) != 4 {
		t.Fatalf("%d chat choices, want 4", len(greedy.Choices))
	}
	for k, c := range greedy.Choices {
		if c.Index != k || c.Message.Content != greedy.Choices[0].Message.Content {
			t.Errorf("greedy choice %d: index %d %q, want choice 0's %q", k, c.Index, c.Message.Content, greedy.Choices[0].Message.Content)
		}
	}

	// Chat, n 3, streamed and not: the same texts.
	body := map[string]any{"model": "test-model", "messages": msgs, "n": 3, "max_tokens": 16}
	code, b, _ = post(t, url+"/v1/chat/completions", body)
	var full openai.ChatCompletion
	if err := json.Unmarshal(b, &full); code != http.StatusOK || err != nil || len(full.Choices) != 3 {
		t.Fatalf("status %d %v: %s", code, err, b)
	}
	body["stream"], body["stream_options"] = true, map[string]any{"include_usage": true}
	evs := streamData(t, url+"/v1/chat/completions", body)
	got := make([]string, 3)
	roles, finished := 0, 0
	var usage map[string]any
	for e, m := range evs {
		if u, ok := m["usage"].(map[string]any); ok {
			usage = u
			continue
		}
		c := choice0(t, m)
		i := int(c["index"].(float64))
		d, _ := c["delta"].(map[string]any)
		if d["role"] == "assistant" {
			if e != i {
				t.Errorf("event %d opens choice %d: every choice's role comes first, in order", e, i)
			}
			roles++
		}
		s, _ := d["content"].(string)
		got[i] += s
		if c["finish_reason"] != nil {
			finished++
		}
	}
	if roles != 3 || finished != 3 {
		t.Errorf("%d role chunks and %d finish reasons, want 3 of each", roles, finished)
	}
	for k := range got {
		if got[k] != full.Choices[k].Message.Content {
			t.Errorf("streamed choice %d %q, not streamed %q", k, got[k], full.Choices[k].Message.Content)
		}
	}
	if usage == nil || int(usage["prompt_tokens"].(float64)) != full.Usage.PromptTokens || int(usage["completion_tokens"].(float64)) != full.Usage.CompletionTokens {
		t.Errorf("stream usage %v, not streamed %+v", usage, full.Usage)
	}

	// Bounds.
	for _, n := range []int{0, openai.MaxN + 1} {
		if code, b, _ := post(t, url+"/v1/completions", map[string]any{"model": "test-model", "prompt": "x", "n": n}); code != http.StatusBadRequest {
			t.Errorf("n %d: status %d %s, want 400", n, code, b)
		}
	}
}
