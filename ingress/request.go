package ingress

import (
	"errors"
	"fmt"
	"math"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// endpoint is the OpenAI route a request came in on.
type endpoint uint8

const (
	epCompletions endpoint = iota + 1
	epChat
	epResponses // the Responses API (responses.go)
	epMessages  // Anthropic's Messages API (messages.go)
	epOther     // the engine's other model endpoints (embeddings, rerank, score, tokenize…): passthrough.go
)

func (e endpoint) String() string {
	switch e {
	case epChat:
		return "chat"
	case epResponses:
		return "responses"
	case epMessages:
		return "messages"
	case epOther:
		return "other"
	}
	return "completions"
}

// promptParam is the request member that holds the prompt on e, the
// param of its context_length_exceeded error: OpenAI names "messages" on
// chat, the Responses API's prompt is "input".
func (e endpoint) promptParam() string {
	switch e {
	case epChat, epMessages:
		return "messages"
	case epResponses:
		return "input"
	}
	return "prompt"
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
	noSpecial        bool // completions: "add_special_tokens": false
	truncate         int  // truncate_prompt_tokens > 0: the engine keeps the prompt's last truncate tokens
	chatOnly         bool // chat: members /v1/completions reads otherwise or not at all (chatOnlyMember)
	maxTokens        int  // the output limit the engine applies (settle); -1: none
	n                int  // choices per prompt ("n"; 0: absent): the engine decodes that many sequences
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
	chat             []Message // promptChat: built on first use by chatMessages
	chatDone         bool
	sessionID        []byte
	hasModel         bool
	// Chat members the template sees besides messages (raw JSON in body).
	tools, documents, templateKwargs, toolChoice []byte
	addGenPrompt, continueFinal                  bool
	// batch holds the raw elements of a batched prompt (two or more strings
	// or token-id arrays); text/ids above hold its first element, which
	// routing keys on. Empty for a single prompt.
	batch [][]byte
	// wrapDrop holds the spans (key to value end) of chat members that
	// /v1/completions would read but vLLM's chat endpoint ignores or reads
	// as nothing asked (prompt, prompt_embeds, suffix; logprobs false or
	// null): chatToCompletionsBody leaves them out, so the engine answers
	// the rendered conversation as its chat endpoint would.
	wrapDrop [][2]int
	// The int members as read (intMember), each the last of its name, as
	// vLLM reads the body (Python's json keeps a name's last member, null
	// included): max_tokens (the Responses API's max_output_tokens),
	// max_completion_tokens and truncate_prompt_tokens. settle decides what
	// they mean together.
	mt, mct, trunc intField
	// Spans of the last output-limit members, for chat sent as
	// completions: max_completion_tokens must be renamed max_tokens there.
	mctKey    [2]int // the "max_completion_tokens" key, quotes included
	mctMember [2]int // the whole "max_completion_tokens" member (key to value end)
	mctVal    int    // where its value starts
	mtMember  [2]int // the whole "max_tokens" member
	mtN, mctN uint8  // members of each name (2: more than one)
	hasMCT    bool   // the last max_completion_tokens is a number: it wins over max_tokens
	mctNull   bool   // the last max_completion_tokens is null: dropped as completions
	hasMT     bool   // the last max_tokens is a number
	// Responses API members (responses.go): input, instructions and tools
	// as sent (the Messages API's messages, system and tools: messages.go);
	// synth holds the chat messages and tools built from them.
	input, instructions, respTools []byte
	prevResponse                   []byte // previous_response_id, unquoted
	hasRequestID                   bool
	synth                          []byte
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
		wrapDrop:  r.wrapDrop[:0],

		prevResponse: r.prevResponse[:0],
		synth:        r.synth[:0],
	}
}

// parseRequest fills r from body. It reads only the fields routing and chat
// rendering need and validates the whole document's syntax; the engine
// validates the rest.
func parseRequest(r *request, ep endpoint, body []byte) error {
	r.ep = ep
	r.maxTokens = -1
	r.body = body
	r.addGenPrompt = true // vLLM's default
	if i := jsonscan.SkipWS(body, 0); i >= len(body) || body[i] != '{' {
		return badRequest("", fmt.Errorf("%w: %w", ErrBadRequest, &jsonscan.Error{Msg: "request body must be a JSON object", Off: i}))
	}
	if err := jsonscan.ScanMembers(body, r.consumeIDs, r.member); err != nil {
		var ae *apiError
		if errors.As(err, &ae) {
			return err
		}
		return badRequest("", fmt.Errorf("%w: %w", ErrBadRequest, err))
	}
	if err := r.settle(); err != nil {
		return err
	}
	return r.finish()
}

