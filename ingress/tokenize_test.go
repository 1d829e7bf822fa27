package ingress

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sim"
)

var (
	llamaOnce sync.Once
	llamaDir  string
	llamaErr  error

	llamaLoadOnce sync.Once
	llamaNative   *tokenizer.Native
	llamaTpl      *tokenizer.ChatTemplate
	llamaLoadErr  error
)

// llama loads a tokenizer and the Llama 3 chat template once per test
// binary. The tokenizer is bert-base-uncased (30k WordPiece entries) rather
// than Llama 3's 128k BPE vocabulary, which takes tens of seconds to load
// under -race; what the tests check (the ingress and the engine tokenize and
// render identically) does not depend on which vocabulary it is.
func llama(t testing.TB) (*tokenizer.Native, *tokenizer.ChatTemplate) {
	t.Helper()
	_, tplJSON := llamaFiles(t)
	tokJSON := filepath.Join(llamaDir, "bert-base-uncased.json")
	llamaLoadOnce.Do(func() {
		if llamaNative, llamaLoadErr = tokenizer.LoadFile(tokJSON); llamaLoadErr == nil {
			llamaTpl, llamaLoadErr = tokenizer.LoadChatTemplateFile(tplJSON)
		}
	})
	if llamaLoadErr != nil {
		t.Fatal(llamaLoadErr)
	}
	return llamaNative, llamaTpl
}

// llamaFiles locates the Llama 3 tokenizer and chat template that ship in the
// Go module github.com/daulet/tokenizers (required in go.mod).
func llamaFiles(t testing.TB) (tokJSON, tplJSON string) {
	t.Helper()
	llamaOnce.Do(func() {
		out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
		if err != nil {
			llamaErr = err
			return
		}
		var v struct{ Dir string }
		if llamaErr = json.Unmarshal(out, &v); llamaErr == nil {
			llamaDir = filepath.Join(v.Dir, "test", "data")
		}
	})
	if llamaErr != nil || llamaDir == "" {
		t.Fatalf("locate tokenizer test data: %v", llamaErr)
	}
	return filepath.Join(llamaDir, "Meta-Llama-3-8B-Instruct.json"), filepath.Join(llamaDir, "meta-llama-3-8b-instruct", "tokenizer_config.json")
}

// tokenizedRig: a sim and an ingress sharing the Llama 3 tokenizer.
func tokenizedRig(t *testing.T, chatMode string) (*Server, *tokenizer.Native) {
	t.Helper()
	nt, tpl := llama(t)
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: "llama", TimeScale: 500, Tokenizer: nt, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg := testConfig(StaticEngine{ID: "s", Model: "llama", URL: sm.URL()})
	cfg.ChatMode = chatMode
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	return startIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"llama": tk}}), nt
}

type usageBody struct {
	Object  string `json:"object"`
	Choices []struct {
		Text    string `json:"text"`
		Message struct {
			Role, Content string
		} `json:"message"`
	} `json:"choices"`
	Usage struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
}

// LoadTokenizers reads the files named in Config (the command's path); a
// small WordPiece vocabulary keeps it quick.
func TestLoadTokenizers(t *testing.T) {
	_, tplJSON := llamaFiles(t)
	cfg := DefaultConfig()
	cfg.Tokenizers = map[string]string{"bert": filepath.Join(llamaDir, "bert-base-uncased.json")}
	cfg.ChatTemplates = map[string]string{"bert": tplJSON}
	var deps Deps
	if err := LoadTokenizers(&cfg, &deps); err != nil {
		t.Fatal(err)
	}
	tk, ok := deps.Tokenizers.For("bert")
	if !ok {
		t.Fatal("no tokenizer for bert")
	}
	if ids, err := tk.Encode(nil, []byte("hello world")); err != nil || len(ids) < 2 {
		t.Fatalf("encode: %v %v", ids, err)
	}
	if ids, err := tk.RenderChat(nil, []Message{{Role: "user", Content: "hi"}}); err != nil || len(ids) == 0 {
		t.Fatalf("render: %v %v", ids, err)
	}
	bad := DefaultConfig()
	bad.Tokenizers = map[string]string{"bad": "/nonexistent/tokenizer.json"}
	deps = Deps{}
	if err := LoadTokenizers(&bad, &deps); err == nil {
		t.Fatal("missing file accepted")
	}
}

