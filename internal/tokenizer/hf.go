//go:build hftokenizers

package tokenizer

import (
	"fmt"
	"os"
	"sync"

	hftok "github.com/daulet/tokenizers"
)

// HF is the Tokenizer backed by the Hugging Face Rust library through
// github.com/daulet/tokenizers (cgo, needs libtokenizers.a at link time).
// Build with -tags hftokenizers. Token lookups use the pure-Go Native loaded
// from the same file, so both backends agree on spellings.
//
// Concurrency: safe for concurrent use (the Rust tokenizer is immutable);
// Close must not race with other calls.
type HF struct {
	hf     *hftok.Tokenizer
	native *Native
	once   sync.Once
}

var _ Tokenizer = (*HF)(nil)

// LoadFileHF loads tokenizer.json into both the Rust library and Native.
func LoadFileHF(path string) (*HF, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer: %w", err)
	}
	native, err := Load(b)
	if err != nil {
		return nil, err
	}
	hf, err := hftok.FromBytes(b)
	if err != nil {
		return nil, fmt.Errorf("load tokenizer (hf): %w", err)
	}
	return &HF{hf: hf, native: native}, nil
}

// Encode implements Tokenizer.
func (t *HF) Encode(text string, addSpecialTokens bool) []uint32 {
	ids, _ := t.hf.Encode(text, addSpecialTokens)
	return ids
}

// AppendEncode implements Tokenizer (the cgo call allocates regardless).
func (t *HF) AppendEncode(dst []uint32, text string, addSpecialTokens bool) []uint32 {
	ids, _ := t.hf.Encode(text, addSpecialTokens)
	return append(dst, ids...)
}

// Decode implements Tokenizer.
func (t *HF) Decode(ids []uint32, skipSpecialTokens bool) string {
	return t.hf.Decode(ids, skipSpecialTokens)
}

// VocabSize implements Tokenizer.
func (t *HF) VocabSize() int { return t.native.VocabSize() }

// TokenToID implements Tokenizer.
func (t *HF) TokenToID(token string) (uint32, bool) { return t.native.TokenToID(token) }

// IDToToken implements Tokenizer.
func (t *HF) IDToToken(id uint32) (string, bool) { return t.native.IDToToken(id) }

// Close frees the Rust tokenizer; it is idempotent.
func (t *HF) Close() error {
	var err error
	t.once.Do(func() { err = t.hf.Close() })
	return err
}
