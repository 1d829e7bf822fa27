package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"unicode/utf8"
)

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name    string
		ep      endpoint
		body    string
		wantErr string // substring; "" means success
		check   func(t *testing.T, r *request)
	}{
		{name: "text prompt", ep: epCompletions, body: `{"model":"m","prompt":"hi \u00e9\n","stream":true,"max_tokens":5,"stream_options":{"include_usage":true}}`,
			check: func(t *testing.T, r *request) {
				if string(r.model) != "m" || r.kind != promptText || string(r.text) != "hi é\n" || !r.stream || r.maxTokens != 5 || !r.includeUsage {
					t.Fatalf("got %+v", r)
				}
			}},
		{name: "token ids", ep: epCompletions, body: `{"model":"m","prompt":[1, 2,4294967295]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptIDs || len(r.ids) != 3 || r.ids[2] != 4294967295 {
					t.Fatalf("got %+v", r.ids)
				}
			}},
		{name: "one-element batch of ids", ep: epCompletions, body: `{"model":"m","prompt":[[7,8]]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptIDs || len(r.ids) != 2 || r.ids[0] != 7 {
					t.Fatalf("got %+v", r.ids)
				}
			}},
		{name: "one-element batch of text", ep: epCompletions, body: `{"model":"m","prompt":["a"]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptText || string(r.text) != "a" {
					t.Fatalf("got %q", r.text)
				}
			}},
		{name: "surrogate pair", ep: epCompletions, body: `{"model":"m","prompt":"\ud83d\ude00"}`,
			check: func(t *testing.T, r *request) {
				if string(r.text) != "😀" {
					t.Fatalf("got %q", r.text)
				}
			}},
		{name: "chat", ep: epChat, body: `{"model":"m","messages":[{"role":"system","content":"s"},{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url"},{"type":"text","text":"b"}]}]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptChat || len(r.chatMessages()) != 2 || r.chat[1].Content != "ab" || r.chat[0].Role != "system" {
					t.Fatalf("got %+v", r.chat)
				}
			}},
		{name: "malformed json", ep: epCompletions, body: `{"model":"m","prompt":"x"`, wantErr: "malformed"},
		{name: "trailing garbage", ep: epCompletions, body: `{"model":"m","prompt":"x"} x`, wantErr: "trailing"},
		{name: "not an object", ep: epCompletions, body: `[1]`, wantErr: "JSON object"},
		{name: "model wrong type", ep: epCompletions, body: `{"model":3,"prompt":"x"}`, wantErr: "model must be a string"},
		{name: "stream wrong type", ep: epCompletions, body: `{"model":"m","prompt":"x","stream":"maybe"}`, wantErr: "stream must be a boolean"},
		{name: "max_tokens negative", ep: epCompletions, body: `{"model":"m","prompt":"x","max_tokens":-1}`, wantErr: "max_tokens"},
		{name: "max_tokens a fraction", ep: epCompletions, body: `{"model":"m","prompt":"x","max_tokens":2.5}`, wantErr: "max_tokens"},
		{name: "max_tokens a whole float", ep: epCompletions, body: `{"model":"m","prompt":"x","max_tokens":2.0}`, // pydantic's lax int, as vLLM
			check: func(t *testing.T, r *request) {
				if r.maxTokens != 2 {
					t.Fatalf("max_tokens %d", r.maxTokens)
				}
			}},
		{name: "empty prompt", ep: epCompletions, body: `{"model":"m","prompt":""}`, wantErr: "empty"},
		{name: "empty ids", ep: epCompletions, body: `{"model":"m","prompt":[]}`, wantErr: "empty"},
		{name: "negative id", ep: epCompletions, body: `{"model":"m","prompt":[1,-2]}`, wantErr: "invalid token ids"},
		{name: "float id", ep: epCompletions, body: `{"model":"m","prompt":[1.5]}`, wantErr: "invalid token ids"},
		{name: "huge id", ep: epCompletions, body: `{"model":"m","prompt":[4294967296]}`, wantErr: "invalid token ids"},
		{name: "batch of mixed types", ep: epCompletions, body: `{"model":"m","prompt":["a",[1]]}`, wantErr: "only strings or only token-id arrays"},
		{name: "batched texts", ep: epCompletions, body: `{"model":"m","prompt":["a","b c"]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptText || string(r.text) != "a" || len(r.batch) != 2 || string(r.batch[1]) != `"b c"` {
					t.Fatalf("got kind %d text %q batch %q", r.kind, r.text, r.batch)
				}
			}},
		{name: "batched ids", ep: epCompletions, body: `{"model":"m","prompt":[[1,2],[3]]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptIDs || len(r.ids) != 2 || len(r.batch) != 2 || string(r.batch[1]) != `[3]` {
					t.Fatalf("got kind %d ids %v batch %q", r.kind, r.ids, r.batch)
				}
			}},
		{name: "one-element batch is a single prompt", ep: epCompletions, body: `{"model":"m","prompt":[[7]]}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptIDs || len(r.ids) != 1 || len(r.batch) != 0 {
					t.Fatalf("got kind %d ids %v batch %q", r.kind, r.ids, r.batch)
				}
			}},
		{name: "prompt wrong type", ep: epCompletions, body: `{"model":"m","prompt":{}}`, wantErr: "prompt must be"},
		{name: "no prompt", ep: epCompletions, body: `{"model":"m"}`, wantErr: "prompt is required"},
		{name: "no messages", ep: epChat, body: `{"model":"m"}`, wantErr: "messages is required"},
		{name: "empty messages", ep: epChat, body: `{"model":"m","messages":[]}`, wantErr: "must not be empty"},
		{name: "message without role", ep: epChat, body: `{"model":"m","messages":[{"content":"x"}]}`, wantErr: "role is required"},
		{name: "message content wrong type", ep: epChat, body: `{"model":"m","messages":[{"role":"user","content":5}]}`, wantErr: "content must be"},
		{name: "bad escape", ep: epCompletions, body: `{"model":"m","prompt":"\x"}`, wantErr: "escape"},
		{name: "control char", ep: epCompletions, body: "{\"model\":\"m\",\"prompt\":\"a\x01\"}", wantErr: "control"},
		// The P/D legs' members are the router's: from a client an engine
		// would connect where it says, or hold blocks for no transfer.
		{name: "client kv_transfer_params", ep: epCompletions, body: `{"model":"m","prompt":"a","kv_transfer_params":{"do_remote_decode":true}}`, wantErr: "kv_transfer_params is set by the router"},
		{name: "client bootstrap_room", ep: epChat, body: `{"model":"m","messages":[{"role":"user","content":"x"}],"bootstrap_room":7}`, wantErr: "bootstrap_room is set by the router"},
		{name: "client bootstrap_host", ep: epResponses, body: `{"model":"m","input":"x","bootstrap_host":"10.0.0.1"}`, wantErr: "bootstrap_host is set by the router"},
		{name: "client bootstrap_port", ep: epMessages, body: `{"model":"m","max_tokens":1,"messages":[{"role":"user","content":"x"}],"bootstrap_port":1}`, wantErr: "bootstrap_port is set by the router"},
		{name: "null P/D members are absent", ep: epCompletions, body: `{"model":"m","prompt":"a","kv_transfer_params":null,"bootstrap_room":null}`,
			check: func(t *testing.T, r *request) {
				if r.kind != promptText || string(r.text) != "a" {
					t.Fatalf("got %+v", r)
				}
			}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r request
			err := parseRequest(&r, tc.ep, []byte(tc.body))
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v, want containing %q", err, tc.wantErr)
				}
				if ae := toAPIError(err); ae.status != 400 || ae.typ != "invalid_request_error" {
					t.Fatalf("mapped to %d %s", ae.status, ae.typ)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			tc.check(t, &r)
		})
	}
}

func TestRewritePromptAndChatBody(t *testing.T) {
	var r request
	body := []byte(`{"model":"m", "prompt" : "hello", "max_tokens":3}`)
	if err := parseRequest(&r, epCompletions, body); err != nil {
		t.Fatal(err)
	}
	out := rewritePrompt(nil, body, r.promptStart, r.promptEnd, []uint32{5, 0, 17})
	var got map[string]any
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if p, ok := got["prompt"].([]any); !ok || len(p) != 3 || p[2].(float64) != 17 || got["max_tokens"].(float64) != 3 {
		t.Fatalf("rewritten: %s", out)
	}

	var c request
	chat := []byte(`{"messages":[{"role":"user","content":"hi"}],"model":"m","stream":true}`)
	if err := parseRequest(&c, epChat, chat); err != nil {
		t.Fatal(err)
	}
	out = chatToCompletionsBody(nil, chat, &c, []uint32{9, 8}, 0)
	got = nil
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	// No limit in chat: completions would stop at 16 without one.
	if mt, has := got["max_tokens"]; !has || mt != nil {
		t.Fatalf("chat without a limit, completions body %s: want max_tokens null", out)
	}
	if _, has := got["messages"]; has || len(got["prompt"].([]any)) != 2 || got["stream"] != true {
		t.Fatalf("chat body: %s", out)
	}
	out = chatToCompletionsBody(nil, chat, &c, []uint32{9, 8}, 4094) // the context left, when known
	if got = nil; json.Unmarshal(out, &got) != nil || got["max_tokens"] != float64(4094) {
		t.Fatalf("chat without a limit, 4094 tokens of context left: %s", out)
	}
}

// Chat sent as completions: max_completion_tokens (chat only) becomes
// max_tokens, and wins over a max_tokens sent with it, as in vLLM.
func TestChatBodyRenamesMaxCompletionTokens(t *testing.T) {
	tests := []struct {
		name, body string
		want       float64 // max_tokens upstream; 0 = absent
	}{
		{"mct only", `{"model":"m","max_completion_tokens":5,"messages":[{"role":"user","content":"hi"}]}`, 5},
		{"mct after max_tokens", `{"model":"m","max_tokens":9, "messages":[{"role":"user","content":"hi"}],"max_completion_tokens":5}`, 5},
		{"mct before max_tokens (last)", `{"max_completion_tokens":5,"messages":[{"role":"user","content":"hi"}],"model":"m" , "max_tokens" : 9 }`, 5},
		{"max_tokens only", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":9,"model":"m"}`, 9},
		{"mct null", `{"messages":[{"role":"user","content":"hi"}],"max_completion_tokens":null,"model":"m"}`, 0},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var r request
			if err := parseRequest(&r, epChat, []byte(tc.body)); err != nil {
				t.Fatal(err)
			}
			out := chatToCompletionsBody(nil, []byte(tc.body), &r, []uint32{4, 2}, 0)
			var got map[string]any
			if err := json.Unmarshal(out, &got); err != nil {
				t.Fatalf("%s: %v", out, err)
			}
			if _, has := got["max_completion_tokens"]; has {
				t.Fatalf("max_completion_tokens left in %s", out)
			}
			if mt, _ := got["max_tokens"].(float64); mt != tc.want || len(got["prompt"].([]any)) != 2 || got["model"] != "m" || got["messages"] != nil {
				t.Fatalf("body %s", out)
			}
			if tc.want > 0 && r.maxTokens != int(tc.want) {
				t.Fatalf("routing sees max tokens %d, want %v", r.maxTokens, tc.want)
			}
		})
	}
}

