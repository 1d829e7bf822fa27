package tokenizer

import (
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"maps"
	"strings"
	"time"
	"unicode"

	"github.com/kvmesh/kvmesh/internal/tokenizer/chattmpl"
)

// ChatRequest is the part of a chat-completions request that decides the
// prompt: raw JSON members as the client sent them (nil when absent).
type ChatRequest struct {
	Messages  []byte // the messages array (required)
	Tools     []byte // tools: array or null
	Documents []byte // documents: array or null (RAG templates)
	Kwargs    []byte // chat_template_kwargs: object or null (e.g. enable_thinking)

	AddGenerationPrompt  bool // vLLM's default is true
	ContinueFinalMessage bool // continue the last (assistant) message instead of opening a new one
}

// ErrUnsupportedContent: a message part vLLM refuses (a file part, an
// unknown part type, a part without one).
var ErrUnsupportedContent = errors.New("unsupported content")

// reservedVars are template variables a chat_template_kwargs entry may not
// replace (transformers passes them as keyword arguments; a duplicate fails).
var reservedVars = map[string]bool{"messages": true, "tools": true, "documents": true, "add_generation_prompt": true,
	"chat_template": true, "tokenize": true}

// RenderRequest renders a chat request the way vLLM does before tokenizing
// (vllm/entrypoints/chat_utils: parse_chat_messages, then transformers'
// apply_chat_template with tools, documents, add_generation_prompt,
// continue_final_message and chat_template_kwargs):
//
//   - each message becomes {role, content, then tool_calls / reasoning /
//     tool_call_id, name}; other fields are dropped;
//   - content is a string with text parts joined by "\n" when the template
//     does not loop over content (vLLM's "string" format), else a list of
//     {"type": "text", "text": …} parts ("openai" format); a tool message's
//     text parts are always joined;
//   - tool call arguments given as a JSON string are parsed into an object
//     ({} when empty or not an object), an empty tool_calls list is dropped;
//   - tools become {"type", "function": {"name", "description", "parameters",
//     …extra}} like vLLM's pydantic model_dump (absent fields are null);
//   - a media part becomes {"type": "image"} (audio, video) in the "openai"
//     format and is left out of the "string" format's text (RenderPrompt
//     says where it sits).
//
// Errors wrap ErrInvalid (malformed input) or ErrUnsupportedContent.
func (c *ChatTemplate) RenderRequest(req *ChatRequest) (string, error) {
	return c.render(req, &mediaPass{}, nil)
}

// Media is one media item of a chat request: an image, audio, video or
// prompt-embeds part.
type Media struct {
	Modality string // "image", "audio", "video" or "prompt_embeds"
	// Key identifies the item: a hash of its uuid when the part has one (as
	// vLLM then uses the uuid for its multimodal hash), else of its data.
	Key uint64
}

// Prompt is a chat request rendered as vLLM renders it, with where its
// media sit.
type Prompt struct {
	// Text is the rendering. A media item is what the template makes of
	// {"type": modality} (vLLM's "openai" content format: Qwen-VL's
	// <|vision_start|><|image_pad|><|vision_end|>, Gemma's
	// <start_of_image>); the engine then expands it into the item's own
	// tokens. In the "string" format vLLM puts a model-specific placeholder
	// before the message's text, which is not in Text.
	Text string
	// Prefix is how many bytes of Text come before the first media item:
	// the part of the prompt whose tokens (and KV blocks) do not depend on
	// any media. len(Text) without media; 0 when the media's place cannot
	// be found.
	Prefix int
	Media  []Media
}

// RenderPrompt renders req as RenderRequest does and finds where its first
// media item sits: the template renders the request a second time with
// every media item as a marker text (in the "string" format, a marker
// before the message's text, where vLLM puts the placeholders), and Prefix
// is where the two renderings part or the first marker starts, whichever
// is first. A router keys only that prefix: blocks from the first media
// item on depend on the item itself (vLLM mixes its hash into their keys).
func (c *ChatTemplate) RenderPrompt(req *ChatRequest) (Prompt, error) {
	return c.RenderPromptBounded(req, Bound{})
}

