package ingress

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// endpoint is the OpenAI route a request came in on.
type endpoint uint8

const (
	epCompletions endpoint = iota + 1
	epChat
)

func (e endpoint) String() string {
	if e == epChat {
		return "chat"
	}
	return "completions"
}

// promptKind says what form the prompt arrived in.
type promptKind uint8

const (
	promptNone promptKind = iota
	promptText            // a string (completions)
	promptIDs             // token ids (completions)
	promptChat            // chat messages
)

// Message is one chat message with its content flattened to text.
type Message struct {
	Role    string
	Content string
}

// request is what the hot path reads from an OpenAI request body. Byte
// slices point into the body or into the request's reusable buffers; a
// request is reset and reused through a sync.Pool.
type request struct {
	ep               endpoint
	model            []byte
	stream           bool
	includeUsage     bool
	hasStreamOptions bool
	maxTokens        int
	kind             promptKind
	text             []byte   // promptText: the unescaped prompt
	ids              []uint32 // promptIDs as given; later the tokens of any prompt
	promptStart      int      // byte span of the "prompt" value in the body
	promptEnd        int
	messages         []byte // promptChat: raw messages array
	msgStart         int    // byte span of the "messages" member (key included)
	msgEnd           int
	body             []byte // the client's body
	cacheSalt        []byte
	chat             []Message
	sessionID        []byte
	// batch holds the raw elements of a batched prompt (two or more strings
	// or token-id arrays); text/ids above hold its first element, which
	// routing keys on. Empty for a single prompt.
	batch [][]byte
	// Spans of the output-limit members, for chat sent as completions:
	// max_completion_tokens must be renamed max_tokens there.
	mctKey   [2]int // the "max_completion_tokens" key, quotes included
	mtMember [2]int // the whole "max_tokens" member (key to value end)
	hasMCT   bool
	mctNull  bool // max_completion_tokens is null: mctKey spans the member, dropped as completions
	hasMT    bool
}

func (r *request) reset() {
	*r = request{
		model:     r.model[:0],
		text:      r.text[:0],
		ids:       r.ids[:0],
		chat:      r.chat[:0],
		cacheSalt: r.cacheSalt[:0],
		sessionID: r.sessionID[:0],
		batch:     r.batch[:0],
	}
}