// Chat sent as completions: the members vLLM's chat endpoint ignores but
// /v1/completions reads (prompt, prompt_embeds, suffix; logprobs false or
// null, which completions reads as a count) are left out, wherever they
// stand and however many neighbour one another, and the rest is kept.
func TestChatBodyDropsCompletionsMembers(t *testing.T) {
	const msgs = `"messages":[{"role":"user","content":"hi"}]`
	for _, body := range []string{
		`{"model":"m",` + msgs + `,"prompt":"other"}`,
		`{"prompt":"other",` + msgs + `,"model":"m"}`,
		`{"prompt":[1],"suffix":"s",` + msgs + `,"model":"m","logprobs":false,"prompt_embeds":"e","prompt":"x"}`,
		`{ "suffix" : "s" , "prompt" : "x" , ` + msgs + ` , "model":"m" , "logprobs" : null , "prompt" : "y" }`,
		`{"model":"m","logprobs":false,` + msgs + `,"max_completion_tokens":null,"pr\u006fmpt":"x"}`,
		`{"model":"m","max_tokens":3,"prompt":"x",` + msgs + `,"suffix":"s","max_completion_tokens":5}`,
	} {
		var r request
		if err := parseRequest(&r, epChat, []byte(body)); err != nil {
			t.Fatalf("%s: %v", body, err)
		}
		if r.chatOnly {
			t.Fatalf("%s: kept as chat", body)
		}
		out := chatToCompletionsBody(nil, []byte(body), &r, []uint32{4, 2}, 0)
		var got map[string]json.RawMessage
		if err := json.Unmarshal(out, &got); err != nil {
			t.Fatalf("%s → %s: %v", body, out, err)
		}
		if string(got["prompt"]) != "[4,2]" || string(got["model"]) != `"m"` || strings.Count(string(out), `"pr`) != 1 {
			t.Fatalf("%s → %s: want the rendered prompt only", body, out)
		}
		for _, k := range []string{"suffix", "prompt_embeds", "logprobs", "messages", "max_completion_tokens"} {
			if _, has := got[k]; has {
				t.Fatalf("%s → %s: %s kept", body, out, k)
			}
		}
	}
}

