package tokenizer

import (
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
)

// namedConfig is a tokenizer_config.json with named templates, as Hermes
// 2 Pro / Hermes 3 and Command-R ship them. tool_use loops over content
// (vLLM's "openai" content format), default does not.
const namedConfig = `{"bos_token": "<s>", "chat_template": [
 {"name": "default", "template": "DEFAULT{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"},
 {"name": "tool_use", "template": "TOOLUSE{{ tools | length }}{% for m in messages %}[{{ m.role }}:{% for p in m.content %}{{ p.text }}{% endfor %}]{% endfor %}"},
 {"name": "rag", "template": "RAG{% for m in messages %}[{{ m.role }}:{{ m.content }}]{% endfor %}"}]}`

// TestNamedChatTemplates: with named templates, a request renders with the
// one transformers' get_chat_template picks (vLLM hands it the request's
// tools, None when it has none): "tool_use" when there are tools (an empty
// list too) and the model has one, else "default"; the content format
// follows the template used. It holds for a tokenizer_config.json read
// directly, through LoadChatTemplateFile and through a model directory.
func TestNamedChatTemplates(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "tokenizer_config.json")
	if err := os.WriteFile(cfg, []byte(namedConfig), 0o644); err != nil {
		t.Fatal(err)
	}
	parsed, err := ParseChatTemplateConfig([]byte(namedConfig))
	if err != nil {
		t.Fatal(err)
	}
	file, err := LoadChatTemplateFile(cfg)
	if err != nil {
		t.Fatal(err)
	}
	fromDir, err := LoadChatTemplateDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	const msgs = `[{"role":"user","content":"hi"}]`
	tool := `[{"type":"function","function":{"name":"f","parameters":{}}}]`
	for name, ct := range map[string]*ChatTemplate{"config": parsed, "file": file, "dir": fromDir} {
		for _, c := range []struct {
			tools, docs, want string
		}{
			{"", "", "DEFAULT[user:hi]"},
			{"null", "", "DEFAULT[user:hi]"},
			{tool, "", "TOOLUSE1[user:hi]"},
			{"[]", "", "TOOLUSE0[user:hi]"},
			{"", `[{"title":"t","text":"x"}]`, "DEFAULT[user:hi]"}, // documents alone do not pick rag
		} {
			got, err := ct.RenderRequest(&ChatRequest{Messages: []byte(msgs), Tools: []byte(c.tools), Documents: []byte(c.docs)})
			if err != nil || got != c.want {
				t.Errorf("%s: tools %s docs %s: got %q, %v; want %q", name, c.tools, c.docs, got, err, c.want)
			}
		}
		if got, err := ct.Render([]Message{{Role: "user", Content: "hi"}}, false); err != nil || got != "DEFAULT[user:hi]" {
			t.Errorf("%s: Render: %q, %v", name, got, err)
		}
		tv, err := chattmpl.FromJSON([]byte(tool))
		if err != nil {
			t.Fatal(err)
		}
		if got, err := ct.RenderJSON([]byte(`[{"role":"user","content":[{"type":"text","text":"hi"}]}]`), false, map[string]any{"tools": tv}); err != nil || got != "TOOLUSE1[user:hi]" {
			t.Errorf("%s: RenderJSON with tools: %q, %v", name, got, err)
		}
	}
}