// parseRequest fills r from body. It reads only the fields routing needs and
// validates the whole document's syntax; the engine validates the rest.
func parseRequest(r *request, ep endpoint, body []byte) error {
	r.ep = ep
	r.maxTokens = -1
	sawModel := false
	r.body = body
	// The token-id prompt is parsed in place of being skipped (one pass).
	consume := func(key, b []byte, at int) (int, bool, error) {
		if ep != epCompletions || string(key) != "prompt" || b[at] != '[' {
			return 0, false, nil
		}
		j := jsonscan.SkipWS(b, at+1)
		if j >= len(b) || b[j] < '0' || b[j] > '9' {
			return 0, false, nil
		}
		ids, end, err := scanTokenIDs(r.ids[:0], b, at)
		r.ids = ids
		if err != nil {
			return 0, true, badRequest("prompt", fmt.Errorf("%w: invalid token ids: %w", ErrBadRequest, err))
		}
		r.kind = promptIDs
		r.promptStart, r.promptEnd = at, end
		return end, true, nil
	}
	if i := jsonscan.SkipWS(body, 0); i >= len(body) || body[i] != '{' {
		return badRequest("", fmt.Errorf("%w: %w", ErrBadRequest, &jsonscan.Error{Msg: "request body must be a JSON object", Off: i}))
	}
	err := jsonscan.ScanMembers(body, consume, func(key, val []byte, koff, off int) error {
		switch string(key) {
		case "model":
			if val[0] != '"' {
				return badRequest("model", fmt.Errorf("%w: model must be a string", ErrBadRequest))
			}
			r.model = jsonscan.AppendUnquote(r.model[:0], val)
			sawModel = true
		case "stream":
			switch string(val) {
			case "true":
				r.stream = true
			case "false", "null":
				r.stream = false
			default:
				return badRequest("stream", fmt.Errorf("%w: stream must be a boolean", ErrBadRequest))
			}
		case "stream_options":
			r.hasStreamOptions = true
			if val[0] == 'n' {
				return nil
			}
			if val[0] != '{' {
				return badRequest("stream_options", fmt.Errorf("%w: stream_options must be an object", ErrBadRequest))
			}
			return jsonscan.ForEachMember(val, func(k, v []byte, _, _ int) error {
				if string(k) == "include_usage" {
					r.includeUsage = string(v) == "true"
				}
				return nil
			})
		case "max_tokens", "max_completion_tokens":
			if val[0] == 'n' {
				if string(key) == "max_completion_tokens" {
					r.mctNull = true // dropped when sent as completions
					r.mctKey = [2]int{koff, off + len(val)}
				}
				return nil
			}
			n, ok := jsonscan.ParseUint(val, math.MaxInt32)
			if !ok {
				return badRequest(string(key), fmt.Errorf("%w: %s must be a non-negative integer", ErrBadRequest, key))
			}
			if string(key) == "max_completion_tokens" {
				r.hasMCT = true
				r.mctKey = [2]int{koff, koff + len(`"max_completion_tokens"`)}
			} else {
				r.hasMT = true
				r.mtMember = [2]int{koff, off + len(val)}
				if r.hasMCT {
					return nil // vLLM: max_completion_tokens wins over the deprecated max_tokens
				}
			}
			r.maxTokens = int(n)
		case "cache_salt":
			if val[0] != '"' {
				return badRequest("cache_salt", fmt.Errorf("%w: cache_salt must be a string", ErrBadRequest))
			}
			r.cacheSalt = jsonscan.AppendUnquote(r.cacheSalt[:0], val)
		case "prompt":
			if ep != epCompletions || (r.kind == promptIDs && r.promptStart == off) {
				return nil // not ours, or already parsed by consume
			}
			r.promptStart, r.promptEnd = off, off+len(val)
			return r.parsePrompt(val)
		case "messages":
			if ep != epChat {
				return nil
			}
			if val[0] != '[' {
				return badRequest("messages", fmt.Errorf("%w: messages must be an array", ErrBadRequest))
			}
			r.messages = val
			r.msgStart, r.msgEnd = koff, off+len(val)
			r.kind = promptChat
		}
		return nil
	})
	if err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		return badRequest("", fmt.Errorf("%w: %w", ErrBadRequest, err))
	}
	if !sawModel || len(r.model) == 0 {
		return badRequest("model", fmt.Errorf("%w: model is required", ErrBadRequest))
	}
	switch ep {
	case epCompletions:
		if r.kind == promptNone {
			return badRequest("prompt", fmt.Errorf("%w: prompt is required", ErrBadRequest))
		}
	case epChat:
		if r.kind != promptChat {
			return badRequest("messages", fmt.Errorf("%w: messages is required", ErrBadRequest))
		}
		if err := r.parseMessages(); err != nil {
			return err
		}
	}
	return nil
}

// parsePrompt accepts a string, token ids, or an array of either (a batch:
// vLLM answers one choice per prompt, index = position). A batch goes to one
// engine, routed on its first prompt; r.batch keeps every element.
func (r *request) parsePrompt(val []byte) error {
	switch val[0] {
	case '"':
		r.text = jsonscan.AppendUnquote(r.text[:0], val)
		if len(r.text) == 0 {
			return badRequest("prompt", fmt.Errorf("%w: prompt is empty", ErrBadRequest))
		}
		r.kind = promptText
		return nil
	case '[':
	default:
		return badRequest("prompt", fmt.Errorf("%w: prompt must be a string, an array of token ids, or a one-element array of either", ErrBadRequest))
	}
	i := jsonscan.SkipWS(val, 1)
	if i < len(val) && (val[i] == '"' || val[i] == '[') {
		first := val[i]
		r.batch = r.batch[:0]
		if err := jsonscan.ForEachElem(val, func(e []byte) error {
			if e[0] != first {
				return fmt.Errorf("element %d: a batch holds only strings or only token-id arrays", len(r.batch))
			}
			r.batch = append(r.batch, e)
			return nil
		}); err != nil {
			return badRequest("prompt", fmt.Errorf("%w: prompt: %w", ErrBadRequest, err))
		}
		inner := r.batch[0]
		if len(r.batch) == 1 {
			r.batch = r.batch[:0]
		}
		if inner[0] == '[' {
			return r.parseIDs(inner)
		}
		return r.parsePrompt(inner)
	}
	return r.parseIDs(val)
}

