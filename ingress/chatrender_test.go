package ingress

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/sim"
)

// keySpy records the keys of every request the real scheduler sees.
type keySpy struct {
	Scheduler
	mu   sync.Mutex
	keys [][]uint64
}

func (k *keySpy) Schedule(req *scheduler.Request, engines []scheduler.Engine, d *scheduler.Decision) error {
	k.mu.Lock()
	k.keys = append(k.keys, slices.Clone(req.Keys))
	k.mu.Unlock()
	return k.Scheduler.Schedule(req, engines, d)
}

func (k *keySpy) last() []uint64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	if len(k.keys) == 0 {
		return nil
	}
	return k.keys[len(k.keys)-1]
}

// templateEngine starts a simulator serving model that renders chat with
// tpl and tokenizes with nt, and an ingress in front of it (chatMode, "" for
// the default) keying with the same, its scheduler spied on.
func templateEngine(t *testing.T, model string, nt *tokenizer.Native, tpl *tokenizer.ChatTemplate, chatMode string) (*sim.Server, *Server, *keySpy, Config) {
	t.Helper()
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	sm, err := sim.Start(context.Background(), sim.Config{Model: model, TimeScale: 500, Tokenizer: nt, Chat: sim.TemplateChat{T: tpl}, Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sm.Close() })
	cfg := testConfig(StaticEngine{ID: "s", Model: model, URL: sm.URL()})
	if chatMode != "" {
		cfg.ChatMode = chatMode
	}
	tk, err := NewTokenizer(nt, tpl)
	if err != nil {
		t.Fatal(err)
	}
	deps := Deps{Tokenizers: TokenizerMap{model: tk}, Logger: quiet}
	s, spy := spiedIngress(t, cfg, deps)
	return sm, s, spy, cfg
}

// spiedIngress starts an ingress with cfg's default scheduler, spied on.
func spiedIngress(t *testing.T, cfg Config, deps Deps) (*Server, *keySpy) {
	t.Helper()
	sch, err := defaultScheduler(&cfg, &deps)
	if err != nil {
		t.Fatal(err)
	}
	spy := &keySpy{Scheduler: sch}
	deps.Scheduler = spy
	return startIngress(t, cfg, deps), spy
}

// engineCachedAll waits until the engine has cached the last of keys, then
// fails the test unless it has cached every one of them.
func engineCachedAll(t *testing.T, sm *sim.Server, keys []uint64) {
	t.Helper()
	var engine []uint64
	testutil.WaitFor(t, 10*time.Second, "the engine to cache the request's blocks", func() bool {
		engine = sm.CachedKeys(0, kvevents.TierGPU)
		_, found := slices.BinarySearch(engine, keys[len(keys)-1])
		return found
	})
	for i, k := range keys {
		if _, found := slices.BinarySearch(engine, k); !found {
			t.Fatalf("ingress key %d of %d (%x) is not among the engine's %d cached keys", i, len(keys), k, len(engine))
		}
	}
}