// intField is an int member as read: its last member's value, when that
// is an int as pydantic reads one (pyInt); bad when it is not an int nor
// null; neither when absent or null.
type intField struct {
	v   int64
	set bool
	bad bool
}

// intMember reads the int member val (null: as absent).
func intMember(val []byte) intField {
	if val[0] == 'n' {
		return intField{}
	}
	v, ok := pyInt(val)
	return intField{v: v, set: ok, bad: !ok}
}

// settle decides what the int members mean once every member is read (the
// last of each name), as vLLM does: a max_completion_tokens that is a
// number wins over max_tokens; a member that is not an int is a 400 even
// when another wins (pydantic validates every field), a negative limit
// only when it is the one that applies.
func (r *request) settle() error {
	mtName := "max_tokens"
	if r.ep == epResponses {
		mtName = "max_output_tokens"
	}
	switch {
	case r.mct.bad:
		return limitError("max_completion_tokens")
	case r.mt.bad:
		return limitError(mtName)
	}
	r.hasMCT, r.hasMT = r.mct.set, r.mt.set
	r.maxTokens = -1
	switch {
	case r.hasMCT || r.hasMT:
		v, name := r.mt.v, mtName
		if r.hasMCT {
			v, name = r.mct.v, "max_completion_tokens"
		}
		if v < 0 {
			return limitError(name)
		}
		r.maxTokens = int(min(v, math.MaxInt32))
	case r.ep == epCompletions && r.mtN == 0:
		// Absent (not null) is the completions default of vLLM's and
		// SGLang's request models: the engine stops there.
		r.maxTokens = completionsDefaultMaxTokens
	}
	r.truncate = 0
	switch t := r.trunc; {
	case t.set && t.v == -1, !t.set && !t.bad:
		// -1 is the model's length, which the engine applies.
	case t.set && t.v > 0:
		r.truncate = int(min(t.v, math.MaxInt32))
	default:
		return badRequest("truncate_prompt_tokens", fmt.Errorf("%w: truncate_prompt_tokens must be a positive integer or -1", ErrBadRequest))
	}
	return nil
}

// completionsDefaultMaxTokens is max_tokens of a completions request that
// sends none, in vLLM's CompletionRequest and SGLang's alike (null is the
// model's context instead).
const completionsDefaultMaxTokens = 16

func limitError(name string) error {
	return badRequest(name, fmt.Errorf("%w: %s must be a non-negative integer", ErrBadRequest, name))
}

// consumeIDs parses a token-id prompt in place of skipping it (one pass).
func (r *request) consumeIDs(key, b []byte, at int) (int, bool, error) {
	if r.ep != epCompletions || string(key) != "prompt" || b[at] != '[' {
		return 0, false, nil
	}
	j := jsonscan.SkipWS(b, at+1)
	if j >= len(b) || b[j] < '0' || b[j] > '9' {
		return 0, false, nil
	}
	ids, end, err := scanTokenIDs(r.ids[:0], b, at)
	r.ids, r.batch = ids, r.batch[:0] // a later prompt member replaces an earlier batch
	if err != nil {
		return 0, true, badRequest("prompt", fmt.Errorf("%w: invalid token ids: %w", ErrBadRequest, err))
	}
	r.kind = promptIDs
	r.promptStart, r.promptEnd = at, end
	return end, true, nil
}

// chatOnlyMember reports whether a chat request's member asks for what
// only vLLM's chat endpoint gives (chat-shaped logprobs, chat's echo, every
// choice's role, the reasoning parser, the prompt's logprobs and token ids
// where chat puts them) or what /v1/completions reads otherwise (best_of):
// ChatModeCompletions then forwards the request as chat. Tools are checked
// with the request (they need the chat endpoint's tool parser).
func chatOnlyMember(key string, val []byte) bool {
	switch key {
	case "logprobs", "echo", "return_token_ids":
		// Only false and null ask for nothing on both endpoints. Any other
		// value (1, 2, "true") is a boolean or a 400 to chat's pydantic but
		// a count, or a completions-shaped answer, to /v1/completions, so
		// the chat endpoint answers it as it would directly.
		return string(val) != "false" && string(val) != "null"
	case "include_reasoning":
		return string(val) == "true"
	case "n":
		return string(val) != "1" && string(val) != "null"
	}
	return string(val) != "null"
}

