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
// A tokenizer_config.json may name several templates (Hermes, Command-R:
// "default", "tool_use", "rag"); a request then renders with the one
// transformers' get_chat_template picks: "tool_use" when the request has
// tools (a tools list, even an empty one) and the model has it, else
// "default".
//
// Concurrency: immutable after construction; Render may be called concurrently.
type ChatTemplate struct {
	def     *chatVariant // the template, or the one named "default" (nil: none)
	toolUse *chatVariant // the one named "tool_use" (nil: none)
	vars    map[string]any
}

// chatVariant is one compiled template.
type chatVariant struct {
	name string // "" for a single template
	tmpl *chattmpl.Template
	// openaiFormat: the template loops over message content, so vLLM hands it
	// content as a list of parts (its "openai" content format).
	openaiFormat bool
	err          error // a named template that did not parse
}

// variant is the template a request renders with (get_chat_template).
func (c *ChatTemplate) variant(hasTools bool) (*chatVariant, error) {
	v := c.def
	if hasTools && c.toolUse != nil {
		v = c.toolUse
	}
	if v == nil {
		// transformers raises here and vLLM answers with its own error:
		// leave the request to the engine.
		return nil, fmt.Errorf("render chat: %w: the model's named chat templates have no \"default\" (and no \"tool_use\" for a request with tools)", chattmpl.ErrRender)
	}
	if v.err != nil {
		return nil, fmt.Errorf("render chat: %w: chat template %q: %w", chattmpl.ErrRender, v.name, v.err)
	}
	return v, nil
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
// chat_template given as a list of named templates keeps "default" and
// "tool_use" (see ChatTemplate).
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

// namedTemplatesPrefix starts what templateSource returns for a list of
// named templates: the list as JSON follows it. It carries the list through
// callers that pass a template source on to NewChatTemplate (dir.go's
// LoadChatTemplateDir); no Jinja template starts with a NUL byte.
const namedTemplatesPrefix = "\x00kvmesh:named-chat-templates\x00"

// templateSource is a chat_template value as NewChatTemplate takes it: the
// template itself, or a list of named templates (encoded after
// namedTemplatesPrefix).
func templateSource(raw json.RawMessage) (string, error) {
	if isNull(raw) {
		return "", errNoChatTemplate
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return s, nil
	}
	named, err := namedTemplates(raw)
	if err != nil {
		return "", err
	}
	if named["default"] == nil && named["tool_use"] == nil {
		return "", fmt.Errorf("parse chat_template: %w: no template named default", ErrInvalid)
	}
	b, err := json.Marshal(raw)
	if err != nil {
		return "", fmt.Errorf("parse chat_template: %w: %v", ErrInvalid, err)
	}
	return namedTemplatesPrefix + string(b), nil
}

// namedTemplates reads a list of {"name", "template"} as transformers does
// (a later entry replaces an earlier one of the same name).
func namedTemplates(raw json.RawMessage) (map[string]*string, error) {
	var named []struct {
		Name     string `json:"name"`
		Template string `json:"template"`
	}
	if err := json.Unmarshal(raw, &named); err != nil {
		return nil, fmt.Errorf("parse chat_template: %w: %v", ErrInvalid, err)
	}
	out := map[string]*string{}
	for _, n := range named {
		out[n.Name] = &n.Template
	}
	return out, nil
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

// NewChatTemplate compiles template source (or what templateSource makes of
// a list of named templates); specialTokens supplies variables such as
// bos_token and eos_token. A named template other than the default that
// does not parse fails only the requests that would render with it.
func NewChatTemplate(src string, specialTokens map[string]string) (*ChatTemplate, error) {
	vars := map[string]any{}
	for k, v := range specialTokens {
		vars[k] = v
	}
	ct := &ChatTemplate{vars: vars}
	list, isNamed := strings.CutPrefix(src, namedTemplatesPrefix)
	if !isNamed {
		v, err := compileVariant("", src)
		if err != nil {
			return nil, err
		}
		ct.def = v
		return ct, nil
	}
	named, err := namedTemplates(json.RawMessage(list))
	if err != nil {
		return nil, err
	}
	if tsrc := named["default"]; tsrc != nil {
		if ct.def, err = compileVariant("default", *tsrc); err != nil {
			return nil, err
		}
	}
	if tsrc := named["tool_use"]; tsrc != nil {
		ct.toolUse, err = compileVariant("tool_use", *tsrc)
		if err != nil && ct.def == nil {
			return nil, err
		}
		if err != nil {
			ct.toolUse = &chatVariant{name: "tool_use", err: err}
		}
	}
	if ct.def == nil && ct.toolUse == nil {
		return nil, fmt.Errorf("parse chat_template: %w: no template named default", ErrInvalid)
	}
	return ct, nil
}

func compileVariant(name, src string) (*chatVariant, error) {
	t, err := chattmpl.Parse(src)
	if err != nil {
		if name != "" {
			return nil, fmt.Errorf("parse chat_template %q: %w", name, err)
		}
		return nil, fmt.Errorf("parse chat_template: %w", err)
	}
	return &chatVariant{name: name, tmpl: t, openaiFormat: t.IteratesContent()}, nil
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

// RenderValues renders template values (see chattmpl.FromJSON); extra
// holding a non-nil "tools" selects a "tool_use" template.
func (c *ChatTemplate) RenderValues(messages []any, addGenerationPrompt bool, extra map[string]any) (string, error) {
	v, err := c.variant(extra["tools"] != nil)
	if err != nil {
		return "", err
	}
	vars := make(map[string]any, len(c.vars)+len(extra)+2)
	maps.Copy(vars, c.vars)
	maps.Copy(vars, extra)
	vars["messages"] = messages
	vars["add_generation_prompt"] = addGenerationPrompt
	s, err := v.tmpl.Render(vars)
	if err != nil {
		return "", fmt.Errorf("render chat: %w", err)
	}
	return s, nil
}
