package tokenizer

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
	"github.com/kvmesh/kvmesh/internal/tokenizer/hfjinja"
)

var updateGolden = flag.Bool("update", false, "rewrite testdata/tokenizer/chat_request_golden.json from @huggingface/jinja")

const (
	requestGoldenPath = "../../testdata/tokenizer/chat_request_golden.json"
	templatesDir      = "../../testdata/tokenizer/templates/"
)

// requestCase is one chat request and what vLLM hands the template for it
// (VLLMVars, written by hand from vllm/entrypoints/chat_utils: the content
// format, tool-call argument parsing, tool model_dump with null defaults,
// chat_template_kwargs as variables).
type requestCase struct {
	Name     string          `json:"name"`
	Template string          `json:"template"` // file in testdata/tokenizer/templates
	Request  json.RawMessage `json:"request"`  // messages, tools, chat_template_kwargs, ...
	VLLMVars json.RawMessage `json:"vllm_vars"`
	Prompt   string          `json:"prompt"` // @huggingface/jinja's rendering of VLLMVars
	// MediaPlaceholder is what the template renders for the request's first
	// media item; RenderPrompt's Prefix must end right before it.
	MediaPlaceholder string `json:"media_placeholder,omitempty"`
}

type requestGolden struct {
	Source string        `json:"source"`
	BOS    string        `json:"bos_token"`
	EOS    string        `json:"eos_token"`
	Cases  []requestCase `json:"cases"`
}

func loadRequestGolden(t *testing.T) requestGolden {
	t.Helper()
	b, err := os.ReadFile(requestGoldenPath)
	if err != nil {
		t.Fatal(err)
	}
	var g requestGolden
	if err := json.Unmarshal(b, &g); err != nil {
		t.Fatal(err)
	}
	if len(g.Cases) < 3 {
		t.Fatalf("%d golden cases, want at least 3 templates", len(g.Cases))
	}
	return g
}

func chatRequestFrom(t *testing.T, raw json.RawMessage) *ChatRequest {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		t.Fatal(err)
	}
	req := &ChatRequest{Messages: m["messages"], Tools: m["tools"], Documents: m["documents"], Kwargs: m["chat_template_kwargs"],
		AddGenerationPrompt: true}
	if v, ok := m["add_generation_prompt"]; ok {
		req.AddGenerationPrompt = string(v) == "true"
	}
	req.ContinueFinalMessage = string(m["continue_final_message"]) == "true"
	return req
}

// TestChatRequestGolden: RenderRequest on the raw request equals the
// reference rendering of what vLLM passes the template.
func TestChatRequestGolden(t *testing.T) {
	g := loadRequestGolden(t)
	for _, c := range g.Cases {
		src, err := os.ReadFile(templatesDir + c.Template)
		if err != nil {
			t.Fatal(err)
		}
		ct, err := NewChatTemplate(string(src), map[string]string{"bos_token": g.BOS, "eos_token": g.EOS})
		if err != nil {
			t.Fatal(err)
		}
		got, err := ct.RenderRequest(chatRequestFrom(t, c.Request))
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		if got != c.Prompt {
			t.Errorf("%s:\n got %q\nwant %q", c.Name, got, c.Prompt)
		}
		p, err := ct.RenderPrompt(chatRequestFrom(t, c.Request))
		if err != nil || p.Text != got {
			t.Fatalf("%s: RenderPrompt %q, %v; RenderRequest gave %q", c.Name, p.Text, err, got)
		}
		if c.MediaPlaceholder == "" {
			if p.Prefix != len(got) || len(p.Media) != 0 {
				t.Errorf("%s: no media, but prefix %d of %d and %d media", c.Name, p.Prefix, len(got), len(p.Media))
			}
			continue
		}
		if !strings.HasPrefix(got[p.Prefix:], c.MediaPlaceholder) || strings.Contains(got[:p.Prefix], c.MediaPlaceholder) {
			t.Errorf("%s: prefix ends at %d, not right before the first %q: %q | %q", c.Name, p.Prefix, c.MediaPlaceholder,
				got[:p.Prefix], got[p.Prefix:min(len(got), p.Prefix+40)])
		}
	}
}