// TestNamedChatTemplateSelection covers the other shapes of a named list:
// no tool_use (tools render with default), no default (only requests with
// tools render; the others are left to the engine), a name given twice
// (the last wins, as in transformers' dict), and a tool_use this
// interpreter cannot parse (default still works).
func TestNamedChatTemplateSelection(t *testing.T) {
	load := func(list string) *ChatTemplate {
		t.Helper()
		ct, err := ParseChatTemplateConfig([]byte(`{"chat_template": ` + list + `}`))
		if err != nil {
			t.Fatal(err)
		}
		return ct
	}
	render := func(ct *ChatTemplate, tools string) (string, error) {
		return ct.RenderRequest(&ChatRequest{Messages: []byte(`[{"role":"user","content":"hi"}]`), Tools: []byte(tools)})
	}
	noToolUse := load(`[{"name": "default", "template": "D"}, {"name": "rag", "template": "R"}]`)
	if got, err := render(noToolUse, `[]`); err != nil || got != "D" {
		t.Errorf("no tool_use, with tools: %q, %v; want D", got, err)
	}
	onlyToolUse := load(`[{"name": "tool_use", "template": "T"}]`)
	if got, err := render(onlyToolUse, `[]`); err != nil || got != "T" {
		t.Errorf("only tool_use, with tools: %q, %v; want T", got, err)
	}
	if _, err := render(onlyToolUse, ""); !errors.Is(err, chattmpl.ErrRender) {
		t.Errorf("only tool_use, no tools: %v; want ErrRender (transformers has no template to use)", err)
	}
	twice := load(`[{"name": "default", "template": "first"}, {"name": "default", "template": "second"}]`)
	if got, err := render(twice, ""); err != nil || got != "second" {
		t.Errorf("default given twice: %q, %v; want second", got, err)
	}
	badToolUse := load(`[{"name": "default", "template": "D"}, {"name": "tool_use", "template": "{% bogus %}"}]`)
	if got, err := render(badToolUse, ""); err != nil || got != "D" {
		t.Errorf("unparsable tool_use, no tools: %q, %v; want D", got, err)
	}
	if _, err := render(badToolUse, "[]"); !errors.Is(err, chattmpl.ErrRender) || !errors.Is(err, chattmpl.ErrSyntax) {
		t.Errorf("unparsable tool_use, with tools: %v; want ErrRender wrapping ErrSyntax", err)
	}
	for _, list := range []string{`[]`, `[{"name": "rag", "template": "R"}]`} {
		if _, err := ParseChatTemplateConfig([]byte(`{"chat_template": ` + list + `}`)); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: %v; want ErrInvalid", list, err)
		}
	}
	if _, err := ParseChatTemplateConfig([]byte(`{"chat_template": [{"name": "default", "template": "{% bogus %}"}]}`)); !errors.Is(err, chattmpl.ErrSyntax) {
		t.Errorf("unparsable default: %v; want ErrSyntax", err)
	}
}

// TestContinueFinalMessageWhitespace follows transformers' cut exactly: it
// keeps the final message's trailing whitespace only when the rendering has
// the message, as written, at the last occurrence of its stripped text; a
// message with leading whitespace never does (the comparison is with the
// unstripped message).
func TestContinueFinalMessageWhitespace(t *testing.T) {
	src, err := os.ReadFile(templatesDir + "qwen2.5-instruct.jinja")
	if err != nil {
		t.Fatal(err)
	}
	qwen, err := NewChatTemplate(string(src), nil)
	if err != nil {
		t.Fatal(err)
	}
	trims, err := NewChatTemplate(`{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	const head = "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n"
	for _, c := range []struct {
		ct        *ChatTemplate
		content   string
		wantAfter string // what follows head (qwen) or "<user>Q</s>" (trims)
	}{
		{qwen, `\nSure: `, "\nSure:"},              // leading and trailing whitespace: the trailing goes
		{qwen, `Sure: `, "Sure: "},                 // kept as written
		{qwen, `\n\tSure:`, "\n\tSure:"},           // nothing trailing to lose
		{qwen, `Sure:\u001c`, "Sure:\u001c"},       // kept as written
		{qwen, `\u001cSure:\u001c`, "\u001cSure:"}, // Python strips \x1c as whitespace
		{trims, `The answer is `, "<assistant>The answer is"},
		{trims, ` The answer`, "<assistant>The answer"},
	} {
		got, err := c.ct.RenderRequest(&ChatRequest{
			Messages:             []byte(`[{"role":"user","content":"Q"},{"role":"assistant","content":"` + c.content + `"}]`),
			ContinueFinalMessage: true})
		want := head + c.wantAfter
		if c.ct == trims {
			want = "<user>Q</s>" + c.wantAfter
		}
		if err != nil || got != want {
			t.Errorf("%q: got %q, %v\nwant %q", c.content, got, err, want)
		}
	}
}