// member reads one top-level member.
func (r *request) member(key, val []byte, koff, off int) error {
	switch string(key) {
	case "model":
		if string(val) == "null" { // as absent: the ingress's one model (handler.go, defaultModel)
			r.model, r.hasModel = r.model[:0], false // a later member wins, as in every JSON parser
			return nil
		}
		if val[0] != '"' {
			return badRequest("model", fmt.Errorf("%w: model must be a string", ErrBadRequest))
		}
		r.model = jsonscan.AppendUnquote(r.model[:0], val)
		r.hasModel = true
	case "stream":
		b, err := boolMember("stream", val)
		r.stream = b
		return err
	case "logprobs", "top_logprobs", "echo", "n", "reasoning_effort", "include_reasoning", "parallel_tool_calls",
		"best_of", "return_token_ids", "prompt_logprobs":
		if r.ep == epChat {
			if chatOnlyMember(string(key), val) {
				r.chatOnly = true
			} else if string(key) == "logprobs" {
				// false or null: no logprobs in chat, but /v1/completions
				// would read false as 0 alternatives (or refuse a boolean).
				r.wrapDrop = append(r.wrapDrop, [2]int{koff, off + len(val)})
			}
		}
		if string(key) == "n" && (r.ep == epCompletions || r.ep == epChat) { // the Responses and Messages APIs have no n
			// The last member wins; null, or a count the engine refuses
			// (it answers that), leaves the default one.
			r.n = 0
			if n, ok := pyInt(val); ok && n > 0 {
				r.n = int(min(n, math.MaxInt32))
			}
		}
	case "truncate_prompt_tokens":
		if r.ep == epCompletions || r.ep == epChat { // vLLM's Responses and Messages APIs ignore it
			r.trunc = intMember(val)
		}
	case "add_special_tokens":
		b, err := boolMember("add_special_tokens", val)
		r.noSpecial = !b && r.ep == epCompletions // chat's default is false already; its true is the template's business
		return err
	case "stream_options":
		r.hasStreamOptions, r.includeUsage = val[0] != 'n', false // null: as absent
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
		r.maxTokensMember(key, val, koff, off)
	case "kv_transfer_params", "bootstrap_host", "bootstrap_port", "bootstrap_room":
		// The P/D legs' members (pd.go, pd_sglang.go) are the router's to
		// set: from a client they would make an engine connect where the
		// client says or hold KV blocks for a transfer that never comes.
		if val[0] != 'n' {
			return badRequest(string(key), fmt.Errorf("%w: %s is set by the router for prefill/decode disaggregation; a client may not send it", ErrBadRequest, key))
		}
	case "cache_salt":
		if val[0] == 'n' {
			r.cacheSalt = r.cacheSalt[:0]
			return nil
		}
		if val[0] != '"' {
			return badRequest("cache_salt", fmt.Errorf("%w: cache_salt must be a string", ErrBadRequest))
		}
		r.cacheSalt = jsonscan.AppendUnquote(r.cacheSalt[:0], val)
	case "prompt", "prompt_embeds", "suffix":
		if r.ep == epChat {
			// vLLM's chat endpoint ignores them; as completions a prompt
			// after messages would replace the rendered conversation.
			r.wrapDrop = append(r.wrapDrop, [2]int{koff, off + len(val)})
			return nil
		}
		if string(key) != "prompt" {
			return nil
		}
		if r.ep != epCompletions || (r.kind == promptIDs && r.promptStart == off) {
			return nil // not ours, or already parsed by consumeIDs
		}
		r.promptStart, r.promptEnd = off, off+len(val)
		r.batch = r.batch[:0] // a later prompt member replaces an earlier batch
		return r.parsePrompt(val)
	default:
		switch r.ep {
		case epChat:
			return r.chatMember(key, val, koff, off)
		case epResponses:
			return r.responsesMember(key, val, koff, off)
		case epMessages:
			return r.messagesMember(key, val)
		}
	}
	return nil
}

