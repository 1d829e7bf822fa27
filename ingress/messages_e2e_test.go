package ingress

import (
	"encoding/json"
	"net/http"
	"slices"
	"testing"
)

// A Messages request's block keys at the ingress are blocks the engine
// cached for it (the simulator converts and renders it as vLLM does, with
// the same template and tokenizer), tools, a tool round trip and system
// blocks included; the next turn of the conversation reuses them.
func TestMessagesKeysEqualEngine(t *testing.T) {
	nt, _ := llama(t)
	tpl := toolsTemplate(t)
	sm, s, spy, cfg := templateEngine(t, "llama", nt, tpl, "")

	const head = `{"model":"llama","max_tokens":3,
	 "system":[{"type":"text","text":"x-anthropic-billing-header: cch=1;"},{"type":"text","text":"You are a weather bot for travellers in Europe. Answer in one short sentence."}],
	 "tools":[{"name":"get_weather","description":"Get the weather for a city.","input_schema":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}],
	 "messages":[{"role":"user","content":"What is the weather in Paris today? Please answer in celsius."},
	  {"role":"assistant","content":[{"type":"text","text":"Checking."},{"type":"tool_use","id":"toolu_01","name":"get_weather","input":{"city":"Paris"}}]},
	  {"role":"user","content":[{"type":"tool_result","tool_use_id":"toolu_01","content":[{"type":"text","text":"21 C"},{"type":"text","text":"sunny"}]}]}`
	send := func(body string) (cached, prompt int, keys []uint64) {
		t.Helper()
		st, hdr, b := post(t, http.DefaultClient, "http://"+s.Addr()+"/v1/messages", body)
		if st != http.StatusOK || hdr.Get("X-Kvmesh-Engine") != "s" {
			t.Fatalf("status %d: %s", st, b)
		}
		var m struct {
			Type  string
			Usage struct {
				InputTokens          int `json:"input_tokens"`
				CacheReadInputTokens int `json:"cache_read_input_tokens"`
			}
		}
		if err := json.Unmarshal(b, &m); err != nil || m.Type != "message" {
			t.Fatalf("answer %s: %v", b, err)
		}
		return m.Usage.CacheReadInputTokens, m.Usage.InputTokens + m.Usage.CacheReadInputTokens, spy.last()
	}
	_, prompt, keys := send(head + `]}`)
	if len(keys) < 8 || len(keys)*cfg.BlockSize > prompt {
		t.Fatalf("%d keys for a %d-token prompt", len(keys), prompt)
	}
	engineCachedAll(t, sm, keys)
	cached, prompt2, keys2 := send(head + `,{"role":"assistant","content":"It is 21 C and sunny in Paris."},{"role":"user","content":"And in Rome?"}]}`)
	if !slices.Equal(keys2[:len(keys)-1], keys[:len(keys)-1]) || prompt2 <= prompt || cached < (len(keys)-1)*cfg.BlockSize {
		t.Fatalf("next turn: %d cached of %d, keys share the first turn's: %v", cached, prompt2, slices.Equal(keys2[:len(keys)-1], keys[:len(keys)-1]))
	}
}
