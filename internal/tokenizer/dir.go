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
	ct, err := LoadChatTemplateDir(dir)
	if err != nil {
		return nil, nil, err
	}
	return tk, ct, nil
}

// LoadChatTemplateDir loads a model directory's chat template where
// transformers and vLLM find it, first found wins: chat_template.jinja (what
// transformers saves since 4.47), a processor's chat_template.json
// (multimodal models; vLLM prefers the processor's template), then
// tokenizer_config.json's chat_template. The special tokens come from
// tokenizer_config.json. nil, and no error, when the directory has none.
func LoadChatTemplateDir(dir string) (*ChatTemplate, error) {
	cfg, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	var raw map[string]json.RawMessage
	if len(cfg) > 0 {
		if err := json.Unmarshal(cfg, &raw); err != nil {
			return nil, fmt.Errorf("parse tokenizer_config: %w: %v", ErrInvalid, err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.jinja")); err == nil {
		return NewChatTemplate(string(b), specialTokens(raw))
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "chat_template.json")); err == nil {
		var proc map[string]json.RawMessage
		if err := json.Unmarshal(b, &proc); err != nil {
			return nil, fmt.Errorf("parse chat_template.json: %w: %v", ErrInvalid, err)
		}
		src, err := templateSource(proc["chat_template"])
		if err == nil {
			return NewChatTemplate(src, specialTokens(raw))
		}
		if !errors.Is(err, errNoChatTemplate) {
			return nil, err
		}
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	src, err := templateSource(raw["chat_template"])
	if errors.Is(err, errNoChatTemplate) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return NewChatTemplate(src, specialTokens(raw))
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