// boolMember reads a boolean member as vLLM does (pyBool; null is false).
func boolMember(name string, val []byte) (bool, error) {
	if string(val) == "null" {
		return false, nil
	}
	if b, ok := pyBool(val); ok {
		return b, nil
	}
	return false, badRequest(name, fmt.Errorf("%w: %s must be a boolean", ErrBadRequest, name))
}

// maxTokensMember reads an output-limit member (settle decides which
// applies). max_completion_tokens is chat's alone: vLLM's /v1/completions
// and Messages API ignore it, and the Responses API reads neither (its
// max_output_tokens: responses.go); the engine's other endpoints produce no
// output.
func (r *request) maxTokensMember(key, val []byte, koff, off int) {
	if string(key) == "max_completion_tokens" {
		if r.ep != epChat {
			return
		}
		r.mct = intMember(val)
		r.mctN = min(r.mctN+1, 2)
		kend, _, _ := jsonscan.SkipString(r.body, koff) // the key as written (escapes included)
		r.mctKey = [2]int{koff, kend}
		r.mctMember, r.mctVal = [2]int{koff, off + len(val)}, off
		r.mctNull = val[0] == 'n'
		return
	}
	if r.ep == epResponses || r.ep == epOther {
		return
	}
	r.mt = intMember(val)
	r.mtN = min(r.mtN+1, 2)
	r.mtMember = [2]int{koff, off + len(val)}
}

// chatMember reads the members that shape a chat prompt: the template sees
// messages, tools, documents, chat_template_kwargs and the two
// generation-prompt switches, as in vLLM.
func (r *request) chatMember(key, val []byte, koff, off int) error {
	var err error
	switch string(key) {
	case "messages":
		if val[0] != '[' {
			return badRequest("messages", fmt.Errorf("%w: messages must be an array", ErrBadRequest))
		}
		r.messages = val
		r.msgStart, r.msgEnd = koff, off+len(val)
		r.kind = promptChat
	case "tools", "documents":
		if val[0] != '[' && val[0] != 'n' {
			return badRequest(string(key), fmt.Errorf("%w: %s must be an array", ErrBadRequest, key))
		}
		if string(key) == "tools" {
			r.tools = val
		} else {
			r.documents = val
		}
	case "chat_template_kwargs":
		if val[0] != '{' && val[0] != 'n' {
			return badRequest("chat_template_kwargs", fmt.Errorf("%w: chat_template_kwargs must be an object", ErrBadRequest))
		}
		r.templateKwargs = val
	case "tool_choice":
		r.toolChoice = val
	case "chat_template":
		if val[0] != 'n' {
			return badRequest("chat_template", fmt.Errorf("%w: a per-request chat_template is not accepted; the model's own template is used (as vLLM without --trust-request-chat-template)", ErrBadRequest))
		}
	case "add_generation_prompt":
		r.addGenPrompt, err = boolMember("add_generation_prompt", val)
		if string(val) == "null" {
			r.addGenPrompt = true
		}
	case "continue_final_message":
		r.continueFinal, err = boolMember("continue_final_message", val)
	}
	return err
}