func (r *request) parseIDs(val []byte) error {
	var err error
	if r.ids, err = appendTokenIDs(r.ids[:0], val); err != nil {
		return badRequest("prompt", fmt.Errorf("%w: invalid token ids: %w", ErrBadRequest, err))
	}
	if len(r.ids) == 0 {
		return badRequest("prompt", fmt.Errorf("%w: prompt is empty", ErrBadRequest))
	}
	r.kind = promptIDs
	return nil
}

// appendTokenIDs parses the JSON array of token ids val.
func appendTokenIDs(dst []uint32, val []byte) ([]uint32, error) {
	dst, end, err := scanTokenIDs(dst, val, 0)
	if err == nil && jsonscan.SkipWS(val, end) != len(val) {
		err = fmt.Errorf("trailing data after token ids")
	}
	return dst, err
}

// scanTokenIDs parses the array of token ids starting at b[i] == '[' in one
// tight pass and returns the index past its ']'. The prompt is the bulk of a
// body, so the scanner hands it here instead of skipping it first (the
// strict grammar here — digits, commas, whitespace — is valid JSON).
func scanTokenIDs(dst []uint32, b []byte, i int) ([]uint32, int, error) {
	i = jsonscan.SkipWS(b, i+1) // past '['
	if i < len(b) && b[i] == ']' {
		return dst, i + 1, nil
	}
	for i < len(b) {
		start := i
		var v uint64
		for i < len(b) && b[i] >= '0' && b[i] <= '9' {
			v = v*10 + uint64(b[i]-'0')
			if v > math.MaxUint32 {
				break
			}
			i++
		}
		if i == start || (i < len(b) && b[i] != ',' && b[i] != ']' && b[i] != ' ' && b[i] != '\n' && b[i] != '\t' && b[i] != '\r') ||
			(b[start] == '0' && i-start > 1) {
			end, _ := jsonscan.SkipValue(b, start)
			if end <= start {
				end = min(start+1, len(b))
			}
			return dst, 0, fmt.Errorf("token id %.32q is not a non-negative 32-bit integer", b[start:end])
		}
		dst = append(dst, uint32(v))
		i = jsonscan.SkipWS(b, i)
		if i < len(b) && b[i] == ']' {
			return dst, i + 1, nil
		}
		if i >= len(b) || b[i] != ',' {
			return dst, 0, fmt.Errorf("expected ',' in token ids")
		}
		i = jsonscan.SkipWS(b, i+1)
	}
	return dst, 0, fmt.Errorf("unterminated token ids")
}

// wireMessage is a chat message as sent; content is a string or an array of
// parts of which the text parts are kept.
type wireMessage struct {
	Role    *string         `json:"role"`
	Content json.RawMessage `json:"content"`
}

type wirePart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// parseMessages decodes the messages array. Chat requests need the whole
// conversation for templating, so this uses encoding/json.
func (r *request) parseMessages() error {
	var msgs []wireMessage
	if err := json.Unmarshal(r.messages, &msgs); err != nil {
		return badRequest("messages", fmt.Errorf("%w: messages: %w", ErrBadRequest, err))
	}
	if len(msgs) == 0 {
		return badRequest("messages", fmt.Errorf("%w: messages must not be empty", ErrBadRequest))
	}
	r.chat = r.chat[:0]
	for i, m := range msgs {
		if m.Role == nil || *m.Role == "" {
			return badRequest(fmt.Sprintf("messages[%d].role", i), fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, i))
		}
		msg := Message{Role: *m.Role}
		c := m.Content
		switch {
		case len(c) == 0 || string(c) == "null":
		case c[0] == '"':
			if err := json.Unmarshal(c, &msg.Content); err != nil {
				return badRequest(fmt.Sprintf("messages[%d].content", i), fmt.Errorf("%w: %w", ErrBadRequest, err))
			}
		case c[0] == '[':
			var parts []wirePart
			if err := json.Unmarshal(c, &parts); err != nil {
				return badRequest(fmt.Sprintf("messages[%d].content", i), fmt.Errorf("%w: %w", ErrBadRequest, err))
			}
			for _, p := range parts {
				if p.Type == "text" {
					msg.Content += p.Text
				}
			}
		default:
			return badRequest(fmt.Sprintf("messages[%d].content", i), fmt.Errorf("%w: messages[%d].content must be a string or an array of parts", ErrBadRequest, i))
		}
		r.chat = append(r.chat, msg)
	}
	return nil
}

