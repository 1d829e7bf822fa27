package tokenizer

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// LoadDir loads a model directory as Hugging Face lays it out:
// tokenizer.json (required) and tokenizer_config.json (optional). The chat
// template is nil when the directory has none.
func LoadDir(dir string) (*Native, *ChatTemplate, error) {
	tk, err := LoadFile(filepath.Join(dir, "tokenizer.json"))
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
