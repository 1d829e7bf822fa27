package ingress

import (
	"errors"
	"fmt"
	"log/slog"
	"os"
	"unsafe"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/ingress/session"
	"github.com/kvmesh/kvmesh/internal/tokenizer"
	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
	"github.com/kvmesh/kvmesh/kvevents"
)

// ErrNoChatTemplate means a model's tokenizer has no chat template: chat
// requests for it are keyed on an engine's /tokenize (enginetok.go) or
// routed on load only, and forwarded as chat.
var ErrNoChatTemplate = errors.New("no chat template")

// hfTokenizer adapts internal/tokenizer (with its per-prefix cache) to Tokenizer.
type hfTokenizer struct {
	enc *tokenizer.CachingTokenizer
	// tpl is the model's chat template; nil when it has none.
	tpl *tokenizer.ChatTemplate
	// vocab is the vocabulary size: token ids at or above it are refused.
	vocab int
}

var _ Tokenizer = (*hfTokenizer)(nil)

// Encode tokenizes a completions prompt the way vLLM does (special tokens added).
func (h *hfTokenizer) Encode(dst []uint32, text []byte) ([]uint32, error) {
	return h.EncodeBounded(dst, text, true, tokenizer.Bound{})
}

// EncodePlain tokenizes a completions prompt sent with add_special_tokens
// false: no special tokens added.
func (h *hfTokenizer) EncodePlain(dst []uint32, text []byte) ([]uint32, error) {
	return h.EncodeBounded(dst, text, false, tokenizer.Bound{})
}

// EncodeBounded is Encode (special) or EncodePlain within b.
func (h *hfTokenizer) EncodeBounded(dst []uint32, text []byte, special bool, b tokenizer.Bound) ([]uint32, error) {
	// The tokenizer only reads text during the call.
	return h.enc.AppendEncodeBounded(dst, unsafe.String(unsafe.SliceData(text), len(text)), special, b)
}

// RenderChat renders flattened messages (role and text only); the request
// path uses RenderChatRequest, which sees the whole request.
func (h *hfTokenizer) RenderChat(dst []uint32, msgs []Message) ([]uint32, error) {
	if h.tpl == nil {
		return dst, ErrNoChatTemplate
	}
	tm := make([]tokenizer.Message, len(msgs))
	for i, m := range msgs {
		tm[i] = tokenizer.Message{Role: m.Role, Content: m.Content}
	}
	s, err := h.tpl.Render(tm, true)
	if err != nil {
		return dst, fmt.Errorf("chat template: %w", err)
	}
	return h.enc.AppendEncode(dst, s, false), nil
}

// RenderChatRequest renders the whole chat request (messages with their
// tool calls and content parts, tools, documents, chat_template_kwargs, the
// generation-prompt switches) as vLLM does, and encodes it without adding
// special tokens, as vLLM does for chat. With media (images, audio, video)
// the ids stop at the first media item: the engine expands each item into
// tokens of its own and mixes the item's hash into the keys of every block
// from there on, so only the prefix before it can be keyed. n is the
// prompt's token count without the media's own tokens, media the number of
// media items.
func (h *hfTokenizer) RenderChatRequest(dst []uint32, req *tokenizer.ChatRequest) (ids []uint32, n, media int, err error) {
	return h.RenderChatRequestBounded(dst, req, tokenizer.Bound{})
}

// RenderChatRequestBounded is RenderChatRequest with the rendering and the
// encoding within b (one deadline for both).
func (h *hfTokenizer) RenderChatRequestBounded(dst []uint32, req *tokenizer.ChatRequest, b tokenizer.Bound) (ids []uint32, n, media int, err error) {
	if h.tpl == nil {
		return dst, 0, 0, ErrNoChatTemplate
	}
	p, err := h.tpl.RenderPromptBounded(req, b)
	if err != nil {
		return dst, 0, 0, fmt.Errorf("chat template: %w", err)
	}
	if len(p.Media) == 0 {
		if dst, err = h.enc.AppendEncodeBounded(dst, p.Text, false, b); err != nil {
			return dst, 0, 0, err
		}
		return dst, len(dst), 0, nil
	}
	all, err := h.enc.AppendEncodeBounded(dst, p.Text, false, b)
	if err != nil {
		return dst, 0, 0, err
	}
	n = len(all) - len(dst)
	return h.enc.AppendEncode(all[:len(dst)], p.Text[:p.Prefix], false), n, len(p.Media), nil
}

