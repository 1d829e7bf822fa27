package sim

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// TestStopStrings: a stop string ends the output as vLLM ends it: at the
// first token whose text completes it (not before min_tokens), the text
// cut before it (after it with include_stop_str_in_output), finish_reason
// "stop" and stop_reason the string; the stream carries the same text and
// reason; the first stop to complete wins whatever its place in the list;
// the Messages API's stop_sequences cut the same way; an empty stop is
// vLLM's 400.
func TestStopStrings(t *testing.T) {
	s := startSim(t, nil)
	url := s.URL() + "/v1/completions"
	prompt := tokens(500, 10)
	complete := func(extra map[string]any) openai.Completion {
		t.Helper()
		body := map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 40, "return_token_ids": true}
		for k, v := range extra {
			body[k] = v
		}
		code, b, _ := post(t, url, body)
		var c openai.Completion
		if code != http.StatusOK || json.Unmarshal(b, &c) != nil || len(c.Choices) != 1 {
			t.Fatalf("status %d: %s", code, b)
		}
		return c
	}
	whole := complete(nil)
	text, ids := whole.Choices[0].Text, whole.Choices[0].TokenIDs
	if len(ids) != 40 || *whole.Choices[0].FinishReason != "length" || string(whole.Choices[0].StopReason) != "null" {
		t.Fatalf("without a stop: %d tokens, %s, stop_reason %s", len(ids), *whole.Choices[0].FinishReason, whole.Choices[0].StopReason)
	}
	// tokensUntil is how many of the whole output's tokens it takes for
	// their text to reach byte end.
	tokensUntil := func(end int) int {
		for k := 1; k <= len(ids); k++ {
			if len(s.tok.Decode(ids[:k], true)) >= end {
				return k
			}
		}
		return -1
	}
	words := strings.Fields(text)
	stop := words[6] // a word some tokens in
	at := strings.Index(text, stop)
	want := tokensUntil(at + len(stop))

	cut := complete(map[string]any{"stop": stop})
	c := cut.Choices[0]
	if c.Text != text[:at] || *c.FinishReason != "stop" || string(c.StopReason) != `"`+stop+`"` {
		t.Errorf("cut: %q %s %s, want %q stop %q", c.Text, *c.FinishReason, c.StopReason, text[:at], stop)
	}
	if len(c.TokenIDs) != want || cut.Usage.CompletionTokens != want {
		t.Errorf("cut after %d tokens (usage %d), want %d: the token completing the stop", len(c.TokenIDs), cut.Usage.CompletionTokens, want)
	}
	if kept := complete(map[string]any{"stop": []string{stop}, "include_stop_str_in_output": true}).Choices[0]; kept.Text != text[:at+len(stop)] {
		t.Errorf("include_stop_str_in_output: %q, want %q", kept.Text, text[:at+len(stop)])
	}
	// A later word listed first: the one that completes first wins.
	later := words[len(words)-1]
	if first := complete(map[string]any{"stop": []string{later, stop}}).Choices[0]; strings.Index(text, later) > at && string(first.StopReason) != `"`+stop+`"` {
		t.Errorf("stop list [%q %q]: stop_reason %s, want the earlier %q", later, stop, first.StopReason, stop)
	}
	// min_tokens past the first occurrence: not cut there.
	if m := complete(map[string]any{"stop": stop, "min_tokens": want + 1}).Choices[0]; len(m.TokenIDs) <= want {
		t.Errorf("min_tokens %d: cut after %d tokens", want+1, len(m.TokenIDs))
	}
	// A stop the output never holds changes nothing.
	if n := complete(map[string]any{"stop": "no such words"}).Choices[0]; n.Text != text || *n.FinishReason != "length" {
		t.Errorf("absent stop: %q %s", n.Text, *n.FinishReason)
	}

	// Streamed: the same text, the reason on the last chunk.
	evs := streamData(t, url, map[string]any{"model": "test-model", "prompt": prompt, "max_tokens": 40, "stop": stop, "stream": true})
	var streamed string
	var last map[string]any
	for _, m := range evs {
		ch := choice0(t, m)
		streamed += ch["text"].(string)
		last = ch
	}
	if streamed != text[:at] || last["finish_reason"] != "stop" || last["stop_reason"] != stop {
		t.Errorf("stream: %q, last chunk %v", streamed, last)
	}

	// Chat, streamed: the chunks' text, and the reason on the last one.
	chat := map[string]any{"model": "test-model", "messages": []map[string]string{{"role": "user", "content": "stop me"}}, "max_tokens": 30}
	code, b, _ := post(t, s.URL()+"/v1/chat/completions", chat)
	var full openai.ChatCompletion
	if code != http.StatusOK || json.Unmarshal(b, &full) != nil {
		t.Fatalf("chat: %d %s", code, b)
	}
	chatText := full.Choices[0].Message.Content
	chatStop := strings.Fields(chatText)[4]
	chat["stop"], chat["stream"] = []string{chatStop}, true
	var got string
	last = nil
	for _, m := range streamData(t, s.URL()+"/v1/chat/completions", chat) {
		ch := choice0(t, m)
		d, _ := ch["delta"].(map[string]any)
		piece, _ := d["content"].(string)
		got += piece
		last = ch
	}
	if wantChat := chatText[:strings.Index(chatText, chatStop)]; got != wantChat || last["stop_reason"] != chatStop || last["finish_reason"] != "stop" {
		t.Errorf("chat stream: %q, last %v; want %q", got, last, wantChat)
	}

	// Messages: stop_sequences cut the text; vLLM reports end_turn.
	code, b, _ = post(t, s.URL()+"/v1/messages", map[string]any{"model": "test-model", "max_tokens": 30,
		"messages": []map[string]string{{"role": "user", "content": "stop me"}}, "stop_sequences": []string{chatStop}})
	var msg struct {
		Content    []struct{ Text string } `json:"content"`
		StopReason string                  `json:"stop_reason"`
	}
	if code != http.StatusOK || json.Unmarshal(b, &msg) != nil || len(msg.Content) != 1 {
		t.Fatalf("messages: %d %s", code, b)
	}
	if wantMsg := chatText[:strings.Index(chatText, chatStop)]; msg.Content[0].Text != wantMsg || msg.StopReason != "end_turn" {
		t.Errorf("messages: %q %s, want %q end_turn", msg.Content[0].Text, msg.StopReason, wantMsg)
	}

	if code, b, _ := post(t, url, map[string]any{"model": "test-model", "prompt": prompt, "stop": []string{"x", ""}}); code != http.StatusBadRequest {
		t.Errorf("an empty stop string: %d %s, want 400", code, b)
	}
}