// RenderPromptBounded is RenderPrompt within b's Deadline and Stop (its
// MaxTokens does not apply): past the deadline it fails with ErrDeadline,
// stopped with Stop's error (and chattmpl.ErrStopped). A caller that then encodes the prompt passes
// the same b, so rendering and encoding share one deadline.
func (c *ChatTemplate) RenderPromptBounded(req *ChatRequest, b Bound) (Prompt, error) {
	var first mediaPass
	text, err := c.render(req, &first, &b)
	if err != nil {
		return Prompt{}, err
	}
	p := Prompt{Text: text, Prefix: len(text), Media: first.items}
	if len(p.Media) == 0 {
		return p, nil
	}
	marked, err := c.render(req, &mediaPass{marker: true, parsed: first.parsed}, &b)
	if errors.Is(err, ErrDeadline) || errors.Is(err, chattmpl.ErrStopped) {
		return Prompt{}, err
	}
	at := strings.Index(marked, mediaMarker)
	if err != nil || at < 0 {
		p.Prefix = 0 // the template dropped the marker: the media's place is unknown
		return p, nil
	}
	n := 0
	for n < at && n < len(text) && text[n] == marked[n] {
		n++
	}
	p.Prefix = n
	return p, nil
}

// mediaMarker stands for a media item in RenderPrompt's second rendering.
const mediaMarker = "\x00kvmesh-media\x00"

// mediaPass is one rendering's treatment of media parts: as vLLM passes
// them to the template, or as mediaMarker text; items collects them.
type mediaPass struct {
	marker bool
	items  []Media
	parsed []any // the messages, decoded by the first pass
}

// render renders req within b (nil: unbounded).
func (c *ChatTemplate) render(req *ChatRequest, mp *mediaPass, b *Bound) (string, error) {
	if req.ContinueFinalMessage && req.AddGenerationPrompt {
		return "", fmt.Errorf("render chat: %w: add_generation_prompt and continue_final_message cannot both be true", ErrInvalid)
	}
	tools, err := toolValues(req.Tools)
	if err != nil {
		return "", err
	}
	v, err := c.variant(tools != nil) // vLLM passes tools=None only when the request has none
	if err != nil {
		return "", err
	}
	msgs, err := c.conversation(req.Messages, v.openaiFormat, mp)
	if err != nil {
		return "", err
	}
	vars := make(map[string]any, len(c.vars)+8)
	maps.Copy(vars, c.vars)
	if err := addKwargs(vars, req.Kwargs); err != nil {
		return "", err
	}
	vars["messages"] = msgs
	vars["tools"] = tools
	if vars["documents"], err = optionalJSON(req.Documents, "documents"); err != nil {
		return "", err
	}
	vars["add_generation_prompt"] = req.AddGenerationPrompt
	var cb chattmpl.Bound
	if b != nil {
		cb = chattmpl.Bound{Deadline: b.Deadline, Stop: b.Stop}
		// Decoding the request's JSON took time too. (Stop is not polled
		// here: a first poll may start work, such as a client watcher.)
		if !b.Deadline.IsZero() && !time.Now().Before(b.Deadline) {
			return "", fmt.Errorf("render chat: %w", ErrDeadline)
		}
	}
	s, err := v.tmpl.RenderBounded(vars, cb)
	if errors.Is(err, chattmpl.ErrDeadline) {
		return "", fmt.Errorf("render chat: %w", ErrDeadline)
	}
	if err != nil {
		return "", fmt.Errorf("render chat: %w", err)
	}
	if req.ContinueFinalMessage {
		return continueFinal(s, msgs)
	}
	return s, nil
}

func addKwargs(vars map[string]any, raw []byte) error {
	v, err := optionalJSON(raw, "chat_template_kwargs")
	if err != nil || v == nil {
		return err
	}
	d, ok := v.(*chattmpl.Dict)
	if !ok {
		return fmt.Errorf("render chat: %w: chat_template_kwargs must be an object", ErrInvalid)
	}
	for _, k := range d.Keys() {
		if reservedVars[k] {
			return fmt.Errorf("render chat: %w: chat_template_kwargs may not set %q", ErrInvalid, k)
		}
		vars[k], _ = d.Get(k)
	}
	return nil
}

// optionalJSON decodes raw (nil when absent or null).
func optionalJSON(raw []byte, field string) (any, error) {
	if len(raw) == 0 || string(raw) == "null" {
		return nil, nil
	}
	v, err := chattmpl.FromJSON(raw)
	if err != nil {
		return nil, fmt.Errorf("render chat: %w: %s: %v", ErrInvalid, field, err)
	}
	return v, nil
}

