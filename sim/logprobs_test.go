package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// streamData posts body and returns the stream's data payloads before
// [DONE] (which must end it).
func streamData(t *testing.T, url string, body any) []map[string]any {
	t.Helper()
	code, b, _ := post(t, url, body)
	if code != http.StatusOK {
		t.Fatalf("status %d: %s", code, b)
	}
	var out []map[string]any
	done := false
	for _, ev := range strings.Split(strings.TrimSpace(string(b)), "\n\n") {
		data, ok := strings.CutPrefix(ev, "data: ")
		if !ok || done {
			t.Fatalf("bad event %q (after [DONE]: %v)", ev, done)
		}
		if data == "[DONE]" {
			done = true
			continue
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(data), &m); err != nil {
			t.Fatalf("%v: %s", err, data)
		}
		out = append(out, m)
	}
	if !done {
		t.Fatal("no [DONE]")
	}
	return out
}

func choice0(t *testing.T, m map[string]any) map[string]any {
	t.Helper()
	cs, _ := m["choices"].([]any)
	if len(cs) == 0 {
		return nil
	}
	c, _ := cs[0].(map[string]any)
	return c
}

// Logprobs come in vLLM's shapes, one entry per output token, with the
// asked number of alternatives, the sampled token first; a stream carries
// the same entries as its non-streamed twin; bad counts are 400s.
func TestLogprobs(t *testing.T) {
	s := startSim(t, nil)
	const n = 6
	msgs := []map[string]string{{"role": "user", "content": "hello"}}

	// Chat: top_logprobs 3.
	code, b, _ := post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs,
		"max_tokens": n, "logprobs": true, "top_logprobs": 3})
	if code != http.StatusOK {
		t.Fatalf("chat: %d %s", code, b)
	}
	var chat struct {
		Choices []struct {
			Logprobs struct {
				Content []struct {
					Token       string  `json:"token"`
					Logprob     float64 `json:"logprob"`
					TopLogprobs []struct {
						Token   string  `json:"token"`
						Logprob float64 `json:"logprob"`
					} `json:"top_logprobs"`
				} `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	if err := json.Unmarshal(b, &chat); err != nil {
		t.Fatal(err)
	}
	content := chat.Choices[0].Logprobs.Content
	if len(content) != n {
		t.Fatalf("chat: %d logprob entries for %d tokens: %s", len(content), n, b)
	}
	for i, e := range content {
		if e.Token == "" || e.Logprob > 0 || len(e.TopLogprobs) == 0 || len(e.TopLogprobs) > 3 ||
			e.TopLogprobs[0].Token != e.Token || e.TopLogprobs[0].Logprob != e.Logprob {
			t.Errorf("chat entry %d: %+v", i, e)
		}
		for _, a := range e.TopLogprobs[1:] {
			if a.Logprob >= e.Logprob {
				t.Errorf("chat entry %d: alternative %+v not below the sampled token", i, a)
			}
		}
	}

	// The chat stream: the same entries, split across chunks.
	var streamed []any
	for _, m := range streamData(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs,
		"max_tokens": n, "logprobs": true, "top_logprobs": 3, "stream": true}) {
		if lp, ok := choice0(t, m)["logprobs"].(map[string]any); ok {
			streamed = append(streamed, lp["content"].([]any)...)
		}
	}
	var whole struct {
		Choices []struct {
			Logprobs struct {
				Content []any `json:"content"`
			} `json:"logprobs"`
		} `json:"choices"`
	}
	_ = json.Unmarshal(b, &whole)
	if sb, wb := string(mustJSON(t, streamed)), string(mustJSON(t, whole.Choices[0].Logprobs.Content)); sb != wb {
		t.Errorf("stream's entries differ:\n%s\n%s", sb, wb)
	}

	// Completions: logprobs 2, and 0 (the sampled token's only).
	for _, top := range []int{2, 0} {
		code, b, _ := post(t, s.URL()+"/v1/completions", map[string]any{"model": "test-model", "prompt": "once upon",
			"max_tokens": n, "logprobs": top})
		if code != http.StatusOK {
			t.Fatalf("completions: %d %s", code, b)
		}
		var cr struct {
			Choices []struct {
				Text     string `json:"text"`
				Logprobs struct {
					TextOffset    []int                `json:"text_offset"`
					TokenLogprobs []float64            `json:"token_logprobs"`
					Tokens        []string             `json:"tokens"`
					TopLogprobs   []map[string]float64 `json:"top_logprobs"`
				} `json:"logprobs"`
			} `json:"choices"`
		}
		if err := json.Unmarshal(b, &cr); err != nil {
			t.Fatal(err)
		}
		lp := cr.Choices[0].Logprobs
		if len(lp.Tokens) != n || len(lp.TokenLogprobs) != n || len(lp.TextOffset) != n || len(lp.TopLogprobs) != n ||
			strings.Join(lp.Tokens, "") != cr.Choices[0].Text {
			t.Fatalf("completions logprobs %d: %s", top, b)
		}
		for i := range lp.Tokens {
			if i > 0 && lp.TextOffset[i] != lp.TextOffset[i-1]+len([]rune(lp.Tokens[i-1])) {
				t.Errorf("text_offset %v for tokens %q", lp.TextOffset, lp.Tokens)
			}
			top0 := lp.TopLogprobs[i]
			if top == 0 && top0 != nil || top > 0 && (len(top0) == 0 || len(top0) > top || top0[lp.Tokens[i]] != lp.TokenLogprobs[i]) {
				t.Errorf("top_logprobs[%d] %v with logprobs %d (token %q %v)", i, top0, top, lp.Tokens[i], lp.TokenLogprobs[i])
			}
		}
	}

	// Bad counts, as vLLM refuses them.
	for _, c := range []struct {
		path string
		body map[string]any
		want string
	}{
		{"/v1/chat/completions", map[string]any{"messages": msgs, "top_logprobs": 2}, "logprobs must be true"},
		{"/v1/chat/completions", map[string]any{"messages": msgs, "logprobs": true, "top_logprobs": 21}, "top_logprobs 21: at most 20"},
		{"/v1/completions", map[string]any{"prompt": "x", "logprobs": -1}, "logprobs -1: must not be negative"},
	} {
		code, b, _ := post(t, s.URL()+c.path, c.body)
		if code != http.StatusBadRequest || !strings.Contains(string(b), c.want) {
			t.Errorf("%v: %d %s, want 400 with %q", c.body, code, b, c.want)
		}
	}
	// Without logprobs asked: null, as before.
	code, b, _ = post(t, s.URL()+"/v1/chat/completions", map[string]any{"messages": msgs, "max_tokens": 2})
	if code != http.StatusOK || !strings.Contains(string(b), `"logprobs":null`) {
		t.Errorf("no logprobs asked: %d %s", code, b)
	}
}