// VocabSize is the number of token ids the model knows.
func (h *hfTokenizer) VocabSize() int { return h.vocab }

// chatRequestRenderer is the optional capability of a Tokenizer to render a
// whole chat request (hfTokenizer.RenderChatRequest); tokenizers without it
// (test fakes) get the flattened messages through RenderChat.
type chatRequestRenderer interface {
	RenderChatRequestBounded(dst []uint32, req *tokenizer.ChatRequest, b tokenizer.Bound) (ids []uint32, n, media int, err error)
}

// boundedEncoder is the optional capability of a Tokenizer to stop
// encoding within a tokenizer.Bound (hfTokenizer.EncodeBounded).
type boundedEncoder interface {
	EncodeBounded(dst []uint32, text []byte, special bool, b tokenizer.Bound) ([]uint32, error)
}

// vocabSizer is the optional capability of a Tokenizer to say how many ids
// it knows, so token-id prompts beyond it are refused as vLLM refuses them.
type vocabSizer interface{ VocabSize() int }

// renderChat renders r's chat prompt with tok: the ids routing keys on,
// the prompt's token count and its media items (see
// hfTokenizer.RenderChatRequest). Content vLLM refuses (an unknown part
// type) and malformed chat members are 400s.
func renderChat(tok Tokenizer, dst []uint32, r *request, b tokenizer.Bound) (ids []uint32, n, media int, err error) {
	cr, ok := tok.(chatRequestRenderer)
	if !ok {
		ids, err = tok.RenderChat(dst, r.chatMessages())
		return ids, len(ids), 0, err
	}
	ids, n, media, err = cr.RenderChatRequestBounded(dst, &tokenizer.ChatRequest{Messages: r.messages, Tools: r.tools, Documents: r.documents,
		Kwargs: r.templateKwargs, AddGenerationPrompt: r.addGenPrompt, ContinueFinalMessage: r.continueFinal}, b)
	if errors.Is(err, tokenizer.ErrUnsupportedContent) {
		return ids, 0, 0, badRequest("messages", fmt.Errorf("%w: %w", ErrBadRequest, err))
	}
	return ids, n, media, err
}

// checkVocab refuses token ids the model's tokenizer does not know (vLLM:
// "Token id N is out of vocabulary"), in ids and in every element of a
// batch; without a tokenizer anything goes.
func checkVocab(tok Tokenizer, ids []uint32, batch [][]byte) error {
	vs, ok := tok.(vocabSizer)
	if !ok || vs.VocabSize() <= 0 {
		return nil
	}
	n := vs.VocabSize()
	check := func(ids []uint32, where string) error {
		for _, id := range ids {
			if int(id) >= n {
				return badRequest("prompt", fmt.Errorf("%w: %stoken id %d is out of vocabulary (the model has %d)", ErrBadRequest, where, id, n))
			}
		}
		return nil
	}
	if err := check(ids, ""); err != nil {
		return err
	}
	var scratch []uint32
	for i, e := range batch {
		var err error
		if scratch, err = appendTokenIDs(scratch[:0], e); err != nil {
			return nil // malformed elements are reported where the batch is counted
		}
		if err := check(scratch, fmt.Sprintf("prompt[%d]: ", i)); err != nil {
			return err
		}
	}
	return nil
}