// conversation builds the template's messages from the request's.
func (c *ChatTemplate) conversation(raw []byte, openaiFormat bool, mp *mediaPass) ([]any, error) {
	list := mp.parsed
	if list == nil {
		v, err := chattmpl.FromJSON(raw)
		if err != nil {
			return nil, fmt.Errorf("render chat: %w: messages: %v", ErrInvalid, err)
		}
		var ok bool
		if list, ok = v.([]any); !ok || len(list) == 0 {
			return nil, fmt.Errorf("render chat: %w: messages must be a non-empty array", ErrInvalid)
		}
		mp.parsed = list
	}
	var err error
	out := make([]any, len(list))
	for i, m := range list {
		d, ok := m.(*chattmpl.Dict)
		if !ok {
			return nil, fmt.Errorf("render chat: %w: messages[%d] must be an object", ErrInvalid, i)
		}
		if out[i], err = message(d, i, openaiFormat, mp); err != nil {
			return nil, err
		}
	}
	return out, nil
}

func message(m *chattmpl.Dict, i int, openaiFormat bool, mp *mediaPass) (*chattmpl.Dict, error) {
	rv, _ := m.Get("role")
	role, ok := rv.(string)
	if !ok || role == "" {
		return nil, fmt.Errorf("render chat: %w: messages[%d].role must be a non-empty string", ErrInvalid, i)
	}
	cv, _ := m.Get("content")
	wantParts := openaiFormat && role != "tool"
	out := chattmpl.NewDict()
	out.Set("role", role)
	if s, ok := cv.(string); ok && !wantParts {
		out.Set("content", s) // the common case: no parts to build and join
	} else {
		texts, parts, err := contentParts(cv, i, mp)
		if err != nil {
			return nil, err
		}
		if wantParts {
			out.Set("content", parts)
		} else {
			out.Set("content", strings.Join(texts, "\n"))
		}
	}
	switch role {
	case "assistant":
		if tc, ok := m.Get("tool_calls"); ok && tc != nil {
			if err := assistantToolCalls(out, tc, i); err != nil {
				return nil, err
			}
		}
		r, ok := m.Get("reasoning")
		if !ok || r == nil {
			r, ok = m.Get("reasoning_content") // the field's name before vLLM 0.11
		}
		if ok && r != nil {
			out.Set("reasoning", r)
			out.Set("reasoning_content", r)
		}
	case "tool":
		if id, ok := m.Get("tool_call_id"); ok {
			out.Set("tool_call_id", id)
		}
	}
	if n, ok := m.Get("name"); ok {
		if s, ok := n.(string); ok {
			out.Set("name", s)
		}
	}
	return out, nil
}

// knownPartFields are the OpenAI content-part fields; a text part keeps the
// others (vLLM's _collect_extra_fields), e.g. cache_control.
var knownPartFields = map[string]bool{"type": true, "text": true, "refusal": true, "image_url": true, "input_audio": true,
	"audio_url": true, "video_url": true, "file": true, "uuid": true, "image_pil": true, "image_embeds": true,
	"audio_embeds": true, "video_embeds": true, "prompt_embeds": true, "input_image": true, "tool_reference": true, "name": true,
	"thinking": true}