// finish checks what the whole request must have.
func (r *request) finish() error {
	switch r.ep {
	case epCompletions:
		if r.kind == promptNone {
			return badRequest("prompt", fmt.Errorf("%w: prompt is required", ErrBadRequest))
		}
	case epChat:
		if r.kind != promptChat {
			return badRequest("messages", fmt.Errorf("%w: messages is required", ErrBadRequest))
		}
		tc := string(r.toolChoice)
		if tc != "" && tc != "null" && tc != `"none"` && (len(r.tools) == 0 || string(r.tools) == "null") {
			return badRequest("tool_choice", fmt.Errorf("%w: when using tool_choice, tools must be set", ErrBadRequest))
		}
		if r.continueFinal && r.addGenPrompt {
			return badRequest("continue_final_message", fmt.Errorf("%w: continue_final_message and add_generation_prompt cannot both be true", ErrBadRequest))
		}
		return r.checkMessages()
	case epResponses:
		return r.finishResponses()
	case epMessages:
		return r.finishMessages()
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

// checkMessages validates the messages array (each message an object with a
// non-empty string role, content a string, an array of content-part objects
// or null) without copying any text: the chat renderer reads the raw JSON,
// and chatMessages flattens the messages only for the consumers that need
// them. Errors name the JSON path, never a Go type; they are formatted only
// on the error path.
func (r *request) checkMessages() error {
	n := 0
	err := jsonscan.ForEachElem(r.messages, func(m []byte) error {
		if m[0] != '{' {
			return badRequest(fmt.Sprintf("messages[%d]", n), fmt.Errorf("%w: messages[%d] must be an object", ErrBadRequest, n))
		}
		sawRole, emptyRole := false, false
		if ferr := jsonscan.ForEachMember(m, func(k, v []byte, _, _ int) error {
			switch string(k) {
			case "role":
				if v[0] != '"' {
					return badRequest(fmt.Sprintf("messages[%d].role", n), fmt.Errorf("%w: messages[%d].role must be a string", ErrBadRequest, n))
				}
				// A string unquotes to "" only when it is "" (any escape yields a byte).
				sawRole, emptyRole = true, len(v) == 2
			case "content":
				return checkContent(v, n)
			}
			return nil
		}); ferr != nil {
			return ferr
		}
		if !sawRole || emptyRole {
			return badRequest(fmt.Sprintf("messages[%d].role", n), fmt.Errorf("%w: messages[%d].role is required", ErrBadRequest, n))
		}
		n++
		return nil
	})
	if err != nil {
		return messagesError(err)
	}
	if n == 0 {
		return badRequest("messages", fmt.Errorf("%w: messages must not be empty", ErrBadRequest))
	}
	return nil
}

// messagesError returns err if it is an API error, else a 400 naming the
// messages array (apart so the errors.As target escapes on the error path only).
func messagesError(err error) error {
	var ae *apiError
	if errors.As(err, &ae) {
		return err
	}
	return badRequest("messages", fmt.Errorf("%w: messages: %w", ErrBadRequest, err))
}

// checkContent validates message i's content: a string, null, or an array
// of content-part objects (whether the parts are acceptable is the
// renderer's call).
func checkContent(v []byte, i int) error {
	switch v[0] {
	case 'n', '"':
		return nil
	case '[':
	default:
		param := fmt.Sprintf("messages[%d].content", i)
		return badRequest(param, fmt.Errorf("%w: %s must be a string, an array of content parts or null", ErrBadRequest, param))
	}
	j := 0
	return jsonscan.ForEachElem(v, func(p []byte) error {
		if p[0] != '{' {
			param := fmt.Sprintf("messages[%d].content", i)
			return badRequest(param, fmt.Errorf("%w: %s[%d] must be an object", ErrBadRequest, param, j))
		}
		j++
		return nil
	})
}

// chatMessages returns each message's role and text (for tokenizers without
// whole-request rendering, and for the length estimate of models without a
// tokenizer), flattening them on first use. The messages were validated by
// parseRequest.
func (r *request) chatMessages() []Message {
	if r.chatDone {
		return r.chat
	}
	r.chatDone = true
	r.chat = r.chat[:0]
	_ = jsonscan.ForEachElem(r.messages, func(m []byte) error {
		var msg Message
		_ = jsonscan.ForEachMember(m, func(k, v []byte, _, _ int) error {
			switch string(k) {
			case "role":
				msg.Role = string(jsonscan.AppendUnquote(nil, v))
			case "content":
				msg.Content = contentText(v)
			}
			return nil
		})
		r.chat = append(r.chat, msg)
		return nil
	})
	return r.chat
}

// contentText flattens a validated content value (string, parts or null) to
// its text parts.
func contentText(v []byte) string {
	switch v[0] {
	case '"':
		return string(jsonscan.AppendUnquote(nil, v))
	case '[':
	default:
		return ""
	}
	var text []byte
	_ = jsonscan.ForEachElem(v, func(p []byte) error {
		var typ, t []byte
		_ = jsonscan.ForEachMember(p, func(k, pv []byte, _, _ int) error {
			switch string(k) {
			case "type":
				typ = pv
			case "text":
				t = pv
			}
			return nil
		})
		if string(typ) == `"text"` && len(t) > 0 && t[0] == '"' {
			text = jsonscan.AppendUnquote(text, t)
		}
		return nil
	})
	return string(text)
}
