package sim

import (
	"encoding/json"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"github.com/kvmesh/kvmesh/internal/testutil"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

func llama3Files(t *testing.T) (tok, cfg string) {
	t.Helper()
	out, err := exec.Command("go", "mod", "download", "-json", "github.com/daulet/tokenizers").Output()
	testutil.Need(t, err, "the Llama 3 tokenizer from the module cache (go mod download github.com/daulet/tokenizers)")
	var v struct{ Dir string }
	if err := json.Unmarshal(out, &v); err != nil || v.Dir == "" {
		t.Fatalf("module dir: %v", err)
	}
	d := filepath.Join(v.Dir, "test", "data")
	return filepath.Join(d, "Meta-Llama-3-8B-Instruct.json"), filepath.Join(d, "meta-llama-3-8b-instruct", "tokenizer_config.json")
}

// With the project's tokenizer and the model's chat template, the simulator
// tokenizes exactly as the tokenizer package does (and so as the ingress does).
func TestRealTokenizerAndChatTemplate(t *testing.T) {
	tokPath, cfgPath := llama3Files(t)
	tk, err := tokenizer.LoadFile(tokPath)
	if err != nil {
		t.Fatal(err)
	}
	ct, err := tokenizer.LoadChatTemplateFile(cfgPath)
	if err != nil {
		t.Fatal(err)
	}
	s := startSim(t, func(c *Config) { c.Tokenizer, c.Chat = tk, TemplateChat{T: ct} })
	text := "The quick brown fox jumps over the lazy dog."
	code, b, _ := post(t, s.URL()+"/tokenize", map[string]any{"model": "test-model", "prompt": text})
	var tr openai.TokenizeResponse
	if code != 200 || json.Unmarshal(b, &tr) != nil || !slices.Equal(tr.Tokens, tk.Encode(text, true)) {
		t.Fatalf("tokenize %d %s", code, b)
	}
	msgs := []tokenizer.Message{{Role: "system", Content: "You are terse."}, {Role: "user", Content: "Hello!"}}
	rendered, err := ct.Render(msgs, true)
	if err != nil {
		t.Fatal(err)
	}
	want := tk.Encode(rendered, false)
	code, b, _ = post(t, s.URL()+"/tokenize", map[string]any{"model": "test-model", "messages": msgs})
	if code != 200 || json.Unmarshal(b, &tr) != nil || !slices.Equal(tr.Tokens, want) {
		t.Fatalf("chat tokenize %d %s, want %v", code, b, want)
	}
	code, b, _ = post(t, s.URL()+"/v1/chat/completions", map[string]any{"model": "test-model", "messages": msgs, "max_tokens": 3})
	var cc openai.ChatCompletion
	if code != 200 || json.Unmarshal(b, &cc) != nil || cc.Usage.PromptTokens != len(want) || cc.Choices[0].Message.Content == "" {
		t.Fatalf("chat %d %s", code, b)
	}
}