// appendIDs appends ids as a JSON array.
func appendIDs(dst []byte, ids []uint32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, ']')
}

// rewritePrompt appends body with its prompt value replaced by ids.
func rewritePrompt(dst, body []byte, start, end int, ids []uint32) []byte {
	dst = append(dst, body[:start]...)
	dst = appendIDs(dst, ids)
	return append(dst, body[end:]...)
}

// chatToCompletionsBody turns a chat body into a completions body by
// replacing the "messages" member with the rendered prompt's token ids and
// renaming max_completion_tokens (chat only) to max_tokens, dropping a
// max_tokens it overrides; the other sampling fields carry over unchanged.
func chatToCompletionsBody(dst, body []byte, r *request, ids []uint32) []byte {
	var eds [3]bodyEdit
	n := 0
	eds[n] = bodyEdit{r.msgStart, r.msgEnd, editPrompt}
	n++
	if r.mctNull && !r.hasMCT {
		eds[n] = dropMember(body, r.mctKey[0], r.mctKey[1])
		n++
	}
	if r.hasMCT {
		eds[n] = bodyEdit{r.mctKey[0], r.mctKey[1], editRename}
		n++
		if r.hasMT {
			eds[n] = dropMember(body, r.mtMember[0], r.mtMember[1])
			n++
		}
	}
	for i := 1; i < n; i++ { // sort by start (at most 3)
		for j := i; j > 0 && eds[j].start < eds[j-1].start; j-- {
			eds[j], eds[j-1] = eds[j-1], eds[j]
		}
	}
	at := 0
	for _, e := range eds[:n] {
		dst = append(dst, body[at:e.start]...)
		switch e.kind {
		case editPrompt:
			dst = append(dst, `"prompt":`...)
			dst = appendIDs(dst, ids)
		case editRename:
			dst = append(dst, `"max_tokens"`...)
		}
		at = e.end
	}
	return append(dst, body[at:]...)
}

// bodyEdit replaces body[start:end] in chatToCompletionsBody.
type bodyEdit struct {
	start, end int
	kind       uint8
}

const (
	editDrop   uint8 = iota // cut the span
	editPrompt              // the chat messages → "prompt":[ids]
	editRename              // "max_completion_tokens" → "max_tokens"
)

// dropMember returns the edit removing the object member at body[start:end]
// together with one adjacent comma.
func dropMember(body []byte, start, end int) bodyEdit {
	if j := jsonscan.SkipWS(body, end); j < len(body) && body[j] == ',' {
		end = j + 1
	} else {
		for k := start - 1; k >= 0; k-- {
			if body[k] == ',' {
				start = k
				break
			}
			if body[k] != ' ' && body[k] != '\t' && body[k] != '\n' && body[k] != '\r' {
				break
			}
		}
	}
	return bodyEdit{start, end, editDrop}
}

// appendUsageRequest appends body with "stream_options":{"include_usage":true}
// added as its last member (the body is a validated object with members).
func appendUsageRequest(dst, body []byte) []byte {
	end := len(body) - 1
	for end > 0 && body[end] != '}' {
		end--
	}
	dst = append(dst, body[:end]...)
	dst = append(dst, `,"stream_options":{"include_usage":true}`...)
	return append(dst, body[end:]...)
}
