package tokenizer

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"

	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
)

// Message is one chat message (content parts already flattened to text).
type Message struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatTemplate renders conversations with a model's Jinja chat_template the
// way transformers' apply_chat_template does (trim_blocks, lstrip_blocks,
// bos_token/eos_token and the other special tokens as variables). Encode the
// result with addSpecialTokens=false, as vLLM does.
//
// Concurrency: immutable after construction; Render may be called concurrently.
type ChatTemplate struct {
	tmpl *chattmpl.Template
	vars map[string]any // special-token variables
	// openaiFormat: the template loops over message content, so vLLM hands it
	// content as a list of parts (its "openai" content format).
	openaiFormat bool
}

// errNoChatTemplate: tokenizer_config.json has no chat_template.
var errNoChatTemplate = fmt.Errorf("parse tokenizer_config: %w: no chat_template", ErrInvalid)

var specialTokenKeys = []string{"bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token"}

// LoadChatTemplateFile reads a chat template: a model directory
// (LoadChatTemplateDir), a tokenizer_config.json or a processor's
// chat_template.json (its chat_template), or a Jinja file (vLLM's
// --chat-template), whose special tokens come from the tokenizer_config.json
// beside it when there is one.
func LoadChatTemplateFile(path string) (*ChatTemplate, error) {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		ct, err := LoadChatTemplateDir(path)
		if err == nil && ct == nil {
			err = fmt.Errorf("load chat template: %s: %w", path, errNoChatTemplate)
		}
		return ct, err
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("load chat template: %w", err)
	}
	if strings.HasSuffix(path, ".jinja") || !json.Valid(b) {
		return NewChatTemplate(string(b), specialTokensBeside(path))
	}
	return ParseChatTemplateConfig(b)
}

// specialTokensBeside reads the special tokens of the tokenizer_config.json
// in path's directory (none when it has none).
func specialTokensBeside(path string) map[string]string {
	b, err := os.ReadFile(filepath.Join(filepath.Dir(path), "tokenizer_config.json"))
	if err != nil {
		return nil
	}
	var raw map[string]json.RawMessage
	if json.Unmarshal(b, &raw) != nil {
		return nil
	}
	return specialTokens(raw)
}

// specialTokens picks the special-token variables out of a
// tokenizer_config.json.
func specialTokens(raw map[string]json.RawMessage) map[string]string {
	vars := map[string]string{}
	for _, k := range specialTokenKeys {
		if v, ok := raw[k]; ok {
			if s, ok := tokenContent(v); ok {
				vars[k] = s
			}
		}
	}
	return vars
}

// ParseChatTemplateConfig parses the bytes of a tokenizer_config.json. A
// chat_template given as a list of named templates uses the one named "default".
func ParseChatTemplateConfig(data []byte) (*ChatTemplate, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return nil, fmt.Errorf("parse tokenizer_config: %w: %v", ErrInvalid, err)
	}
	src, err := templateSource(raw["chat_template"])
	if err != nil {
		return nil, err
	}
	return NewChatTemplate(src, specialTokens(raw))
}

func templateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", errNoChatTemplate
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return "", fmt.Errorf("parse chat_template: %w: %v", ErrInvalid, err)
	}
	for _, n := range named {
		if n.Name == "default" {
			return n.Template, nil
		}
	}
	return "", fmt.Errorf("parse chat_template: %w: no template named default", ErrInvalid)
}

// tokenContent accepts "tok" or {"content": "tok", ...}.
func tokenContent(raw json.RawMessage) (string, bool) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var obj struct {
		Content *string `json:"content"`
	}
	if json.Unmarshal(raw, &obj) == nil && obj.Content != nil {
		return *obj.Content, true
	}
	return "", false
}

// NewChatTemplate compiles template source; specialTokens supplies variables
// such as bos_token and eos_token.
func NewChatTemplate(src string, specialTokens map[string]string) (*ChatTemplate, error) {
	t, err := chattmpl.Parse(src)
	if err != nil {
		return nil, fmt.Errorf("parse chat_template: %w", err)
	}
	vars := map[string]any{}
	for k, v := range specialTokens {
		vars[k] = v
	}
	return &ChatTemplate{tmpl: t, vars: vars, openaiFormat: t.IteratesContent()}, nil
}

// Render renders messages; addGenerationPrompt appends the assistant header.
func (c *ChatTemplate) Render(messages []Message, addGenerationPrompt bool) (string, error) {
	msgs := make([]any, len(messages))
	for i, m := range messages {
		d := chattmpl.NewDict()
		d.Set("role", m.Role)
		d.Set("content", m.Content)
		msgs[i] = d
	}
	return c.RenderValues(msgs, addGenerationPrompt, nil)
}

// RenderJSON renders messages given as a JSON array (any fields: tool calls,
// content parts), keeping key order; extra adds variables such as tools.
func (c *ChatTemplate) RenderJSON(messagesJSON []byte, addGenerationPrompt bool, extra map[string]any) (string, error) {
	v, err := chattmpl.FromJSON(messagesJSON)
	if err != nil {
		return "", fmt.Errorf("render chat: %w: %v", ErrInvalid, err)
	}
	msgs, ok := v.([]any)
	if !ok {
		return "", fmt.Errorf("render chat: %w: messages must be a JSON array", ErrInvalid)
	}
	return c.RenderValues(msgs, addGenerationPrompt, extra)
}

// RenderValues renders template values (see chattmpl.FromJSON).
func (c *ChatTemplate) RenderValues(messages []any, addGenerationPrompt bool, extra map[string]any) (string, error) {
	vars := make(map[string]any, len(c.vars)+len(extra)+2)
	maps.Copy(vars, c.vars)
	maps.Copy(vars, extra)
	vars["messages"] = messages
	vars["add_generation_prompt"] = addGenerationPrompt
	s, err := c.tmpl.Render(vars)
	if err != nil {
		return "", fmt.Errorf("render chat: %w", err)
	}
	return s, nil
}