func TestTextPromptTokenizedOnce(t *testing.T) {
	s, nt := tokenizedRig(t, ChatModeChat)
	const text = "The ingress tokenizes this prompt once; the engine receives token ids."
	st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions", `{"model":"llama","prompt":"`+text+`","max_tokens":3}`)
	var u usageBody
	if err := json.Unmarshal(b, &u); st != 200 || err != nil {
		t.Fatalf("%d %s %v", st, b, err)
	}
	if want := len(nt.Encode(text, true)); u.Usage.PromptTokens != want {
		t.Fatalf("engine saw %d prompt tokens, tokenizer gives %d", u.Usage.PromptTokens, want)
	}
	if got := val(s.m.tokens.WithLabelValues("in")); int(got) != u.Usage.PromptTokens {
		t.Fatalf("ingress counted %v prompt tokens, engine %d", got, u.Usage.PromptTokens)
	}
}

// In completions mode the ingress renders the chat template and the engine
// gets token ids; it must see exactly the prompt it renders itself in chat
// mode, and the answer must come back as chat objects.
func TestChatAsCompletionsMatchesChat(t *testing.T) {
	chatSrv, _ := tokenizedRig(t, ChatModeChat)
	wrapSrv, _ := tokenizedRig(t, ChatModeCompletions)
	const body = `{"model":"llama","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"What is a KV cache?"}],"max_tokens":6`
	var got [2]usageBody
	for i, s := range []*Server{chatSrv, wrapSrv} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body+"}")
		if err := json.Unmarshal(b, &got[i]); st != 200 || err != nil {
			t.Fatalf("mode %d: %d %s %v", i, st, b, err)
		}
		if got[i].Object != "chat.completion" || got[i].Choices[0].Message.Role != "assistant" || got[i].Choices[0].Message.Content == "" {
			t.Fatalf("mode %d: %s", i, b)
		}
	}
	if got[0].Usage.PromptTokens != got[1].Usage.PromptTokens || got[1].Usage.CompletionTokens != 6 {
		t.Fatalf("chat mode prompt %d tokens, completions mode %d (completion %d)", got[0].Usage.PromptTokens, got[1].Usage.PromptTokens, got[1].Usage.CompletionTokens)
	}

	// Streaming in completions mode: chat chunks, role first, usage, [DONE].
	st, _, b := post(t, http.DefaultClient, "http://"+wrapSrv.Addr()+"/v1/chat/completions", body+`,"stream":true,"stream_options":{"include_usage":true}}`)
	if st != 200 {
		t.Fatalf("%d %s", st, b)
	}
	evs := sseEvents(b)
	if len(evs) < 3 || evs[len(evs)-1] != "[DONE]" {
		t.Fatalf("events %q", evs)
	}
	var content strings.Builder
	sawRole, sawUsage := false, false
	for i, e := range evs[:len(evs)-1] {
		var ch struct {
			Object  string `json:"object"`
			Choices []struct {
				Delta struct{ Role, Content string } `json:"delta"`
			} `json:"choices"`
			Usage *struct {
				PromptTokens int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		if err := json.Unmarshal([]byte(e), &ch); err != nil || ch.Object != "chat.completion.chunk" {
			t.Fatalf("event %d %q: %v", i, e, err)
		}
		for _, c := range ch.Choices {
			if c.Delta.Role == "assistant" {
				if i != 0 {
					t.Fatalf("role in event %d", i)
				}
				sawRole = true
			}
			content.WriteString(c.Delta.Content)
		}
		if ch.Usage != nil && ch.Usage.PromptTokens == got[0].Usage.PromptTokens {
			sawUsage = true
		}
	}
	if !sawRole || !sawUsage || content.Len() == 0 {
		t.Fatalf("role %v usage %v content %q: %q", sawRole, sawUsage, content.String(), evs)
	}
}

// A chat stream in completions mode opens as vLLM's chat stream does (the
// simulator's chat endpoint behind the chat-mode ingress): a chunk with the
// role and empty content before any text, carrying the
// prompt's usage with none generated under continuous_usage_stats. Before,
// the role rode on the first text chunk, so the stream had a chunk fewer and
// that usage tick was lost.
func TestChatAsCompletionsStreamOpensWithRoleChunks(t *testing.T) {
	chatSrv, _ := tokenizedRig(t, ChatModeChat)
	wrapSrv, _ := tokenizedRig(t, ChatModeCompletions)
	const body = `{"model":"llama","messages":[{"role":"user","content":"What is a KV cache?"}],"max_tokens":4,"stream":true,` +
		`"stream_options":{"include_usage":true,"continuous_usage_stats":true}}`
	var opening [2][]string
	for i, s := range []*Server{chatSrv, wrapSrv} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body)
		if st != 200 {
			t.Fatalf("mode %d: %d %s", i, st, b)
		}
		for _, e := range sseEvents(b) {
			var ch map[string]any
			if err := json.Unmarshal([]byte(e), &ch); err != nil {
				break
			}
			choices, _ := ch["choices"].([]any)
			if len(choices) != 1 {
				break
			}
			delta, _ := choices[0].(map[string]any)["delta"].(map[string]any)
			if delta["role"] != "assistant" {
				break // the first text chunk: the opening is over
			}
			delete(ch, "id")
			delete(ch, "created")
			norm, _ := json.Marshal(ch)
			opening[i] = append(opening[i], string(norm))
		}
	}
	if len(opening[0]) != 1 || !slices.Equal(opening[0], opening[1]) {
		t.Fatalf("the chat stream opens with\n%q\nthe completions-mode stream with\n%q", opening[0], opening[1])
	}
	if !strings.Contains(opening[1][0], `"completion_tokens":0`) || !strings.Contains(opening[1][0], `"content":""`) {
		t.Fatalf("opening %q", opening[1])
	}
}

