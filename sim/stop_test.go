package sim

import (
	"encoding/json"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// completeOne posts a 40-token completion of prompt with extra fields and
// return_token_ids, and decodes its one choice.
func completeOne(t *testing.T, url string, prompt []uint32, extra map[string]any) openai.Completion {
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

// chatStream streams a chat completion and returns its text and the last
// chunk's choice.
func chatStream(t *testing.T, base string, body map[string]any) (text string, last map[string]any) {
	t.Helper()
	for _, m := range streamData(t, base+"/v1/chat/completions", body) {
		ch := choice0(t, m)
		d, _ := ch["delta"].(map[string]any)
		piece, _ := d["content"].(string)
		text += piece
		last = ch
	}
	return text, last
}

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
	complete := func(extra map[string]any) openai.Completion { t.Helper(); return completeOne(t, url, prompt, extra) }
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
	got, last := chatStream(t, s.URL(), chat)
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

// TestStopTokenIDs: stop_token_ids end the output on the first generated
// token among them, from min_tokens on, as vLLM's engine core does: the
// token counts as output, its text is left out unless
// include_stop_str_in_output, stop_reason is its id; one that would be the
// max_tokens-th token finishes by length.
func TestStopTokenIDs(t *testing.T) {
	s := startSim(t, nil)
	url := s.URL() + "/v1/completions"
	prompt := tokens(700, 10)
	complete := func(extra map[string]any) openai.CompletionChoice {
		t.Helper()
		c := completeOne(t, url, prompt, extra)
		if c.Usage.CompletionTokens != len(c.Choices[0].TokenIDs) {
			t.Errorf("usage %d completion tokens, %d token ids", c.Usage.CompletionTokens, len(c.Choices[0].TokenIDs))
		}
		return c.Choices[0]
	}
	whole := complete(nil)
	ids := whole.TokenIDs
	if len(ids) != 40 {
		t.Fatalf("without a stop: %d tokens", len(ids))
	}
	// A token first generated some way in, and one first generated later.
	firstAt := func(id uint32) int { return slices.Index(ids, id) }
	k := 5
	for firstAt(ids[k]) != k {
		k++
	}
	later := k + 1
	for later < 39 && firstAt(ids[later]) != later {
		later++
	}
	if later >= 39 {
		t.Fatalf("no second distinct token in %v", ids)
	}
	stop := ids[k]
	c := complete(map[string]any{"stop_token_ids": []uint32{ids[later], stop}})
	if len(c.TokenIDs) != k+1 || *c.FinishReason != "stop" || string(c.StopReason) != strconv.Itoa(int(stop)) {
		t.Errorf("cut: %d tokens, %s, stop_reason %s; want %d, stop, %d", len(c.TokenIDs), *c.FinishReason, c.StopReason, k+1, stop)
	}
	if want := s.tok.Decode(ids[:k], true); c.Text != want {
		t.Errorf("text %q, want %q (the stop token's text left out)", c.Text, want)
	}
	if kept := complete(map[string]any{"stop_token_ids": []uint32{stop}, "include_stop_str_in_output": true}); kept.Text != s.tok.Decode(ids[:k+1], true) {
		t.Errorf("include_stop_str_in_output: %q, want %q", kept.Text, s.tok.Decode(ids[:k+1], true))
	}
	// min_tokens past it: the next of the two from min_tokens on ends it.
	want := 40
	for p := k + 2; p < 40; p++ {
		if ids[p-1] == stop || ids[p-1] == ids[later] {
			want = p
			break
		}
	}
	if m := complete(map[string]any{"stop_token_ids": []uint32{stop, ids[later]}, "min_tokens": k + 2}); len(m.TokenIDs) != want {
		t.Errorf("min_tokens %d: cut after %d tokens (%s), want %d", k+2, len(m.TokenIDs), m.StopReason, want)
	}
	// The max_tokens-th token: length, as the engine core checks it first.
	if l := complete(map[string]any{"stop_token_ids": []uint32{stop}, "max_tokens": k + 1}); *l.FinishReason != "length" || string(l.StopReason) != "null" || len(l.TokenIDs) != k+1 {
		t.Errorf("stop token at max_tokens: %s %s after %d tokens, want length", *l.FinishReason, l.StopReason, len(l.TokenIDs))
	}
	// A stop string that ends before the token wins.
	if text := s.tok.Decode(ids[:k], true); len(strings.Fields(text)) > 2 {
		word := strings.Fields(text)[1]
		if w := complete(map[string]any{"stop_token_ids": []uint32{stop}, "stop": word}); string(w.StopReason) != `"`+word+`"` {
			t.Errorf("stop %q before the stop token: stop_reason %s", word, w.StopReason)
		}
	}
	// The stop token's own text completing a stop string: the string when
	// that text is kept (the detokenizer checks it), the token otherwise.
	before, with := s.tok.Decode(ids[:k], true), s.tok.Decode(ids[:k+1], true)
	if own := strings.TrimSpace(strings.TrimPrefix(with, before)); own != "" && !strings.Contains(before, own) {
		both := map[string]any{"stop_token_ids": []uint32{stop}, "stop": own, "include_stop_str_in_output": true}
		if b := complete(both); string(b.StopReason) != `"`+own+`"` || b.Text != with[:strings.Index(with, own)+len(own)] {
			t.Errorf("stop %q in the kept stop token's text: %q, stop_reason %s", own, b.Text, b.StopReason)
		}
		both["include_stop_str_in_output"] = false
		if b := complete(both); string(b.StopReason) != strconv.Itoa(int(stop)) || b.Text != before {
			t.Errorf("stop %q in the dropped stop token's text: %q, stop_reason %s", own, b.Text, b.StopReason)
		}
	} else {
		t.Fatalf("token %d's text %q: pick another prompt", k, strings.TrimPrefix(with, before))
	}

	// Streamed, chat: the reason on the last chunk is the id.
	chat := map[string]any{"model": "test-model", "messages": []map[string]string{{"role": "user", "content": "stop me"}}, "max_tokens": 30}
	var creq openai.ChatRequest
	raw, _ := json.Marshal(chat)
	if err := json.Unmarshal(raw, &creq); err != nil {
		t.Fatal(err)
	}
	cp, err := s.chatTokens(&creq, false)
	if err != nil {
		t.Fatal(err)
	}
	cids := s.cfg.Engine.GeneratedTokens(nil, cp, 0, 30) // what the engine generates for that chat
	j := 3
	for slices.Index(cids, cids[j]) != j {
		j++
	}
	chat["stop_token_ids"], chat["stream"] = []uint32{cids[j]}, true
	got, last := chatStream(t, s.URL(), chat)
	if want := s.tok.Decode(cids[:j], true); got != want || last["stop_reason"] != float64(cids[j]) || last["finish_reason"] != "stop" {
		t.Errorf("chat stream: %q, last %v; want %q, stop_reason %d", got, last, want, cids[j])
	}
}
