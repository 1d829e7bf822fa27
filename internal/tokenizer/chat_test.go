package tokenizer

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"
)

type chatGolden struct {
	ChatTemplate string `json:"chat_template"`
	BOS          string `json:"bos_token"`
	EOS          string `json:"eos_token"`
	Cases        []struct {
		Messages []Message `json:"messages"`
		Rendered string    `json:"rendered"`
		IDs      []uint32  `json:"ids"`
	} `json:"cases"`
}

// TestChatGolden renders every conversation of chat_golden.json with the
// Llama 3 tokenizer_config.json and checks text and ids.
func TestChatGolden(t *testing.T) {
	b, err := os.ReadFile("../../testdata/tokenizer/chat_golden.json")
	if err != nil {
		t.Fatal(err)
	}
	var g chatGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	ct, err := LoadChatTemplateFile(filepath.Join(tokenizerDataDir(t), "meta-llama-3-8b-instruct", "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	tk := loadNamed(t, "Meta-Llama-3-8B-Instruct")
	if len(g.Cases) == 0 {
		t.Fatal("no cases")
	}
	for i, c := range g.Cases {
		got, err := ct.Render(c.Messages, true)
		if err != nil {
			t.Fatalf("case %d: %v", i, err)
		}
		if got != c.Rendered {
			t.Fatalf("case %d: rendered\n%q\nwant\n%q", i, got, c.Rendered)
		}
		if d := firstDiff(tk.Encode(got, false), c.IDs); d >= 0 {
			t.Fatalf("case %d: ids differ at %d", i, d)
		}
	}
}