// wrapPair answers body from a chat-mode and a completions-mode ingress in
// front of the same simulated engine, both 200 chat.completions.
func wrapPair(t *testing.T, chatSrv, wrapSrv *Server, body string) [2]usageBody {
	t.Helper()
	var got [2]usageBody
	for i, s := range []*Server{chatSrv, wrapSrv} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body)
		if err := json.Unmarshal(b, &got[i]); st != 200 || err != nil || got[i].Object != "chat.completion" || len(got[i].Choices) != 1 {
			t.Fatalf("mode %d, %s: %d %s %v", i, body, st, b, err)
		}
	}
	return got
}

// In completions mode, members of a chat request that vLLM's chat endpoint
// ignores but /v1/completions reads (prompt, suffix, prompt_embeds, and
// logprobs false, which completions reads as a count) do not reach the
// completions body: the answer is the one the chat endpoint gives, not one
// to the client's "prompt" (which, after messages, won as completions) or a
// 400 for a boolean logprobs.
func TestChatAsCompletionsIgnoresCompletionsMembers(t *testing.T) {
	chatSrv, _ := tokenizedRig(t, ChatModeChat)
	wrapSrv, _ := tokenizedRig(t, ChatModeCompletions)
	const msgs = `"messages":[{"role":"user","content":"What is a KV cache?"}]`
	for _, body := range []string{
		`{"model":"llama",` + msgs + `,"prompt":"totally different prompt text here","max_tokens":6}`,
		`{"prompt":[1,2,3],"model":"llama",` + msgs + `,"suffix":"x","max_tokens":6,"prompt":"another prompt"}`,
		`{"model":"llama",` + msgs + `,"max_tokens":6,"logprobs":false}`,
		`{"logprobs":null,"model":"llama",` + msgs + `,"max_tokens":6,"prompt_embeds":null,"logprobs":false}`,
	} {
		got := wrapPair(t, chatSrv, wrapSrv, body)
		if got[0].Usage != got[1].Usage || got[0].Choices[0].Message != got[1].Choices[0].Message {
			t.Fatalf("%s:\nchat mode        %+v\ncompletions mode %+v", body, got[0], got[1])
		}
	}
}

// In completions mode the chat answer keeps vLLM's stop_reason (the stop
// string that ended the choice), whole and on the last streamed chunk, as
// the chat endpoint gives it.
func TestChatAsCompletionsKeepsStopReason(t *testing.T) {
	chatSrv, _ := tokenizedRig(t, ChatModeChat)
	wrapSrv, _ := tokenizedRig(t, ChatModeCompletions)
	const body = `{"model":"llama","messages":[{"role":"user","content":"Name a few colours."}],"max_tokens":20`
	full := wrapPair(t, chatSrv, wrapSrv, body+`}`)
	words := strings.Fields(full[0].Choices[0].Message.Content)
	if len(words) < 6 {
		t.Fatalf("answer %q: too short to stop inside", full[0].Choices[0].Message.Content)
	}
	stop, _ := json.Marshal(words[4])
	type choice struct {
		FinishReason *string         `json:"finish_reason"`
		StopReason   json.RawMessage `json:"stop_reason"`
	}
	var whole [2]struct{ Choices []choice }
	var last [2]map[string]json.RawMessage
	for i, s := range []*Server{chatSrv, wrapSrv} {
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body+`,"stop":`+string(stop)+`}`)
		if err := json.Unmarshal(b, &whole[i]); st != 200 || err != nil || len(whole[i].Choices) != 1 {
			t.Fatalf("mode %d: %d %s %v", i, st, b, err)
		}
		st, _, b = post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", body+`,"stop":`+string(stop)+`,"stream":true}`)
		if st != 200 {
			t.Fatalf("mode %d stream: %d %s", i, st, b)
		}
		for _, e := range sseEvents(b) {
			var ch struct{ Choices []map[string]json.RawMessage }
			if e != "[DONE]" && json.Unmarshal([]byte(e), &ch) == nil && len(ch.Choices) == 1 {
				last[i] = ch.Choices[0]
			}
		}
	}
	if c := whole[0].Choices[0]; c.FinishReason == nil || *c.FinishReason != "stop" || string(c.StopReason) != string(stop) {
		t.Fatalf("the engine's chat answer: finish %v, stop_reason %s; want stop %s", c.FinishReason, c.StopReason, stop)
	}
	if c := whole[1].Choices[0]; string(c.StopReason) != string(stop) {
		t.Fatalf("completions mode: stop_reason %q, want %s as chat", c.StopReason, stop)
	}
	if string(last[0]["stop_reason"]) != string(stop) || string(last[1]["stop_reason"]) != string(stop) ||
		string(last[1]["finish_reason"]) != `"stop"` {
		t.Fatalf("last chunk: chat mode %s, completions mode %s; want stop_reason %s", last[0], last[1], stop)
	}
}