// NewTokenizer wraps a loaded tokenizer (with a per-prefix cache) and the
// model's chat template (nil: none) as a Tokenizer.
func NewTokenizer(nt *tokenizer.Native, tpl *tokenizer.ChatTemplate) (Tokenizer, error) {
	ct, err := tokenizer.NewCachingTokenizer(nt, tokenizer.DefaultCacheConfig())
	if err != nil {
		return nil, fmt.Errorf("tokenizer cache: %w", err)
	}
	return &hfTokenizer{enc: ct, tpl: tpl, vocab: nt.VocabSize()}, nil
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
// nil). A path may be tokenizer.json itself or a directory holding it. A
// tokenizer.json with a component Native lacks (the Precompiled
// normalizer) does not stop the ingress: the model is served routed by
// load, unkeyed, with a warning, as for a template that does not parse
// here.
func LoadTokenizers(cfg *Config, deps *Deps) error {
	if deps.Tokenizers != nil || len(cfg.Tokenizers) == 0 {
		return nil
	}
	m := TokenizerMap{}
	for model, path := range cfg.Tokenizers {
		t, err := loadTokenizer(model, path, cfg.ChatTemplates[model], deps.Logger)
		if errors.Is(err, tokenizer.ErrUnsupported) {
			if deps.Logger != nil {
				deps.Logger.Warn("tokenizer not supported here: this model's requests are keyed on its engines' /tokenize, or routed by load (docs/TOKENIZER.md, Known limits)",
					"model", model, "tokenizer", path, "err", err)
			}
			continue
		}
		if err != nil {
			return err
		}
		m[model] = t
		registerCacheMetrics(deps, model, t)
	}
	deps.Tokenizers = m
	return nil
}

// registerCacheMetrics registers t's prefix cache series
// (kvmesh_tokenizer_cache_*, labelled by model) on deps.Registry, which it
// creates when nil (New then uses it). Replicas sharing a registry in one
// process share the first one's series.
func registerCacheMetrics(deps *Deps, model string, t *hfTokenizer) {
	if deps.Registry == nil {
		deps.Registry = prometheus.NewRegistry()
	}
	for _, c := range t.enc.Collectors(model) {
		if err := deps.Registry.Register(c); err != nil {
			if are := (prometheus.AlreadyRegisteredError{}); !errors.As(err, &are) && deps.Logger != nil {
				deps.Logger.Warn("tokenizer cache metrics not registered", "model", model, "err", err)
			}
		}
	}
}

// loadTokenizer loads model's tokenizer from path (tokenizer.json, or a
// directory holding it or tiktoken.model) and its chat template from
// tplPath, or from the directory when tplPath is empty
// (chat_template.jinja, chat_template.json, tokenizer_config.json). A
// template this interpreter cannot parse is logged on log (when not nil)
// and left out: chat for the model is routed by load.
func loadTokenizer(model, path, tplPath string, log *slog.Logger) (*hfTokenizer, error) {
	nt, err := tokenizer.LoadPath(path)
	if err != nil {
		return nil, fmt.Errorf("tokenizer for %s: %w", model, err)
	}
	ct, err := tokenizer.NewCachingTokenizer(nt, tokenizer.DefaultCacheConfig())
	if err != nil {
		return nil, fmt.Errorf("tokenizer for %s: %w", model, err)
	}
	if tplPath == "" {
		if st, err := os.Stat(path); err == nil && st.IsDir() {
			tplPath = path
		}
	}
	var tpl *tokenizer.ChatTemplate
	if tplPath != "" {
		if tplPath == path {
			tpl, err = tokenizer.LoadChatTemplateDir(path) // nil when the directory has none
		} else {
			tpl, err = tokenizer.LoadChatTemplateFile(tplPath)
		}
		switch {
		case errors.Is(err, chattmpl.ErrSyntax):
			// A template this interpreter cannot parse (vLLM's Jinja may):
			// serve the model with chat routed by load rather than refuse
			// to start.
			if log != nil {
				log.Warn("chat template not supported here: this model's chat is keyed on its engines' /tokenize, or routed by load",
					"model", model, "template", tplPath, "err", err)
			}
			tpl = nil
		case err != nil:
			return nil, fmt.Errorf("chat template for %s: %w", model, err)
		}
	}
	return &hfTokenizer{enc: ct, tpl: tpl, vocab: nt.VocabSize()}, nil
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

// adapterOf splits the request's model into the model the engines serve and
// the LoRA adapter ("" for a base-model request).
func (c *call) adapterOf() (served, adapter string) {
	if c.rt.upModel != "" { // route.go: a route's LoRA adapter on its pool
		return c.model, c.rt.upModel
	}
	if base, ok := c.s.cfg.LoRAAdapters[c.model]; ok {
		return base, c.model
	}
	if c.loraBase != "" { // handler.go candidates: an adapter the engines list
		return c.loraBase, c.model
	}
	return c.model, ""
}

// chainRoot is the root of the request's key chain: model, LoRA adapter and
// cache salt as the sidecar derives them (an adapter's blocks are keyed under
// its base model with the adapter's name).
func (c *call) chainRoot() uint64 {
	base, lora := c.adapterOf()
	return kvevents.Root(base, lora, string(c.req.cacheSalt))
}
