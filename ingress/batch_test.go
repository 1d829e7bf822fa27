package ingress

import (
	"encoding/json"
	"net/http"
	"sort"
	"testing"
)

type batchChoice struct {
	Index        int     `json:"index"`
	Text         string  `json:"text"`
	FinishReason *string `json:"finish_reason"`
}

type batchBody struct {
	Choices []batchChoice `json:"choices"`
	Usage   *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// A batch of prompts goes to one engine as token-id lists; the answer has
// one choice per prompt, indexed by position, and the usage of all of them.
func TestBatchedPrompts(t *testing.T) {
	s, nt := tokenizedRig(t, ChatModeChat)
	texts := []string{"The first prompt of the batch.", "A second, somewhat longer prompt in the same request."}
	want := len(nt.Encode(texts[0], true)) + len(nt.Encode(texts[1], true))
	idsA, _ := json.Marshal(nt.Encode(texts[0], true))
	idsB, _ := json.Marshal(nt.Encode(texts[1], true))
	url := "http://" + s.Addr() + "/v1/completions"

	for _, tc := range []struct{ name, prompt string }{
		{"texts", `["` + texts[0] + `","` + texts[1] + `"]`},
		{"token ids", `[` + string(idsA) + `,` + string(idsB) + `]`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := val(s.m.tokens.WithLabelValues("in"))
			st, _, b := post(t, http.DefaultClient, url, `{"model":"llama","prompt":`+tc.prompt+`,"max_tokens":3}`)
			var got batchBody
			if err := json.Unmarshal(b, &got); st != 200 || err != nil || got.Usage == nil {
				t.Fatalf("%d %s %v", st, b, err)
			}
			if len(got.Choices) != 2 || got.Choices[0].Index != 0 || got.Choices[1].Index != 1 {
				t.Fatalf("choices: %s", b)
			}
			if got.Usage.PromptTokens != want || got.Usage.CompletionTokens != 6 {
				t.Fatalf("usage %+v, want %d prompt tokens and 2×3 completion tokens", *got.Usage, want)
			}
			if in := val(s.m.tokens.WithLabelValues("in")) - before; int(in) != want {
				t.Fatalf("ingress counted %v prompt tokens, want %d", in, want)
			}

			// Streaming: chunks for both indexes, each ending with a finish
			// reason, the usage chunk summed, [DONE] last.
			st, _, b = post(t, http.DefaultClient, url, `{"model":"llama","prompt":`+tc.prompt+`,"max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`)
			evs := sseEvents(b)
			if st != 200 || len(evs) == 0 || evs[len(evs)-1] != "[DONE]" {
				t.Fatalf("%d %q", st, evs)
			}
			finished := map[int]bool{}
			sawUsage := false
			for _, e := range evs[:len(evs)-1] {
				var ch batchBody
				if err := json.Unmarshal([]byte(e), &ch); err != nil {
					t.Fatalf("event %q: %v", e, err)
				}
				for _, c := range ch.Choices {
					if c.Index < 0 || c.Index > 1 {
						t.Fatalf("index %d in %q", c.Index, e)
					}
					if c.FinishReason != nil {
						finished[c.Index] = true
					}
				}
				if ch.Usage != nil {
					sawUsage = ch.Usage.PromptTokens == want && ch.Usage.CompletionTokens == 6
				}
			}
			idx := make([]int, 0, 2)
			for i := range finished {
				idx = append(idx, i)
			}
			sort.Ints(idx)
			if len(idx) != 2 || !sawUsage {
				t.Fatalf("finished %v usage %v: %q", idx, sawUsage, evs)
			}
		})
	}

	// Bad elements are the client's fault, named by position.
	st, _, b := post(t, http.DefaultClient, url, `{"model":"llama","prompt":[[1,2],[]]}`)
	if st != 400 || !json.Valid(b) {
		t.Fatalf("empty second prompt: %d %s", st, b)
	}
	st, _, b = post(t, http.DefaultClient, url, `{"model":"llama","prompt":["a",""]}`)
	if st != 400 {
		t.Fatalf("empty second text: %d %s", st, b)
	}
	waitSettled(t, s)
}

// Chat sent as completions: max_completion_tokens limits the output.
func TestChatAsCompletionsHonoursMaxCompletionTokens(t *testing.T) {
	s, _ := tokenizedRig(t, ChatModeCompletions)
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions",
		`{"model":"llama","messages":[{"role":"user","content":"Tell me a long story."}],"max_completion_tokens":5}`)
	var got usageBody
	if err := json.Unmarshal(b, &got); st != 200 || err != nil {
		t.Fatalf("%d %s %v", st, b, err)
	}
	if got.Object != "chat.completion" || got.Usage.CompletionTokens != 5 {
		t.Fatalf("completion tokens %d, want 5: %s", got.Usage.CompletionTokens, b)
	}
}