// A completions request without max_tokens stops at 16 tokens in vLLM and
// SGLang (their request models' default), so the budgets and the cost model
// see 16; null is the model's context, as is a chat request without one.
func TestCompletionsDefaultMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		ep   endpoint
		body string
		want int
	}{
		{epCompletions, `{"model":"m","prompt":"x"}`, 16},
		{epCompletions, `{"model":"m","prompt":"x","max_tokens":null}`, -1},
		{epCompletions, `{"model":"m","prompt":"x","max_tokens":40}`, 40},
		{epCompletions, `{"model":"m","prompt":"x","max_completion_tokens":40}`, 16},
		{epChat, `{"model":"m","messages":[{"role":"user","content":"x"}]}`, -1},
	} {
		var r request
		if err := parseRequest(&r, tc.ep, []byte(tc.body)); err != nil {
			t.Fatalf("%s: %v", tc.body, err)
		}
		if r.maxTokens != tc.want {
			t.Fatalf("%v %s: max tokens %d, want %d", tc.ep, tc.body, r.maxTokens, tc.want)
		}
	}
}

func TestErrorBody(t *testing.T) {
	ae := toAPIError(errors.New("boom \"quoted\"\n\x01é"))
	b := appendErrorBody(nil, ae)
	var v struct {
		Error struct {
			Message string  `json:"message"`
			Type    string  `json:"type"`
			Param   *string `json:"param"`
			Code    *string `json:"code"`
		} `json:"error"`
	}
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatalf("%s: %v", b, err)
	}
	if v.Error.Message != "boom \"quoted\"\n\x01é" || v.Error.Type != "server_error" || v.Error.Param != nil {
		t.Fatalf("%+v", v)
	}
}