// contentParts returns a message's text pieces and its parts in the openai
// form, as vLLM's _parse_chat_message_content_parts makes them: text parts
// (text, input_text, output_text, refusal, thinking) keep their text; a
// media part (image_url, input_image, image_pil, image_embeds, audio_url,
// input_audio, audio_embeds, video_url, prompt_embeds; without a type, the
// media field it has) is recorded in mp and becomes {"type": modality}
// (mp.marker: a mediaMarker text part, and a marker before the texts, where
// vLLM's "string" format puts the placeholders); tool_reference keeps its
// name. Any other part type is refused, as vLLM refuses it.
func contentParts(cv any, i int, mp *mediaPass) ([]string, []any, error) {
	switch x := cv.(type) {
	case nil:
		return nil, []any{}, nil
	case string:
		return []string{x}, []any{textPart(x, nil)}, nil
	case []any:
		var texts []string
		parts := []any{}
		media := false
		for j, p := range x {
			if s, ok := p.(string); ok {
				texts, parts = append(texts, s), append(parts, textPart(s, nil))
				continue
			}
			d, ok := p.(*chattmpl.Dict)
			if !ok {
				return nil, nil, fmt.Errorf("render chat: %w: messages[%d].content[%d] must be an object", ErrInvalid, i, j)
			}
			tv, hasType := d.Get("type")
			typ, _ := tv.(string)
			if !hasType || tv == nil {
				typ = untypedMedia(d)
			}
			switch typ {
			case "text", "input_text", "output_text", "refusal", "thinking":
				field := typ
				if typ == "input_text" || typ == "output_text" {
					field = "text"
				}
				t, _ := d.Get(field)
				s, ok := t.(string)
				if !ok {
					continue // vLLM skips text parts without text
				}
				texts, parts = append(texts, s), append(parts, textPart(s, d))
			case "tool_reference":
				n, _ := d.Get("name")
				s, _ := n.(string)
				ref := chattmpl.NewDict()
				ref.Set("type", "tool_reference")
				ref.Set("name", s)
				texts, parts = append(texts, s), append(parts, ref)
			case "":
				return nil, nil, fmt.Errorf("%w: messages[%d].content[%d] has no type", ErrUnsupportedContent, i, j)
			default:
				modality, ok := mediaModality[typ]
				if !ok {
					return nil, nil, fmt.Errorf("%w: messages[%d].content[%d] has unsupported type %q", ErrUnsupportedContent, i, j, typ)
				}
				media = true
				if mp.marker {
					parts = append(parts, textPart(mediaMarker, nil))
					continue
				}
				mp.items = append(mp.items, Media{Modality: modality, Key: mediaKey(d, typ)})
				m := chattmpl.NewDict()
				m.Set("type", modality)
				parts = append(parts, m)
			}
		}
		if media && mp.marker {
			texts = append([]string{mediaMarker}, texts...)
		}
		return texts, parts, nil
	}
	return nil, nil, fmt.Errorf("render chat: %w: messages[%d].content must be a string, an array of parts or null", ErrInvalid, i)
}

// mediaModality maps vLLM's media part types to their modality.
var mediaModality = map[string]string{"image_url": "image", "input_image": "image", "image_pil": "image",
	"image_embeds": "image", "audio_url": "audio", "input_audio": "audio", "audio_embeds": "audio",
	"video_url": "video", "prompt_embeds": "prompt_embeds"}

// untypedMedia is the type vLLM infers for a part without one from the
// media field it carries ("" when none).
func untypedMedia(d *chattmpl.Dict) string {
	for _, f := range []string{"image_url", "image_pil", "image_embeds", "audio_embeds", "prompt_embeds", "audio_url", "input_audio", "video_url"} {
		if v, ok := d.Get(f); ok && (f != "input_audio" || v != nil) {
			return f
		}
	}
	return ""
}

// mediaKey is the first 8 bytes of SHA-256 (hardware-accelerated: an
// inline image is megabytes) of the part's uuid, or of its media field's
// value.
func mediaKey(d *chattmpl.Dict, typ string) uint64 {
	h := sha256.New()
	if u, ok := d.Get("uuid"); ok && u != nil {
		io.WriteString(h, "uuid\x00")
		hashValue(h, u)
	} else {
		field := typ
		if typ == "prompt_embeds" {
			field = "data"
		}
		v, _ := d.Get(field)
		hashValue(h, v)
	}
	var sum [sha256.Size]byte
	return binary.LittleEndian.Uint64(h.Sum(sum[:0]))
}

// hashValue writes a JSON value's content to h, deterministically.
func hashValue(h io.Writer, v any) {
	switch x := v.(type) {
	case string:
		io.WriteString(h, "s")
		io.WriteString(h, x)
		io.WriteString(h, "\x00")
	case *chattmpl.Dict:
		io.WriteString(h, "{")
		for _, k := range x.Keys() {
			e, _ := x.Get(k)
			hashValue(h, k)
			hashValue(h, e)
		}
		io.WriteString(h, "}")
	case []any:
		io.WriteString(h, "[")
		for _, e := range x {
			hashValue(h, e)
		}
		io.WriteString(h, "]")
	default:
		fmt.Fprintf(h, "%T:%v\x00", x, x)
	}
}

func textPart(s string, from *chattmpl.Dict) *chattmpl.Dict {
	d := chattmpl.NewDict()
	d.Set("type", "text")
	d.Set("text", s)
	if from != nil {
		for _, k := range from.Keys() {
			if !knownPartFields[k] {
				v, _ := from.Get(k)
				d.Set(k, v)
			}
		}
	}
	return d
}

