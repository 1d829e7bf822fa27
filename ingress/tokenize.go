package ingress

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"unsafe"

	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
)

// ErrNoChatTemplate means a model's tokenizer has no chat template: chat
// requests for it are routed on load only and forwarded as chat.
var ErrNoChatTemplate = errors.New("no chat template")

// hfTokenizer adapts internal/tokenizer (with its per-prefix cache) to Tokenizer.
type hfTokenizer struct {
	enc *tokenizer.CachingTokenizer
	// render applies the chat template; nil when the model has none.
	render func(msgs []Message) (string, error)
}

var _ Tokenizer = (*hfTokenizer)(nil)

// Encode tokenizes a completions prompt the way vLLM does (special tokens added).
func (h *hfTokenizer) Encode(dst []uint32, text []byte) ([]uint32, error) {
	// The tokenizer only reads text during the call.
	return h.enc.AppendEncode(dst, unsafe.String(unsafe.SliceData(text), len(text)), true), nil
}

// RenderChat renders the template (it carries its own special tokens).
func (h *hfTokenizer) RenderChat(dst []uint32, msgs []Message) ([]uint32, error) {
	if h.render == nil {
		return dst, ErrNoChatTemplate
	}
	s, err := h.render(msgs)
	if err != nil {
		return dst, fmt.Errorf("chat template: %w", err)
	}
	return h.enc.AppendEncode(dst, s, false), nil
}

// NewTokenizer wraps a loaded tokenizer (with a per-prefix cache) and the
// model's chat template (nil: none) as a Tokenizer.
func NewTokenizer(nt *tokenizer.Native, tpl *tokenizer.ChatTemplate) (Tokenizer, error) {
	ct, err := tokenizer.NewCachingTokenizer(nt, tokenizer.DefaultCacheConfig())
	if err != nil {
		return nil, fmt.Errorf("tokenizer cache: %w", err)
	}
	h := &hfTokenizer{enc: ct}
	if tpl != nil {
		h.render = renderWith(tpl)
	}
	return h, nil
}

// TokenizerMap is a fixed model → tokenizer map (Deps.Tokenizers).
type TokenizerMap map[string]Tokenizer

var _ Tokenizers = TokenizerMap(nil)

// For returns model's tokenizer.
func (m TokenizerMap) For(model string) (Tokenizer, bool) {
	t, ok := m[model]
	return t, ok
}

// LoadTokenizers loads Config.Tokenizers into deps.Tokenizers (when it is
// nil). A path may be tokenizer.json itself or a directory holding it.
func LoadTokenizers(cfg *Config, deps *Deps) error {
	if deps.Tokenizers != nil || len(cfg.Tokenizers) == 0 {
		return nil
	}
	m := TokenizerMap{}
	for model, path := range cfg.Tokenizers {
		file := path
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			file = filepath.Join(path, "tokenizer.json")
		}
		nt, err := tokenizer.LoadFile(file)
		if err != nil {
			return fmt.Errorf("tokenizer for %s: %w", model, err)
		}
		ct, err := tokenizer.NewCachingTokenizer(nt, tokenizer.DefaultCacheConfig())
		if err != nil {
			return fmt.Errorf("tokenizer for %s: %w", model, err)
		}
		tplPath := cfg.ChatTemplates[model]
		if tplPath == "" {
			if st, err := os.Stat(path); err == nil && st.IsDir() {
				if _, err := os.Stat(filepath.Join(path, "tokenizer_config.json")); err == nil {
					tplPath = filepath.Join(path, "tokenizer_config.json")
				}
			}
		}
		render, err := chatRenderer(tplPath)
		if err != nil {
			return fmt.Errorf("chat template for %s: %w", model, err)
		}
		m[model] = &hfTokenizer{enc: ct, render: render}
	}
	deps.Tokenizers = m
	return nil
}

// chatRenderer loads a tokenizer_config.json's chat template; nil when path is "".
func chatRenderer(path string) (func([]Message) (string, error), error) {
	if path == "" {
		return nil, nil
	}
	ct, err := tokenizer.LoadChatTemplateFile(path)
	if err != nil {
		return nil, err
	}
	return renderWith(ct), nil
}

func renderWith(ct *tokenizer.ChatTemplate) func([]Message) (string, error) {
	return func(msgs []Message) (string, error) {
		tm := make([]tokenizer.Message, len(msgs))
		for i, m := range msgs {
			tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
		}
		return ct.Render(tm, true)
	}
}

// SessionErrors maps ingress/session's admission errors onto the ingress
// sentinels (for Deps.ClassifyError).
func SessionErrors(err error) error {
	switch {
	case errors.Is(err, session.ErrQueueTimeout):
		return fmt.Errorf("%w: %w", ErrQueueTimeout, err)
	case errors.Is(err, session.ErrQueueFull):
		return fmt.Errorf("%w: %w", ErrOverloaded, err)
	}
	return err
}
