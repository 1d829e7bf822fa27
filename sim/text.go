package sim

import (
	"strings"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// byteTokenizer is the fallback when no tokenizer.json is given: every UTF-8
// byte of the text is one token whose id is the byte's value (0–255), and
// generated filler ids (engine.FillerBase…) decode to words from fillerWords.
// It is deterministic and trivial to reproduce on the router side.
type byteTokenizer struct{}

var _ Tokenizer = byteTokenizer{}

func (byteTokenizer) AppendEncode(dst []uint32, text string, _ bool) []uint32 {
	for i := 0; i < len(text); i++ {
		dst = append(dst, uint32(text[i]))
	}
	return dst
}

func (byteTokenizer) Decode(ids []uint32, _ bool) string {
	var b strings.Builder
	for _, id := range ids {
		switch {
		case id < 256:
			b.WriteByte(byte(id))
		case id >= engine.FillerBase && id < engine.FillerBase+engine.FillerVocab:
			b.WriteString(fillerWords[int(id-engine.FillerBase)%len(fillerWords)])
		}
	}
	return b.String()
}

// fillerWords make generated text readable in demos.
var fillerWords = strings.Fields(`lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod
tempor incididunt ut labore et dolore magna aliqua enim ad minim veniam quis nostrud exercitation
ullamco laboris nisi aliquip ex ea commodo consequat duis aute irure in reprehenderit voluptate velit
esse cillum fugiat nulla pariatur excepteur sint occaecat cupidatat non proident sunt culpa qui officia
deserunt mollit anim id est laborum`)

func init() {
	for i, w := range fillerWords {
		fillerWords[i] = " " + w
	}
}

// llama3Chat is the built-in chat template: Llama 3's markup, rendered as
// vLLM renders it (add_generation_prompt adds the assistant header). The
// prompt is then tokenized without special tokens (vLLM's chat default), so
// <|begin_of_text|> comes from the template.
type llama3Chat struct{}

var _ ChatRenderer = llama3Chat{}

func (llama3Chat) RenderChat(msgs []openai.ChatMessage, addGenerationPrompt bool) (string, error) {
	var b strings.Builder
	b.WriteString("<|begin_of_text|>")
	for _, m := range msgs {
		b.WriteString("<|start_header_id|>")
		b.WriteString(m.Role)
		b.WriteString("<|end_header_id|>\n\n")
		b.WriteString(strings.TrimSpace(m.Content.Text))
		b.WriteString("<|eot_id|>")
	}
	if addGenerationPrompt {
		b.WriteString("<|start_header_id|>assistant<|end_header_id|>\n\n")
	}
	return b.String(), nil
}

// TemplateChat renders chats with a model's own chat template (from its
// tokenizer_config.json), as the ingress does, so both see the same tokens.
// List-form contents are rendered as their concatenated text parts.
type TemplateChat struct{ T *tokenizer.ChatTemplate }

var _ ChatRenderer = TemplateChat{}

// RenderChatRequest renders the whole request (tool calls, content parts,
// tools, documents, chat_template_kwargs) the way vLLM does; the ingress
// renders with the same code, so both compute the same block keys.
func (c TemplateChat) RenderChatRequest(req *openai.ChatRequest) (tokenizer.Prompt, error) {
	return c.T.RenderPrompt(&tokenizer.ChatRequest{Messages: req.RawMessages, Tools: req.Tools, Documents: req.Documents,
		Kwargs: req.ChatTemplateKwargs, AddGenerationPrompt: req.AddGenerationPrompt == nil || *req.AddGenerationPrompt,
		ContinueFinalMessage: req.ContinueFinalMessage})
}

// requestRenderer is the optional capability of a ChatRenderer to render a
// whole chat request rather than flattened messages.
type requestRenderer interface {
	RenderChatRequest(req *openai.ChatRequest) (tokenizer.Prompt, error)
}

// chatTokens renders req's chat and tokenizes it (addSpecial: add the
// tokenizer's special tokens, which vLLM does not for chat). The media
// items are MediaTokens tokens each, placed together where the first one
// sits and drawn from their keys: the engine expands an item into its
// encoder's tokens and mixes its hash into the keys of the blocks from
// there on, so the same image hits the cache and another one misses. With
// only the flat renderer, content parts count as their text.
func (s *Server) chatTokens(req *openai.ChatRequest, addSpecial bool) ([]uint32, error) {
	rr, ok := s.chat.(requestRenderer)
	if !ok {
		text, err := s.chat.RenderChat(req.Messages, req.AddGenerationPrompt == nil || *req.AddGenerationPrompt)
		if err != nil {
			return nil, err
		}
		return s.tok.AppendEncode(nil, text, addSpecial), nil
	}
	p, err := rr.RenderChatRequest(req)
	if err != nil {
		return nil, err
	}
	if len(p.Media) == 0 {
		return s.tok.AppendEncode(nil, p.Text, addSpecial), nil
	}
	ids := s.tok.AppendEncode(nil, p.Text[:p.Prefix], addSpecial)
	for _, m := range p.Media {
		x := m.Key
		for range s.cfg.MediaTokens {
			x += 0x9e3779b97f4a7c15 // splitmix64: ids spread over the low vocabulary
			z := (x ^ x>>30) * 0xbf58476d1ce4e5b9
			z = (z ^ z>>27) * 0x94d049bb133111eb
			ids = append(ids, uint32((z^z>>31)%mediaVocab))
		}
	}
	return s.tok.AppendEncode(ids, p.Text[p.Prefix:], false), nil
}

// mediaVocab bounds the ids standing for media tokens: ids every
// tokenizer the simulator loads knows (the byte fallback's 256 included
// would repeat too often; real vocabularies start at 32k).
const mediaVocab = 32000

// RenderChat implements ChatRenderer.
func (c TemplateChat) RenderChat(msgs []openai.ChatMessage, addGenerationPrompt bool) (string, error) {
	m := make([]tokenizer.Message, len(msgs))
	for i, x := range msgs {
		m[i] = tokenizer.Message{Role: x.Role, Content: x.Content.Text}
	}
	return c.T.Render(m, addGenerationPrompt)
}