// assistantToolCalls copies tool_calls, parsing string arguments into
// objects as vLLM's _postprocess_messages does.
func assistantToolCalls(out *chattmpl.Dict, tc any, i int) error {
	calls, ok := tc.([]any)
	if !ok {
		out.Set("tool_calls", tc)
		return nil
	}
	if len(calls) == 0 {
		return nil // dropped: keeps templates on the plain assistant path
	}
	for j, c := range calls {
		d, ok := c.(*chattmpl.Dict)
		if !ok {
			return fmt.Errorf("render chat: %w: messages[%d].tool_calls[%d] must be an object", ErrInvalid, i, j)
		}
		typ, hasType := d.Get("type")
		fv, _ := d.Get("function")
		fn, isObj := fv.(*chattmpl.Dict)
		if hasType && typ != "function" || !isObj {
			return fmt.Errorf("render chat: %w: messages[%d].tool_calls[%d] must be a function call", ErrInvalid, i, j)
		}
		fn.Set("arguments", toolArguments(fn))
	}
	out.Set("tool_calls", calls)
	return nil
}

func toolArguments(fn *chattmpl.Dict) any {
	a, _ := fn.Get("arguments")
	switch x := a.(type) {
	case *chattmpl.Dict:
		return x
	case string:
		if x != "" {
			if v, err := chattmpl.FromJSON([]byte(x)); err == nil {
				if d, ok := v.(*chattmpl.Dict); ok {
					return d
				}
			}
		}
	}
	return chattmpl.NewDict()
}

// toolValues shapes tools like vLLM's ChatCompletionToolsParam.model_dump().
func toolValues(raw []byte) (any, error) {
	v, err := optionalJSON(raw, "tools")
	if err != nil || v == nil {
		return nil, err
	}
	list, ok := v.([]any)
	if !ok {
		return nil, fmt.Errorf("render chat: %w: tools must be an array", ErrInvalid)
	}
	out := make([]any, len(list))
	for i, t := range list {
		td, ok := t.(*chattmpl.Dict)
		var fn *chattmpl.Dict
		if ok {
			fv, _ := td.Get("function")
			fn, ok = fv.(*chattmpl.Dict)
		}
		if !ok {
			return nil, fmt.Errorf("render chat: %w: tools[%d].function must be an object", ErrInvalid, i)
		}
		name, _ := fn.Get("name")
		if _, ok := name.(string); !ok {
			return nil, fmt.Errorf("render chat: %w: tools[%d].function.name must be a string", ErrInvalid, i)
		}
		f := chattmpl.NewDict()
		for _, k := range []string{"name", "description", "parameters"} {
			v, _ := fn.Get(k)
			f.Set(k, v)
		}
		copyExtra(f, fn)
		d := chattmpl.NewDict()
		typ, ok := td.Get("type")
		if !ok {
			typ = "function"
		}
		d.Set("type", typ)
		d.Set("function", f)
		copyExtra(d, td)
		out[i] = d
	}
	return out, nil
}

// copyExtra appends src's keys that dst does not have, in src's order.
func copyExtra(dst, src *chattmpl.Dict) {
	for _, k := range src.Keys() {
		if _, ok := dst.Get(k); !ok {
			v, _ := src.Get(k)
			dst.Set(k, v)
		}
	}
}

// continueFinal cuts the rendering after the final message's text, as
// transformers does for continue_final_message: it finds the last
// occurrence of the stripped text and keeps the text's trailing whitespace
// only when the rendering has the whole message, as written, there (a
// message with leading whitespace never matches, so it loses its trailing
// whitespace).
func continueFinal(s string, msgs []any) (string, error) {
	last := msgs[len(msgs)-1].(*chattmpl.Dict)
	cv, _ := last.Get("content")
	final, ok := cv.(string)
	if parts, isList := cv.([]any); isList {
		for j := len(parts) - 1; j >= 0 && !ok; j-- {
			if t, has := parts[j].(*chattmpl.Dict).Get("text"); has {
				final, ok = t.(string)
			}
		}
	}
	trimmed := strings.TrimFunc(final, pyIsSpace)
	at := strings.LastIndex(s, trimmed)
	if !ok || at < 0 {
		return "", fmt.Errorf("render chat: %w: continue_final_message: the final message's text is not in the rendered chat", ErrInvalid)
	}
	lead := strings.TrimLeftFunc(final, pyIsSpace)
	if lead == final && strings.HasPrefix(s[at:], final) {
		return s[:at+len(final)], nil
	}
	return s[:at+len(trimmed)], nil
}

// pyIsSpace is Python's str.isspace for one character (what str.strip
// strips).
func pyIsSpace(r rune) bool { return unicode.IsSpace(r) || r >= 0x1c && r <= 0x1f }