// "add_special_tokens": false on a completions prompt (one or a batch) is
// tokenized as the engine would: without the BOS the tokenizer adds.
func TestAddSpecialTokensFalse(t *testing.T) {
	s, nt := tokenizedRig(t, ChatModeChat)
	const text = "Tokenized without special tokens."
	plain, with := len(nt.Encode(text, false)), len(nt.Encode(text, true))
	if plain == with {
		t.Fatal("the test tokenizer adds no special token")
	}
	for _, tc := range []struct {
		prompt string
		n      int
		want   int
	}{{`"` + text + `"`, 1, plain}, {`["` + text + `","` + text + `"]`, 2, 2 * plain}} {
		for _, add := range []string{`false`, `true`} {
			st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/completions",
				`{"model":"llama","prompt":`+tc.prompt+`,"max_tokens":1,"add_special_tokens":`+add+`}`)
			var u usageBody
			if err := json.Unmarshal(b, &u); st != 200 || err != nil {
				t.Fatalf("%d %s %v", st, b, err)
			}
			want := tc.want
			if add == "true" {
				want = tc.n * with
			}
			if u.Usage.PromptTokens != want {
				t.Fatalf("prompt %s, add_special_tokens %s: the engine saw %d prompt tokens, want %d", tc.prompt, add, u.Usage.PromptTokens, want)
			}
		}
	}
}

// In completions mode a chat request that asks for what only the chat
// endpoint answers in chat's shape (tools, logprobs, echo, n > 1, reasoning,
// the prompt's logprobs or token ids) or what completions reads otherwise
// (logprobs other than false or null, best_of) goes to the engine as chat;
// any other goes as the rendered tokens.
func TestChatOnlyRequestsStayChat(t *testing.T) {
	nt, tpl := llama(t)
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	fe := startFaultEngine(t, faultOK)
	cfg := testConfig(StaticEngine{ID: "e", Model: "llama", URL: fe.url()})
	cfg.ChatMode = ChatModeCompletions
	cfg.EngineTokenizeTimeout = 0
	s := startIngress(t, cfg, Deps{Tokenizers: TokenizerMap{"llama": tk}})
	const msgs = `{"model":"llama","messages":[{"role":"user","content":"Hi"}]`
	for _, tc := range []struct {
		extra string
		chat  bool
	}{
		{``, false},
		{`,"logprobs":false,"n":1,"tools":null`, false},
		{`,"logprobs":null,"echo":false,"return_token_ids":false,"best_of":null,"prompt_logprobs":null`, false},
		{`,"tools":[]`, false},
		{`,"logprobs":true`, true},
		// Not a boolean true, but not nothing either: chat's pydantic reads
		// 1 and "true" as true and refuses 2, completions reads a count.
		{`,"logprobs":1`, true},
		{`,"logprobs":2`, true},
		{`,"logprobs":0`, true},
		{`,"logprobs":"true"`, true},
		{`,"top_logprobs":2`, true},
		{`,"echo":true`, true},
		{`,"echo":1`, true},
		{`,"best_of":2`, true},
		{`,"return_token_ids":true`, true},
		{`,"prompt_logprobs":0`, true},
		{`,"n":2`, true},
		{`,"include_reasoning":true`, true},
		{`,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`, true},
	} {
		post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", msgs+tc.extra+`}`)
		var got []byte
		select {
		case got = <-fe.bodies:
		case <-time.After(10 * time.Second):
			t.Fatalf("%s: the engine got no request", tc.extra)
		}
		if asChat := bytes.Contains(got, []byte(`"messages"`)); asChat != tc.chat {
			t.Fatalf("%q: forwarded as chat %v, want %v: %s", tc.extra, asChat, tc.chat, got)
		}
	}
}