// TestChatRequestGoldenReference re-renders each case's vLLM variables with
// @huggingface/jinja: the golden prompts are the reference's (with -update,
// they are rewritten from it).
func TestChatRequestGoldenReference(t *testing.T) {
	g := loadRequestGolden(t)
	jobs := make([]hfjinja.Job, len(g.Cases))
	for i, c := range g.Cases {
		src, err := os.ReadFile(templatesDir + c.Template)
		if err != nil {
			t.Fatal(err)
		}
		vars := bytes.TrimPrefix(bytes.TrimSpace(c.VLLMVars), []byte("{"))
		tokens, _ := json.Marshal(map[string]string{"bos_token": g.BOS, "eos_token": g.EOS})
		jobs[i] = hfjinja.Job{Template: string(src), Vars: json.RawMessage(string(tokens[:len(tokens)-1]) + "," + string(vars))}
	}
	res := hfjinja.Render(t, jobs)
	for i := range g.Cases {
		if res[i].Err != "" {
			t.Fatalf("%s: @huggingface/jinja: %s", g.Cases[i].Name, res[i].Err)
		}
		if *updateGolden {
			g.Cases[i].Prompt = res[i].Out
		} else if res[i].Out != g.Cases[i].Prompt {
			t.Errorf("%s: golden prompt is not @huggingface/jinja's:\n ref %q\ngold %q", g.Cases[i].Name, res[i].Out, g.Cases[i].Prompt)
		}
	}
	if *updateGolden {
		b, err := json.MarshalIndent(g, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(requestGoldenPath, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRenderRequestErrors: what vLLM refuses is refused, with the right kind.
func TestRenderRequestErrors(t *testing.T) {
	ct, err := NewChatTemplate(`{% for m in messages %}{{ m.content }}{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		req  ChatRequest
		want error
		msg  string
	}{
		{ChatRequest{Messages: []byte(`[{"role":"user","content":[{"type":"file","file":{"file_id":"f"}}]}]`)}, ErrUnsupportedContent, "file"},
		{ChatRequest{Messages: []byte(`[{"role":"user","content":[{"uuid":"u"}]}]`)}, ErrUnsupportedContent, "no type"},
		{ChatRequest{Messages: []byte(`[{"role":"user","content":[{"type":"bogus"}]}]`)}, ErrUnsupportedContent, "bogus"},
		{ChatRequest{Messages: []byte(`[{"content":"x"}]`)}, ErrInvalid, "role"},
		{ChatRequest{Messages: []byte(`[]`)}, ErrInvalid, "non-empty"},
		{ChatRequest{Messages: []byte(`[{"role":"user","content":1}]`)}, ErrInvalid, "content"},
		{ChatRequest{Messages: []byte(`[{"role":"user","content":"x"}]`), Kwargs: []byte(`{"messages":[]}`)}, ErrInvalid, "messages"},
		{ChatRequest{Messages: []byte(`[{"role":"user","content":"x"}]`), Tools: []byte(`[{"type":"function"}]`)}, ErrInvalid, "tools[0]"},
		{ChatRequest{Messages: []byte(`[{"role":"assistant","content":"x"}]`), AddGenerationPrompt: true, ContinueFinalMessage: true}, ErrInvalid, "both"},
	} {
		_, err := ct.RenderRequest(&c.req)
		if !errors.Is(err, c.want) || !strings.Contains(err.Error(), c.msg) {
			t.Errorf("%s: got %v, want %v mentioning %q", c.req.Messages, err, c.want, c.msg)
		}
	}
}

// TestContinueFinalMessage: the rendering stops after the final message's
// text, as transformers' continue_final_message does.
func TestContinueFinalMessage(t *testing.T) {
	ct, err := NewChatTemplate(`{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</s>{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	got, err := ct.RenderRequest(&ChatRequest{Messages: []byte(`[{"role":"user","content":"Q"},{"role":"assistant","content":"The answer is "}]`),
		ContinueFinalMessage: true})
	if err != nil || got != "<user>Q</s><assistant>The answer is" {
		t.Fatalf("got %q, %v", got, err)
	}
}

// FuzzRenderRequest: any request members render or fail with a classified
// error (bad input, unsupported content, or the template's own error), never
// a panic, with a string-format and an openai-format template.
func FuzzRenderRequest(f *testing.F) {
	g := requestGolden{}
	if b, err := os.ReadFile(requestGoldenPath); err == nil {
		_ = json.Unmarshal(b, &g)
	}
	for _, c := range g.Cases {
		var m map[string]json.RawMessage
		_ = json.Unmarshal(c.Request, &m)
		f.Add([]byte(m["messages"]), []byte(m["tools"]), []byte(m["chat_template_kwargs"]), true)
	}
	f.Add([]byte(`[{"role":"assistant","tool_calls":[{"function":{"name":"f","arguments":"[1]"}}]}]`), []byte(`null`), []byte(`{"x":1}`), false)
	f.Add([]byte(`[{"role":"user","content":[{"type":"text"},"raw",{"type":"refusal","refusal":"no"}]}]`), []byte(`[{"function":{"name":"n","strict":true},"x":1}]`), []byte(nil), true)
	var tpls []*ChatTemplate
	for _, name := range []string{"qwen2.5-instruct.jinja", "vllm-llama3.1_json.jinja", "ardan-Qwen3-VL-30B-A3B-Instruct-Q8_0.jinja"} {
		src, err := os.ReadFile(templatesDir + name)
		if err != nil {
			f.Fatal(err)
		}
		ct, err := NewChatTemplate(string(src), map[string]string{"bos_token": "<s>"})
		if err != nil {
			f.Fatal(err)
		}
		tpls = append(tpls, ct)
	}
	f.Fuzz(func(t *testing.T, msgs, tools, kwargs []byte, gen bool) {
		for _, ct := range tpls {
			req := &ChatRequest{Messages: msgs, Tools: tools, Kwargs: kwargs, AddGenerationPrompt: gen, ContinueFinalMessage: !gen}
			s, err := ct.RenderRequest(req)
			if err != nil && !errors.Is(err, ErrInvalid) && !errors.Is(err, ErrUnsupportedContent) &&
				!errors.Is(err, chattmpl.ErrRender) && !errors.Is(err, chattmpl.ErrRaised) {
				t.Fatalf("unclassified error: %v", err)
			}
			p, perr := ct.RenderPrompt(req)
			if (perr == nil) != (err == nil) || p.Text != s || p.Prefix < 0 || p.Prefix > len(p.Text) ||
				(len(p.Media) == 0 && p.Prefix != len(p.Text)) {
				t.Fatalf("RenderPrompt %+v, %v; RenderRequest %q, %v", p, perr, s, err)
			}
		}
	})
}

// TestRenderPromptMedia: Prefix ends where the first media item sits, for
// a "string"-format template (vLLM puts the placeholders before the
// message's text), a template that renders a message's images before its
// text, and the keys tell items apart by data or uuid.
func TestRenderPromptMedia(t *testing.T) {
	img := func(url, uuid string) string {
		s := `{"type":"image_url","image_url":{"url":"` + url + `"}`
		if uuid != "" {
			s += `,"uuid":"` + uuid + `"`
		}
		return s + `}`
	}
	msgs := func(parts ...string) []byte {
		return []byte(`[{"role":"system","content":"S"},{"role":"user","content":"first"},{"role":"user","content":[` + strings.Join(parts, ",") + `]}]`)
	}
	stringFmt, err := NewChatTemplate(`{% for m in messages %}<{{ m.role }}>{{ m.content }}</s>{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	imagesFirst, err := NewChatTemplate(`{% for m in messages %}<{{ m.role }}>{% if m.content is string %}{{ m.content }}{% else %}`+
		`{% for c in m.content | selectattr('type', 'equalto', 'image') %}<|image|>{% endfor %}`+
		`{% for c in m.content | selectattr('type', 'equalto', 'text') %}{{ c.text }}{% endfor %}{% endif %}</s>{% endfor %}`, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name       string
		ct         *ChatTemplate
		msgs       []byte
		text, pref string
	}{
		{"string format", stringFmt, msgs(`{"type":"text","text":"look"}`, img("http://x/a.png", "")),
			"<system>S</s><user>first</s><user>look</s>", "<system>S</s><user>first</s><user>"},
		{"images first", imagesFirst, msgs(`{"type":"text","text":"look"}`, img("http://x/a.png", "")),
			"<system>S</s><user>first</s><user><|image|>look</s>", "<system>S</s><user>first</s><user>"},
		{"no media", imagesFirst, msgs(`{"type":"text","text":"look"}`),
			"<system>S</s><user>first</s><user>look</s>", "<system>S</s><user>first</s><user>look</s>"},
	} {
		p, err := c.ct.RenderPrompt(&ChatRequest{Messages: c.msgs})
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if p.Text != c.text || p.Text[:p.Prefix] != c.pref {
			t.Errorf("%s: text %q prefix %q, want %q and %q", c.name, p.Text, p.Text[:p.Prefix], c.text, c.pref)
		}
	}
	key := func(parts ...string) []Media {
		p, err := imagesFirst.RenderPrompt(&ChatRequest{Messages: msgs(parts...)})
		if err != nil {
			t.Fatal(err)
		}
		return p.Media
	}
	a, b := key(img("http://x/a.png", "")), key(img("http://x/b.png", ""))
	if len(a) != 1 || a[0].Modality != "image" || a[0].Key == b[0].Key {
		t.Errorf("two images: %v and %v", a, b)
	}
	if u1, u2 := key(img("http://x/a.png", "u")), key(img("http://x/b.png", "u")); u1[0].Key != u2[0].Key || u1[0].Key == a[0].Key {
		t.Errorf("the same uuid keys the same item whatever its data: %v %v (url only %v)", u1, u2, a)
	}
	if m := key(`{"type":"input_audio","input_audio":{"data":"AAA","format":"wav"}}`, `{"video_url":{"url":"v"}}`); len(m) != 2 ||
		m[0].Modality != "audio" || m[1].Modality != "video" {
		t.Errorf("audio and an untyped video part: %v", m)
	}
}
