package sim

import (
	"encoding/json"
	"errors"
	"net/http"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// The Anthropic Messages API as vLLM serves it (AnthropicServingMessages,
// vllm/entrypoints/anthropic/serving.py and api_router.py):
//
//   - POST /v1/messages converts the request into a chat completions
//     request (messages_request.go), renders it with the chat template and
//     generates exactly as /v1/chat/completions does, then converts the
//     answer: the message id is the chat completion id (chatcmpl-<request
//     id>), stop_reason is end_turn, max_tokens or tool_use for the finish
//     reasons stop, length and tool_calls;
//   - usage counts prompt-cache hits as vLLM does with prompt token details
//     on (the simulator always reports them): input_tokens is the prompt
//     less its cached tokens, cache_read_input_tokens the cached tokens,
//     cache_creation_input_tokens 0;
//   - a stream is "event: <type>\ndata: <json>" events without [DONE]:
//     message_start when the first output token is ready (vLLM converts the
//     chat stream's first chunk, which follows the prefill), the text block
//     (content_block_start, one content_block_delta per engine step,
//     content_block_stop; none for an empty generation), message_delta with
//     the stop reason and usage, message_stop. Events carry only the fields
//     vLLM sets (it dumps them with exclude_unset): message_start's message
//     has no type and role, and its usage only input_tokens (the whole
//     prompt) and output_tokens 0;
//   - errors are {"type":"error","error":{"type","message"}} with the HTTP
//     status, the type the chat path gives the error (vLLM's
//     translate_error_response); validation failures too (released vLLM
//     answers those in the OpenAI shape, vllm-project/vllm#57997);
//   - POST /v1/messages/count_tokens renders the same conversion and
//     answers {"input_tokens": N, "context_management":
//     {"original_input_tokens": N}}.
//
// The simulator never produces thinking or tool_use blocks: its generation
// is filler text, as for the chat endpoint.

// messagesRoutes registers the Messages endpoints on mux.
func (s *Server) messagesRoutes(mux *http.ServeMux) {
	mux.HandleFunc("POST /v1/messages", s.handleMessages)
	mux.HandleFunc("POST /v1/messages/count_tokens", s.handleCountTokens)
}

// messageObject is the Message (AnthropicMessagesResponse). Type and Role
// are empty in message_start, where vLLM leaves them out.
type messageObject struct {
	ID           string        `json:"id"`
	Type         string        `json:"type,omitempty"`
	Role         string        `json:"role,omitempty"`
	Content      []textBlock   `json:"content"`
	Model        string        `json:"model"`
	StopReason   *string       `json:"stop_reason"`
	StopSequence *string       `json:"stop_sequence"` // always null: vLLM reports a stop string as end_turn
	Usage        messagesUsage `json:"usage"`
}

// textBlock is a text content block.
type textBlock struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// messagesUsage is AnthropicUsage; the cache fields are absent where vLLM
// has no cache details (message_start).
type messagesUsage struct {
	InputTokens              int  `json:"input_tokens"`
	OutputTokens             int  `json:"output_tokens"`
	CacheCreationInputTokens *int `json:"cache_creation_input_tokens,omitempty"`
	CacheReadInputTokens     *int `json:"cache_read_input_tokens,omitempty"`
}

// cacheUsage is the Anthropic usage of a finished generation.
func cacheUsage(u *openai.Usage) messagesUsage {
	cached, none := u.CachedTokens(), 0
	return messagesUsage{InputTokens: u.PromptTokens - cached, OutputTokens: u.CompletionTokens,
		CacheCreationInputTokens: &none, CacheReadInputTokens: &cached}
}

// stopReasons maps chat finish reasons to Anthropic stop reasons.
var stopReasons = map[string]string{"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}

// stopReason is the stop reason of a finish reason, nil for others.
func stopReason(finish string) *string {
	if r, ok := stopReasons[finish]; ok {
		return &r
	}
	return nil
}

// messagesEvent is one stream event (AnthropicStreamEvent), with vLLM's
// field order.
type messagesEvent struct {
	Type         string          `json:"type"`
	Message      *messageObject  `json:"message,omitempty"`
	Delta        any             `json:"delta,omitempty"`
	ContentBlock *textBlock      `json:"content_block,omitempty"`
	Index        *int            `json:"index,omitempty"`
	Error        *anthropicError `json:"error,omitempty"`
	Usage        *messagesUsage  `json:"usage,omitempty"`
}

// textDelta is a content_block_delta's delta.
type textDelta struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// stopDelta is message_delta's delta: only stop_reason, null when the
// finish reason has none.
type stopDelta struct {
	StopReason *string `json:"stop_reason"`
}

// anthropicError is the inner object of an Anthropic error.
type anthropicError struct {
	Type    string `json:"type"`
	Message string `json:"message"`
}

// anthropicErrorBody is an Anthropic error response body.
type anthropicErrorBody struct {
	Type  string         `json:"type"`
	Error anthropicError `json:"error"`
}

// countTokensAnswer is AnthropicCountTokensResponse.
type countTokensAnswer struct {
	InputTokens       int `json:"input_tokens"`
	ContextManagement struct {
		OriginalInputTokens int `json:"original_input_tokens"`
	} `json:"context_management"`
}

// handleMessages is POST /v1/messages.
func (s *Server) handleMessages(w http.ResponseWriter, r *http.Request) {
	aw := &anthropicErrors{ResponseWriter: w}
	defer aw.finish()
	req, pd, err := readPDRequest(s, w, r, decodeMessagesRequest)
	if err != nil {
		s.fail(aw, err)
		return
	}
	g, err := s.messagesGen(r, req, pd)
	if err != nil {
		s.fail(aw, err)
		return
	}
	rk, calls, notify, ok := s.start(aw, r, g)
	if !ok {
		return
	}
	if g.stream {
		s.streamMessages(aw, r, req.Model, g, calls, notify)
		return
	}
	if err := s.waitAll(r, calls, notify); err != nil {
		if errors.Is(err, ErrClosed) {
			s.fail(aw, err) // the client is still there: tell it the engine went away
		}
		return
	}
	msg := s.messageAnswer(req.Model, g, calls[0])
	writeJSON(aw, http.StatusOK, withKVTransfer(msg, s.pd.responseParams(rk, g, calls[0])))
}

// messagesGen resolves the request's model (the served one when absent),
// renders its prompt and makes the generation the chat endpoint would run.
func (s *Server) messagesGen(r *http.Request, req *messagesRequest, pd *pdRequest) (*gen, error) {
	lora, err := s.resolveModel(&req.Model)
	if err != nil {
		return nil, err
	}
	prompt, err := s.anthropicTokens(&req.anthropicPrompt)
	if err != nil {
		return nil, err
	}
	g := &gen{id: s.requestID(r), prompts: [][]uint32{prompt}, maxTokens: *req.MaxTokens, lora: lora,
		stream: bool(req.Stream), chat: true, pd: pd, stop: req.StopSequences}
	if req.CacheSalt != nil {
		g.salt = *req.CacheSalt
	}
	return g, nil
}

// anthropicTokens renders p's chat messages and tools as the chat endpoint
// renders a request with them and tokenizes the prompt.
func (s *Server) anthropicTokens(p *anthropicPrompt) ([]uint32, error) {
	raw, err := json.Marshal(p.chat)
	if err != nil {
		return nil, badRequest("messages: %v", err)
	}
	var msgs []openai.ChatMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, badRequest("messages: %v", err)
	}
	ids, err := s.chatTokens(&openai.ChatRequest{Model: p.Model, Messages: msgs, RawMessages: raw, Tools: p.chatTools,
		ChatTemplateKwargs: p.ChatTemplateKwargs}, false)
	if err != nil {
		return nil, badRequest("render chat template: %v", err)
	}
	return ids, nil
}

// messageAnswer is the Message of a finished generation; an empty
// generation has no content block (as vLLM).
func (s *Server) messageAnswer(model string, g *gen, c *call) messageObject {
	sn := c.snap()
	text := c.cut.clip(s.tok.Decode(c.req.OutputTokens(nil, 0, sn.generated), true), 0)
	m := messageObject{ID: responseID(g), Type: "message", Role: "assistant", Content: []textBlock{}, Model: model,
		StopReason: stopReason(sn.reason), Usage: cacheUsage(s.usage([]*call{c}))}
	if text != "" {
		m.Content = append(m.Content, textBlock{Type: "text", Text: text})
	}
	return m
}

// handleCountTokens is POST /v1/messages/count_tokens.
func (s *Server) handleCountTokens(w http.ResponseWriter, r *http.Request) {
	aw := &anthropicErrors{ResponseWriter: w}
	defer aw.finish()
	p, err := readRequest(s, w, r, decodeCountTokensRequest)
	if err == nil {
		_, err = s.resolveModel(&p.Model)
	}
	var ids []uint32
	if err == nil {
		ids, err = s.anthropicTokens(p)
	}
	if err != nil {
		s.fail(aw, err)
		return
	}
	var a countTokensAnswer
	a.InputTokens, a.ContextManagement.OriginalInputTokens = len(ids), len(ids)
	writeJSON(aw, http.StatusOK, a)
}

// streamMessages writes the event stream of one generation: the headers at
// once, message_start with the first output, a text delta per engine step
// (several steps when the client lags), then the closing events. A restart
// or shutdown mid-stream ends it with an error event; a client that goes
// away aborts the engine call.
func (s *Server) streamMessages(w http.ResponseWriter, r *http.Request, model string, g *gen, calls []*call, notify chan struct{}) {
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	if f, ok := w.(http.Flusher); ok {
		f.Flush() // vLLM's StreamingResponse sends the headers before the prefill
	}
	ms := &msgStream{st: respStream{w: w}}
	c := calls[0]
	var tokBuf []uint32
	sent, started, bytesOut := 0, false, 0
	for {
		sn := c.snap()
		if sn.aborted {
			ms.fail("request aborted: engine restarted")
			return
		}
		var err error
		if !started && (sn.generated > 0 || sn.done) {
			started = true
			err = ms.start(responseID(g), model, len(c.req.Prompt))
		}
		if err == nil && sn.generated > sent {
			tokBuf = c.req.OutputTokens(tokBuf[:0], sent, sn.generated)
			sent = sn.generated
			text := c.cut.clip(s.tok.Decode(tokBuf, true), bytesOut)
			bytesOut += len(text)
			err = ms.text(text)
		}
		if err != nil {
			s.abortAll(calls)
			return
		}
		if sn.done {
			ms.finish(sn.reason, cacheUsage(s.usage(calls)))
			return
		}
		if !s.nextStep(r, calls, notify, ms) {
			return
		}
	}
}

// nextStep waits for the engine's next step on calls; false (the calls
// aborted) when the client went away or the server closes (the stream
// then gets an error event).
func (s *Server) nextStep(r *http.Request, calls []*call, notify chan struct{}, ms *msgStream) bool {
	select {
	case <-notify:
		return true
	case <-r.Context().Done():
		s.abortAll(calls)
	case <-s.quit:
		s.abortAll(calls)
		ms.fail(ErrClosed.Error())
	}
	return false
}

// msgStream writes the events of one streamed message.
type msgStream struct {
	st   respStream
	open bool // the text block is started
}

// event writes one event (Messages events carry no sequence numbers).
func (m *msgStream) event(ev *messagesEvent) error {
	return m.st.send(ev.Type, ev, func(int) {})
}

// start writes message_start as vLLM builds it from the first chat chunk.
func (m *msgStream) start(id, model string, promptTokens int) error {
	return m.event(&messagesEvent{Type: "message_start", Message: &messageObject{ID: id, Content: []textBlock{},
		Model: model, Usage: messagesUsage{InputTokens: promptTokens}}})
}

// text writes a text delta, starting the text block first; an empty delta
// writes nothing (vLLM skips empty content).
func (m *msgStream) text(delta string) error {
	if delta == "" {
		return nil
	}
	zero := 0
	if !m.open {
		m.open = true
		if err := m.event(&messagesEvent{Type: "content_block_start", ContentBlock: &textBlock{Type: "text"}, Index: &zero}); err != nil {
			return err
		}
	}
	return m.event(&messagesEvent{Type: "content_block_delta", Delta: textDelta{Type: "text_delta", Text: delta}, Index: &zero})
}

// finish closes the text block and writes message_delta (stop reason and
// usage) and message_stop.
func (m *msgStream) finish(reason string, u messagesUsage) {
	zero := 0
	if m.open && m.event(&messagesEvent{Type: "content_block_stop", Index: &zero}) != nil {
		return
	}
	if reason == "" {
		reason = "stop" // vLLM's default when the chat stream gave none
	}
	if m.event(&messagesEvent{Type: "message_delta", Delta: stopDelta{StopReason: stopReason(reason)}, Usage: &u}) != nil {
		return
	}
	_ = m.event(&messagesEvent{Type: "message_stop"})
}

// fail ends the stream with an error event, as vLLM's converter does when
// the chat stream breaks.
func (m *msgStream) fail(msg string) {
	_ = m.event(&messagesEvent{Type: "error", Error: &anthropicError{Type: "internal_error", Message: msg}})
}

// anthropicErrors wraps a handler's ResponseWriter and rewrites an error
// answer (an OpenAI error body from s.fail, including those s.start
// writes) into Anthropic's {"type":"error","error":{"type","message"}}
// with the same status, as vLLM's translate_error_response does. Other
// answers pass through; finish must run when the handler returns.
type anthropicErrors struct {
	http.ResponseWriter
	status int    // the error status being rewritten, 0 when none
	body   []byte // its OpenAI body
	passed bool   // an answer went through unchanged
}

// WriteHeader holds back an error status.
func (a *anthropicErrors) WriteHeader(code int) {
	if code >= http.StatusBadRequest && !a.passed && a.status == 0 {
		a.status = code
		return
	}
	a.passed = true
	a.ResponseWriter.WriteHeader(code)
}

// Write collects an error body, or writes through.
func (a *anthropicErrors) Write(p []byte) (int, error) {
	if a.status != 0 {
		a.body = append(a.body, p...)
		return len(p), nil
	}
	a.passed = true
	return a.ResponseWriter.Write(p)
}

// Flush flushes what went through.
func (a *anthropicErrors) Flush() {
	if f, ok := a.ResponseWriter.(http.Flusher); ok && a.status == 0 {
		f.Flush()
	}
}

// Unwrap gives http.ResponseController the underlying writer.
func (a *anthropicErrors) Unwrap() http.ResponseWriter { return a.ResponseWriter }

// finish writes the held-back error in Anthropic's shape.
func (a *anthropicErrors) finish() {
	if a.status == 0 {
		return
	}
	e := anthropicError{Type: openai.TypeForStatus(a.status), Message: string(a.body)}
	if d, ok := openai.DecodeError(a.body); ok {
		e = anthropicError{Type: d.Type, Message: d.Message}
	}
	writeJSON(a.ResponseWriter, a.status, anthropicErrorBody{Type: "error", Error: e})
}
