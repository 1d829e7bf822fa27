package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// LoadDir loads a model directory as Hugging Face lays it out:
// tokenizer.json, or tiktoken.model with tokenizer_config.json (LoadPath),
// and tokenizer_config.json (optional). The chat template is nil when the
// directory has none.
func LoadDir(dir string) (*Native, *ChatTemplate, error) {
	tk, err := LoadPath(dir)
	if err != nil {
		return nil, nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if errors.Is(err, fs.ErrNotExist) {
		return tk, nil, nil
	}
	if err != nil {
		return nil, nil, fmt.Errorf("load chat template: %w", err)
	}
	ct, err := ParseChatTemplateConfig(b)
	if errors.Is(err, errNoChatTemplate) {
		return tk, nil, nil
	}
	if err != nil {
		return nil, nil, err
	}
	return tk, ct, nil
}

// LoadPath loads a tokenizer.json file, or a directory holding tokenizer.json
// or, failing that, tiktoken.model and tokenizer_config.json (Kimi K2, Meta's
// original Llama 3 files; the split pattern is Kimi's when the config names
// its TikTokenTokenizer class, Llama 3's otherwise).
func LoadPath(path string) (*Native, error) {
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	if !st.IsDir() {
		return LoadFile(path)
	}
	if _, err := os.Stat(filepath.Join(path, "tokenizer.json")); err == nil {
		return LoadFile(filepath.Join(path, "tokenizer.json"))
	}
	model, cfg := filepath.Join(path, "tiktoken.model"), filepath.Join(path, "tokenizer_config.json")
	b, err := os.ReadFile(cfg)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %s has neither tokenizer.json nor tiktoken.model with tokenizer_config.json: %w", path, err)
	}
	var c struct {
		Class string `json:"tokenizer_class"`
	}
	_ = json.Unmarshal(b, &c)
	pattern := TiktokenPatternLlama3
	if c.Class == "TikTokenTokenizer" {
		pattern = TiktokenPatternKimi
	}
	return LoadTiktoken(model, cfg, pattern)
}
