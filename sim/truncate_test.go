package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// TestTruncatePromptTokens: truncate_prompt_tokens k keeps the prompt's
// last k tokens, as vLLM does (on the left): the usage and the prompt
// token ids count what is kept, and the cache holds it, so two prompts
// with different heads and the same tail share their blocks; -1 is the
// context length; past it is vLLM's 400, as is a value below -1.
func TestTruncatePromptTokens(t *testing.T) {
	s := startSim(t, nil)
	url := s.URL() + "/v1/completions"
	complete := func(prompt []uint32, truncate any) (int, openai.Completion, string) {
		t.Helper()
		code, b, _ := post(t, url, map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 2,
			"return_token_ids": true, "truncate_prompt_tokens": truncate})
		var c openai.Completion
		if code == http.StatusOK && (json.Unmarshal(b, &c) != nil || len(c.Choices) != 1 || c.Usage == nil) {
			t.Fatalf("%s", b)
		}
		return code, c, string(b)
	}
	tail := tokens(9000, 64)
	a := append(tokens(100, 40), tail...)
	_, c, _ := complete(a, 64)
	if c.Usage.PromptTokens != 64 || !slices.Equal(c.Choices[0].PromptTokenIDs, tail) {
		t.Fatalf("truncated to 64: %d prompt tokens, ids %v", c.Usage.PromptTokens, c.Choices[0].PromptTokenIDs)
	}
	// Another head, the same tail: the kept tokens hit the cache.
	_, c, _ = complete(append(tokens(500, 70), tail...), 64)
	if got := c.Usage.CachedTokens(); got < 48 {
		t.Errorf("the same 64-token tail after another head: %d cached tokens, want its full blocks", got)
	}
	if _, c, _ = complete(a, -1); c.Usage.PromptTokens != len(a) {
		t.Errorf("-1: %d prompt tokens, want all %d", c.Usage.PromptTokens, len(a))
	}
	if _, c, _ = complete(a, 1000); c.Usage.PromptTokens != len(a) {
		t.Errorf("a bound above the prompt: %d prompt tokens, want %d", c.Usage.PromptTokens, len(a))
	}
	if code, _, b := complete(a, s.cfg.Engine.MaxModelLen+1); code != http.StatusBadRequest || !strings.Contains(b, "greater than max_model_len") {
		t.Errorf("past the context length: %d %s", code, b)
	}
	if code, _, b := complete(a, -2); code != http.StatusBadRequest {
		t.Errorf("-2: %d %s", code, b)
	}
	// Chat: the rendered prompt's tail.
	code, b, _ := post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "max_tokens": 2, "truncate_prompt_tokens": 5,
		"messages": []map[string]string{{"role": "user", "content": "a message long enough to be cut down to five tokens"}}})
	var ch openai.ChatCompletion
	if code != http.StatusOK || json.Unmarshal(b, &ch) != nil || ch.Usage == nil || ch.Usage.PromptTokens != 5 {
		t.Errorf("chat truncated to 5: %d %s", code, b)
	}
}