// toolsTemplate is vLLM's Llama 3.1 tool template (tools in the first user
// turn, tool calls as JSON, tool results as ipython turns).
func toolsTemplate(t *testing.T) *tokenizer.ChatTemplate {
	t.Helper()
	src, err := os.ReadFile("../testdata/tokenizer/templates/vllm-llama3.1_json.jinja")
	if err != nil {
		t.Fatal(err)
	}
	tpl, err := tokenizer.NewChatTemplate(string(src), map[string]string{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"})
	if err != nil {
		t.Fatal(err)
	}
	return tpl
}

// toolsRequest: tools, a tool call with string arguments, a multi-part tool
// result, chat_template_kwargs and a multi-part user turn.
const toolsRequest = `{"model":"llama","max_tokens":2,
 "messages":[{"role":"system","content":"You are a weather bot."},
  {"role":"user","content":"What is the weather in Paris today? Please answer in celsius."},
  {"role":"assistant","content":null,"tool_calls":[{"id":"call_abc123456","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}]},
  {"role":"tool","tool_call_id":"call_abc123456","content":[{"type":"text","text":"21 C"},{"type":"text","text":"sunny"}]},
  {"role":"user","content":[{"type":"text","text":"And tomorrow"},{"type":"text","text":"in Rome?"}]}],
 "tools":[{"type":"function","function":{"name":"get_weather","description":"Get the weather for a city.","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],
 "tool_choice":"auto","chat_template_kwargs":{"date_string":"26 Jul 2024"}}`

// A tools request's block keys at the ingress equal the keys of the blocks
// the engine cached for it (the sim renders with the same template and
// tokenizer), in both chat modes; with the tools dropped they would not.
func TestChatToolsKeysEqualEngine(t *testing.T) {
	nt, _ := llama(t)
	tpl := toolsTemplate(t)
	for _, mode := range []string{ChatModeChat, ChatModeCompletions} {
		t.Run(mode, func(t *testing.T) {
			sm, s, spy, cfg := templateEngine(t, "llama", nt, tpl, mode)

			st, _, body := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/chat/completions", toolsRequest)
			if st != http.StatusOK {
				t.Fatalf("status %d: %s", st, body)
			}
			keys := spy.last()
			if len(keys) < 8 {
				t.Fatalf("ingress computed %d keys; the tools prompt should span many blocks", len(keys))
			}
			var engine []uint64
			testutil.WaitFor(t, 10*time.Second, "the engine to cache the request's blocks", func() bool {
				engine = sm.CachedKeys(0, kvevents.TierGPU)
				return len(engine) >= len(keys)
			})
			for i, k := range keys {
				if _, found := slices.BinarySearch(engine, k); !found {
					t.Fatalf("ingress key %d (%x) is not among the engine's %d cached keys", i, k, len(engine))
				}
			}
			// The engine's own /tokenize of the same request gives exactly the
			// ingress's key chain.
			_, _, tb := post(t, http.DefaultClient, sm.URL()+"/tokenize", strings.Replace(toolsRequest, `"max_tokens":2,`, `"add_special_tokens":false,`, 1))
			var tr struct{ Tokens []uint32 }
			if err := json.Unmarshal(tb, &tr); err != nil || len(tr.Tokens) == 0 {
				t.Fatalf("engine /tokenize: %v %s", err, tb)
			}
			if ek := kvevents.AppendKeys(nil, kvevents.Root("llama", "", ""), tr.Tokens, cfg.BlockSize); !slices.Equal(ek, keys) {
				t.Fatalf("engine /tokenize keys (%d) differ from the ingress's (%d)", len(ek), len(keys))
			}
			// The same conversation without its tools, as the ingress rendered
			// it before: its key chain leaves the engine's.
			flat := []tokenizer.Message{{Role: "system", Content: "You are a weather bot."}, {Role: "user", Content: "What is the weather in Paris today? Please answer in celsius."}}
			text, err := tpl.Render(flat, true)
			if err != nil {
				t.Fatal(err)
			}
			old := kvevents.AppendKeys(nil, kvevents.Root("llama", "", ""), nt.Encode(text, false), cfg.BlockSize)
			if i := slices.IndexFunc(old, func(k uint64) bool { _, found := slices.BinarySearch(engine, k); return !found }); i < 0 {
				t.Fatal("every block of the rendering without tools is cached too: the test does not show the tools matter")
			}
		})
	}
}

// Media parts for a text-only model, ids beyond the vocabulary and wrongly
// typed fields are 400s with an OpenAI error body that names the JSON field,
// not a Go type.
func TestChatRequestRejections(t *testing.T) {
	s, nt := tokenizedRig(t, ChatModeChat)
	url := "http://" + s.Addr()
	for _, c := range []struct {
		path, body, param, msg string
	}{
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"file","file":{"file_id":"f1"}}]}]}`,
			"messages", `unsupported type "file"`},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":[{"uuid":"u1"}]}]}`,
			"messages", "has no type"},
		{"/v1/completions", `{"model":"llama","prompt":[1,2,` + itoa(nt.VocabSize()) + `]}`, "prompt", "out of vocabulary"},
		{"/v1/completions", `{"model":"llama","prompt":[[1,2],[3,` + itoa(nt.VocabSize()+5) + `]]}`, "prompt", "prompt[1]: token id"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":7,"content":"x"}]}`, "messages[0].role", "must be a string"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":7}]}`, "messages[0].content", "must be a string"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],"tools":{}}`, "tools", "must be an array"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],"tool_choice":"required"}`, "tool_choice", "tools must be set"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],"chat_template_kwargs":[1]}`, "chat_template_kwargs", "must be an object"},
		{"/v1/chat/completions", `{"model":"llama","messages":[{"role":"user","content":"x"}],"chat_template":"{{ 1 }}"}`, "chat_template", "not accepted"},
	} {
		st, _, body := post(t, http.DefaultClient, url+c.path, c.body)
		var e struct {
			Error struct {
				Message, Type string
				Param         *string
			}
		}
		if err := json.Unmarshal(body, &e); err != nil || st != http.StatusBadRequest {
			t.Fatalf("%s: status %d body %s", c.body, st, body)
		}
		if e.Error.Type != "invalid_request_error" || e.Error.Param == nil || *e.Error.Param != c.param || !strings.Contains(e.Error.Message, c.msg) {
			t.Errorf("%s: error %+v, want param %q and %q in the message", c.body, e.Error, c.param, c.msg)
		}
		if strings.Contains(e.Error.Message, "Go ") || strings.Contains(e.Error.Message, "struct") {
			t.Errorf("%s: message names Go types: %s", c.body, e.Error.Message)
		}
	}
}

func itoa(n int) string {
	b, _ := json.Marshal(n)
	return string(b)
}
