package ingress

import "testing"

// TestUsagePromptTokens reads the prompt's token count in each API's
// usage, and mediaTokens folds answers into a model's mean per item.
func TestUsagePromptTokens(t *testing.T) {
	for _, c := range []struct {
		ep   endpoint
		body string
		want int
	}{
		{epChat, `{"usage":{"prompt_tokens":412,"completion_tokens":3,"prompt_tokens_details":{"cached_tokens":128}}}`, 412},
		{epChat, "data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 77,\"completion_tokens\":1}}\n\n", 77},
		{epResponses, `{"type":"response.completed","response":{"usage":{"input_tokens":90,"output_tokens":4}}}`, 90},
		{epMessages, `{"type":"message_delta","usage":{"input_tokens":30,"output_tokens":4,"cache_read_input_tokens":64}}`, 94},
		{epChat, `{"choices":[]}`, 0},
	} {
		if got := usagePromptTokens(c.ep, []byte(c.body)); got != c.want {
			t.Errorf("%s %s: %d, want %d", c.ep, c.body, got, c.want)
		}
		if hasUsage([]byte(c.body)) != (c.want > 0) {
			t.Errorf("%s: hasUsage %v", c.body, !(c.want > 0))
		}
	}
	for _, b := range []string{`{"choices":[{"delta":{"content":"x"}}],"usage":null}`, `{"usage":null,"x":"\"usage\":"}`} {
		if hasUsage([]byte(b)) {
			t.Errorf("%s: a chunk without usage read as having it", b)
		}
	}
	var mt mediaTokens
	if mt.perItem("m") != 0 {
		t.Fatal("a model with no answer has a per-item count")
	}
	mt.observe("m", 2, 100, 700) // 300 per item
	mt.observe("m", 1, 50, 40)   // the engine counted fewer: no sample
	mt.observe("m", 1, 100, 600) // 500
	if got := mt.perItem("m"); got != 0.8*300+0.2*500 {
		t.Fatalf("per item %v, want %v", got, 0.8*300+0.2*500)
	}
}
