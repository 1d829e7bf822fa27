package sim

import (
	"net/http"
	"testing"
)

// TestContinuousUsage: with stream_options continuous_usage_stats (and
// include_usage) every chunk carries a usage, as vLLM writes it: its
// choice's prompt tokens and the tokens that choice generated so far (a
// chat role chunk 0); the final usage-only chunk counts every choice.
// Without it the chunks' usage is null.
func TestContinuousUsage(t *testing.T) {
	s := startSim(t, func(c *Config) { c.EOSRate = 0.2 })
	for _, tc := range []struct {
		name, path string
		body       map[string]any
	}{
		{"completions", "/v1/completions", map[string]any{"prompt": []string{"one prompt here", "and a second, longer prompt here"}, "n": 2}},
		{"chat", "/v1/chat/completions", map[string]any{"messages": []map[string]string{{"role": "user", "content": "count me"}}, "n": 3}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := map[string]any{"model": "test-model", "max_tokens": 12, "stream": true,
				"stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}
			for k, v := range tc.body {
				body[k] = v
			}
			evs := streamData(t, s.URL()+tc.path, body)
			counted := map[int]float64{} // completion tokens per choice, from the chunks
			prompt := map[int]float64{}
			var final map[string]any
			for e, m := range evs {
				u, ok := m["usage"].(map[string]any)
				if !ok {
					t.Fatalf("event %d without a usage: %v", e, m)
				}
				c := choice0(t, m)
				if c == nil {
					final = u
					continue
				}
				i := int(c["index"].(float64))
				ct, pt := u["completion_tokens"].(float64), u["prompt_tokens"].(float64)
				if ct < counted[i] || pt <= 0 || u["total_tokens"] != pt+ct || u["prompt_tokens_details"] != nil {
					t.Fatalf("event %d, choice %d: usage %v after %v tokens", e, i, u, counted[i])
				}
				if d, _ := c["delta"].(map[string]any); d["role"] == "assistant" && ct != 0 {
					t.Errorf("the role chunk of choice %d counts %v tokens", i, ct)
				}
				if p, seen := prompt[i]; seen && p != pt {
					t.Errorf("choice %d: prompt tokens %v then %v", i, p, pt)
				}
				counted[i], prompt[i] = ct, pt
			}
			sum := 0.0
			for _, n := range counted {
				sum += n
			}
			if final == nil || final["completion_tokens"] != sum || len(counted) < 2 {
				t.Fatalf("final usage %v; the chunks counted %v", final, counted)
			}
			// include_usage alone: null usage on every chunk but the last.
			body["stream_options"] = map[string]any{"include_usage": true}
			evs = streamData(t, s.URL()+tc.path, body)
			for e, m := range evs[:len(evs)-1] {
				if m["usage"] != nil {
					t.Fatalf("event %d: usage %v without continuous_usage_stats", e, m["usage"])
				}
			}
		})
	}
	if code, b, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": "x",
		"stream_options": map[string]any{"include_usage": true, "continuous_usage_stats": true}}); code != http.StatusBadRequest {
		t.Errorf("stream_options without stream: %d %s", code, b)
	}
}