func TestCompletionToChat(t *testing.T) {
	in := `{"id":"cmpl-1","object":"text_completion","created":7,"model":"m","choices":[{"index":0,"text":"he\"y","logprobs":null,"finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":2,"total_tokens":5}}`
	out := completionToChat(nil, []byte(in))
	var v struct {
		ID      string `json:"id"`
		Object  string `json:"object"`
		Choices []struct {
			Message struct {
				Role, Content string
			} `json:"message"`
			FinishReason string `json:"finish_reason"`
		} `json:"choices"`
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(out, &v); err != nil {
		t.Fatalf("%s: %v", out, err)
	}
	if v.ID != "chatcmpl-1" || v.Object != "chat.completion" || v.Choices[0].Message.Content != `he"y` ||
		v.Choices[0].Message.Role != "assistant" || v.Choices[0].FinishReason != "length" || v.Usage.CompletionTokens != 2 {
		t.Fatalf("%s", out)
	}
	if got := string(completionToChat(nil, []byte("{bad"))); got != "{bad" {
		t.Fatalf("malformed input must pass through, got %q", got)
	}
	// vLLM's stop_reason stays: in a whole choice as it is, null too, and in
	// a chunk where it is set (vLLM's chat stream has it on the last chunk).
	for _, tc := range []struct {
		stop  string
		chunk bool
		want  string
	}{
		{`"end"`, false, `,"stop_reason":"end"}`},
		{`128009`, false, `,"stop_reason":128009}`},
		{`null`, false, `,"stop_reason":null}`},
		{`"end"`, true, `,"stop_reason":"end"}`},
		{`null`, true, `"finish_reason":null}`},
	} {
		in := `{"id":"cmpl-1","created":7,"model":"m","choices":[{"index":0,"text":"a","logprobs":null,"finish_reason":"stop","stop_reason":` + tc.stop + `}]}`
		if tc.chunk && tc.stop == "null" {
			in = strings.Replace(in, `"finish_reason":"stop"`, `"finish_reason":null`, 1)
		}
		out := appendChatObject(nil, []byte(in), tc.chunk)
		if !json.Valid(out) || !strings.HasSuffix(string(out), tc.want+"]}") {
			t.Fatalf("stop_reason %s (chunk %v): %s, want the choice to end %s", tc.stop, tc.chunk, out, tc.want)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	for _, s := range []string{
		`{"model":"m","prompt":"hi","stream":true}`, `{"model":"m","prompt":[1,2,3]}`, `{"model":"m","prompt":[[1]]}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}]}`, `{"a":[{"b":null}],"model":"\u00e9","prompt":"\ud800"}`,
		`{"model":"m","prompt":"x","stream_options":{"include_usage":true},"max_tokens":1e3}`, `[]`, `{`, `{"":1}`,
		`{"model":"m","prompt":["a","b"]}`, `{"model":"m","prompt":[[1,2],[3]]}`,
		`{"max_tokens":2,"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":3}`,
		`{"max_completion_tokens":null,"model":"m","messages":[{"role":"user","content":"x"}] , "max_tokens":4}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_tokens":1,"max_tokens":null,"n":"64"}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tokens":"1_0","max_tokens":" 7 ","max_completion_tokens":null}`,
		`{"model":"m","messages":[{"role":"user","content":"x"}],"max_completion_tok\u0065ns":5,"max_tokens":2,"max_tokens":true}`,
		`{"model":"m","prompt":"x","max_tokens":"064","n":2.0,"n":"\u0033","truncate_prompt_tokens":"5"}`,
		`{"model":"m","prompt":["a","b"],"prompt":"c","stream_options":{"include_usage":true},"stream_options":null,"cache_salt":null}`,
		`{"model":"m","prompt":"x","stream":"Yes","stream":1.0}`, `{"model":"m","prompt":"x","stream":"\u004fff"}`, `{"model":"m","prompt":"x","stream":2}`,
		`{"prompt":"p","suffix":"s","model":"m","messages":[{"role":"user","content":"x"}],"logprobs":false,"prompt_embeds":"e","pr\u006fmpt":"q"}`,
	} {
		f.Add([]byte(s), false)
		f.Add([]byte(s), true)
	}
	f.Fuzz(func(t *testing.T, body []byte, chat bool) {
		ep := epCompletions
		if chat {
			ep = epChat
		}
		var r request
		err := parseRequest(&r, ep, body)
		if err == nil {
			if !json.Valid(body) {
				t.Fatalf("accepted invalid JSON %q", body)
			}
			// The model is what every JSON parser (the engine's) reads:
			// escaped keys decoded, the last member of a name winning; absent
			// or null means the one model served (handler.go, defaultModel).
			var top map[string]json.RawMessage
			if json.Unmarshal(body, &top) == nil && utf8.Valid(body) {
				var want string
				if raw, ok := top["model"]; ok && string(raw) != "null" {
					if err := json.Unmarshal(raw, &want); err != nil {
						t.Fatalf("accepted model %s, not a string", raw)
					}
				}
				if string(r.model) != want {
					t.Fatalf("model %q, encoding/json reads %q in %q", r.model, want, body)
				}
				// So are the output limit and n, as pydantic reads an int
				// (pyInt): max_completion_tokens (chat's alone) over
				// max_tokens when a number; n only when positive.
				intOf := func(name string) (int64, bool) {
					raw, ok := top[name]
					if !ok || string(raw) == "null" {
						return 0, false
					}
					return pyInt(raw)
				}
				wantMax := int64(-1)
				if v, ok := intOf("max_completion_tokens"); ok && chat {
					wantMax = v
				} else if v, ok := intOf("max_tokens"); ok {
					wantMax = v
				} else if _, sent := top["max_tokens"]; !sent && !chat {
					wantMax = 16 // vLLM's CompletionRequest default; null is the context
				}
				if wantMax >= 0 && int64(r.maxTokens) != min(wantMax, math.MaxInt32) || wantMax < 0 && r.maxTokens != -1 {
					t.Fatalf("max tokens %d, vLLM reads %d in %q", r.maxTokens, wantMax, body)
				}
				wantN := int64(0)
				if v, ok := intOf("n"); ok && v > 0 {
					wantN = min(v, math.MaxInt32)
				}
				if int64(r.n) != wantN {
					t.Fatalf("n %d, vLLM reads %d in %q", r.n, wantN, body)
				}
				// stream is what pydantic reads as a bool (pyBool), here
				// from encoding/json's reading of the member.
				wantStream := false
				if raw, ok := top["stream"]; ok {
					var v any
					if json.Unmarshal(raw, &v) != nil {
						t.Fatalf("stream %s unreadable, yet the request was accepted: %q", raw, body)
					}
					switch x := v.(type) {
					case nil:
					case bool:
						wantStream = x
					case float64:
						if x != 0 && x != 1 {
							t.Fatalf("stream %s accepted, pydantic refuses it: %q", raw, body)
						}
						wantStream = x == 1
					case string:
						switch strings.ToLower(x) {
						case "1", "on", "t", "true", "y", "yes":
							wantStream = true
						case "0", "off", "f", "false", "n", "no":
						default:
							t.Fatalf("stream %s accepted, pydantic refuses it: %q", raw, body)
						}
					default:
						t.Fatalf("stream %s accepted, pydantic refuses it: %q", raw, body)
					}
				}
				if r.stream != wantStream {
					t.Fatalf("stream %v, vLLM reads %v in %q", r.stream, wantStream, body)
				}
				if chat && r.kind == promptChat {
					// Sent as completions, the body's last max_tokens is chat's limit.
					var out map[string]json.RawMessage
					if err := json.Unmarshal(chatToCompletionsBody(nil, body, &r, []uint32{1, 2}, 0), &out); err != nil {
						t.Fatalf("chat body from %q: %v", body, err)
					}
					raw, has := out["max_tokens"]
					v, ok := pyInt(raw)
					if r.maxTokens >= 0 && (!ok || v != int64(r.maxTokens)) || r.maxTokens < 0 && (!has || string(raw) != "null") {
						t.Fatalf("chat limit %d, completions max_tokens %s, from %q", r.maxTokens, raw, body)
					}
				}
			}
			if r.kind == promptText || r.kind == promptIDs {
				out := rewritePrompt(nil, body, r.promptStart, r.promptEnd, []uint32{1, 2})
				if !json.Valid(out) {
					t.Fatalf("rewrite produced invalid JSON %q from %q", out, body)
				}
			}
			if r.kind == promptChat {
				out := chatToCompletionsBody(nil, body, &r, []uint32{1, 2}, 0)
				var m map[string]json.RawMessage
				if err := json.Unmarshal(out, &m); err != nil {
					t.Fatalf("chat body %q from %q: %v", out, body, err)
				}
				once := r.mctN == 1 && r.mtN <= 1 // duplicated names stay (the last one counts)
				if _, has := m["max_completion_tokens"]; has && once && (r.hasMCT || r.mctNull) {
					t.Fatalf("max_completion_tokens kept in %q", out)
				}
				// The prompt the engine reads is the rendered one, whatever
				// "prompt" members the client sent.
				if string(m["prompt"]) != "[1,2]" {
					t.Fatalf("completions prompt %s in %q, from %q", m["prompt"], out, body)
				}
			}
			return
		}
		if ae := toAPIError(err); ae.status != 400 {
			t.Fatalf("status %d for %v", ae.status, err)
		}
	})
}

func FuzzChatRewrap(f *testing.F) {
	f.Add([]byte(`{"id":"x","created":1,"model":"m","choices":[{"index":0,"text":"a","finish_reason":null}]}`))
	f.Add([]byte(`{"choices":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		out := appendChatObject(nil, b, true)
		if json.Valid(b) && !json.Valid(out) {
			t.Fatalf("valid input %q produced invalid %q", b, out)
		}
		roles, ok := appendRoleChunks(nil, b, 2)
		if !ok && len(roles) > 0 {
			t.Fatalf("%q: role chunks %q appended though refused", b, roles)
		}
		if ok && json.Valid(b) {
			for _, ev := range bytes.Split(bytes.TrimSuffix(roles, eventSep), eventSep) {
				if !json.Valid(bytes.TrimPrefix(ev, dataPrefix)) {
					t.Fatalf("valid input %q produced the invalid role chunk %q", b, ev)
				}
			}
		}
	})
}

// TestEscapedKeys: a member whose key is written with escapes is the member
// every JSON parser reads, the engine's included ("mod\u0065l" is "model"):
// before, the ingress skipped it, so it routed, budgeted and streamed by
// other values than the engine served by. A later member wins, null too.
func TestEscapedKeys(t *testing.T) {
	var r request
	body := `{"mod\u0065l":"m","prompt":"x","str\u0065am":true,"max_tok\u0065ns":5}`
	if err := parseRequest(&r, epCompletions, []byte(body)); err != nil {
		t.Fatal(err)
	}
	if string(r.model) != "m" || !r.stream || r.maxTokens != 5 || r.kind != promptText {
		t.Fatalf("model %q stream %v max tokens %d kind %v", r.model, r.stream, r.maxTokens, r.kind)
	}
	r = request{}
	if err := parseRequest(&r, epCompletions, []byte(`{"model":"a","prompt":"x","model":null}`)); err != nil || len(r.model) != 0 {
		t.Fatalf("model %q after a later null, %v", r.model, err)
	}
}
