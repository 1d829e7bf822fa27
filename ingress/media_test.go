package ingress

import (
	"encoding/json"
	"math"
	"net/http"
	"os"
	"slices"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

// A chat request with images is forwarded as chat (vLLM fetches and encodes
// the media) and keyed up to its first media item: every key the ingress
// computes is a block the engine cached for it, in the "openai" content
// format (Qwen3-VL's template) and the "string" one (Llama 3's), through
// chat and the Responses API. The same text with another image reuses the
// blocks before the image only; the same image reuses the blocks past it.
func TestMediaKeysBeforeFirstItem(t *testing.T) {
	nt, llamaTpl := llama(t)
	src, err := os.ReadFile("../testdata/tokenizer/templates/ardan-Qwen3-VL-30B-A3B-Instruct-Q8_0.jinja")
	if err != nil {
		t.Fatal(err)
	}
	vlTpl, err := tokenizer.NewChatTemplate(string(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		tpl  *tokenizer.ChatTemplate
	}{{"openai format", vlTpl}, {"string format", llamaTpl}} {
		t.Run(c.name, func(t *testing.T) { testMediaKeys(t, nt, c.tpl) })
	}
}

func testMediaKeys(t *testing.T, nt *tokenizer.Native, tpl *tokenizer.ChatTemplate) {
	sm, s, spy, cfg := templateEngine(t, "vl", nt, tpl, ChatModeCompletions) // a request with media must still go as chat

	system := strings.Repeat("You read photographs of shop signs and answer with the text they show, nothing else. ", 8)
	chat := func(url string) string {
		return `{"model":"vl","max_tokens":2,"messages":[{"role":"system","content":` + string(mustJSON(t, system)) + `},` +
			`{"role":"user","content":[{"type":"text","text":"What does this sign say?"},{"type":"image_url","image_url":{"url":"` + url + `"}}]}]}`
	}
	send := func(path, body string) (openai.Usage, []uint64) {
		t.Helper()
		st, _, b := post(t, http.DefaultClient, "http://"+s.Addr()+path, body)
		if st != http.StatusOK {
			t.Fatalf("%s: status %d: %s", path, st, b)
		}
		var r struct {
			Object string
			Usage  json.RawMessage
		}
		if err := json.Unmarshal(b, &r); err != nil {
			t.Fatal(err)
		}
		var u openai.Usage
		if r.Object == "response" { // the Responses API's usage names
			var ru struct {
				InputTokens        int `json:"input_tokens"`
				InputTokensDetails struct {
					CachedTokens int `json:"cached_tokens"`
				} `json:"input_tokens_details"`
			}
			if err := json.Unmarshal(r.Usage, &ru); err != nil {
				t.Fatal(err)
			}
			u.PromptTokens = ru.InputTokens
			u.PromptTokensDetails = &openai.PromptTokensDetails{CachedTokens: ru.InputTokensDetails.CachedTokens}
		} else if err := json.Unmarshal(r.Usage, &u); err != nil {
			t.Fatal(err)
		}
		return u, spy.last()
	}
	cachedAll := func(keys []uint64) { t.Helper(); engineCachedAll(t, sm, keys) }

	counted := func() float64 { return val(s.m.tokensIn) } // the prompt tokens the ingress counted
	before := counted()
	first, keys := send("/v1/chat/completions", chat("https://example.com/a.png"))
	if n := counted() - before; n > float64(first.PromptTokens-256) {
		t.Fatalf("first media request counted %v of %d tokens: nothing learned yet, the image should count for nothing", n, first.PromptTokens)
	}
	bs := cfg.BlockSize
	if len(keys)*bs < len(nt.Encode(system, false)) || len(keys)*bs > first.PromptTokens-256 {
		t.Fatalf("%d keys of %d tokens for a %d-token system prompt and a %d-token prompt with a 256-token image",
			len(keys), bs, len(nt.Encode(system, false)), first.PromptTokens)
	}
	cachedAll(keys)

	other, keys2 := send("/v1/chat/completions", chat("https://example.com/b.png"))
	if !slices.Equal(keys2, keys) {
		t.Fatalf("another image changed the keys before it: %d and %d keys", len(keys), len(keys2))
	}
	if got := other.CachedTokens(); got < len(keys)*bs || got >= first.PromptTokens-256 {
		t.Fatalf("another image: %d cached tokens, want the %d before the image and none past it (prompt %d)", got, len(keys)*bs, other.PromptTokens)
	}
	before = counted()
	same, _ := send("/v1/chat/completions", chat("https://example.com/a.png"))
	if got := same.CachedTokens(); got < same.PromptTokens-bs {
		t.Fatalf("the same image again: %d of %d tokens cached", got, same.PromptTokens)
	}
	// The image's 256 tokens are learned from the engine's answers.
	if n := counted() - before; math.Abs(n-float64(same.PromptTokens)) > 2 {
		t.Fatalf("after two answers the ingress counted %v tokens for a %d-token prompt", n, same.PromptTokens)
	}

	// A photo inline as a base64 data URL (12 MB of it) goes through too.
	big, _ := send("/v1/chat/completions", chat("data:image/jpeg;base64,"+strings.Repeat("QUJD", 3<<20)))
	if big.CachedTokens() < len(keys)*bs {
		t.Fatalf("inline image: %d cached tokens, want the %d before it", big.CachedTokens(), len(keys)*bs)
	}

	// The Responses API's input_image: keyed the same way, up to the image.
	resp := `{"model":"vl","max_output_tokens":2,"instructions":` + string(mustJSON(t, system)) + `,` +
		`"input":[{"role":"user","content":[{"type":"input_text","text":"Read this one."},{"type":"input_image","image_url":"https://example.com/c.png"}]}]}`
	ru, rkeys := send("/v1/responses", resp)
	if len(rkeys) == 0 || ru.PromptTokens < len(rkeys)*bs+256 {
		t.Fatalf("responses: %d keys, %d prompt tokens", len(rkeys), ru.PromptTokens)
	}
	cachedAll(rkeys)
}
