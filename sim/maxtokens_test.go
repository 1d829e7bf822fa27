package sim

import (
	"encoding/json"
	"net/http"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// Completions read max_tokens as vLLM does: absent is 16 tokens, null is
// the context left after the prompt (capped as chat's default is), a number
// is that number.
func TestCompletionsMaxTokensNull(t *testing.T) {
	s := startSim(t, func(c *Config) { c.Engine.MaxModelLen, c.Engine.GPUBlocks = 4096, 2048 })
	for _, tc := range []struct {
		name string
		body map[string]any
		want int
	}{
		{"absent", map[string]any{"model": "test-model", "prompt": tokens(1, 8)}, 16},
		{"null", map[string]any{"model": "test-model", "prompt": tokens(1, 8), "max_tokens": nil}, 256},
		{"null, a long prompt", map[string]any{"model": "test-model", "prompt": tokens(1, 4000), "max_tokens": nil}, 96},
		{"a number", map[string]any{"model": "test-model", "prompt": tokens(1, 8), "max_tokens": 40}, 40},
	} {
		code, b, _ := post(t, s.URL()+"/v1/completions", tc.body)
		if code != http.StatusOK {
			t.Fatalf("%s: status %d: %s", tc.name, code, b)
		}
		var cr openai.Completion
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatal(err)
		}
		if cr.Usage.CompletionTokens != tc.want {
			t.Errorf("%s: %d completion tokens, want %d", tc.name, cr.Usage.CompletionTokens, tc.want)
		}
	}
}
