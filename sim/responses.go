package sim

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
)

// The OpenAI Responses API as vLLM serves it without Harmony (vLLM's
// OpenAIServingResponses, vllm/entrypoints/openai/serving_responses.py):
//
//   - POST /v1/responses turns instructions and input items into chat
//     messages, renders them with the chat template exactly as
//     /v1/chat/completions does and generates through the same engine path;
//   - the response id is the request's request_id (vLLM's default
//     "resp_<uuid>"), which is also the engine request id;
//   - responses are kept only with store (default true) and the store
//     switched on (Config.ResponsesStore, vLLM's
//     VLLM_ENABLE_RESPONSES_API_STORE=1); otherwise store is silently false,
//     so previous_response_id, GET /v1/responses/{id} and cancel find nothing;
//   - a stream is "event: <type>\ndata: <json>" events numbered by
//     sequence_number, without a [DONE] sentinel.

// responsesStoreMax bounds the in-memory store: it keeps the newest 10,000
// responses and evicts the oldest (vLLM's store grows without bound).
const responsesStoreMax = 10000

// responsesAPI serves the Responses endpoints of one server.
type responsesAPI struct {
	s     *Server
	store *responseStore // nil unless Config.ResponsesStore
}

func newResponsesAPI(s *Server) *responsesAPI {
	a := &responsesAPI{s: s}
	if s.cfg.ResponsesStore {
		a.store = newResponseStore(responsesStoreMax)
	}
	return a
}

// The response object (OpenAI's Response, as vLLM's ResponsesResponse
// dumps it, plus OpenAI's "error").
type responseObject struct {
	ID                 string             `json:"id"`
	Object             string             `json:"object"`
	CreatedAt          int64              `json:"created_at"`
	Status             string             `json:"status"`
	Background         bool               `json:"background"`
	Error              json.RawMessage    `json:"error"` // always null: failures end the request instead
	IncompleteDetails  *incompleteDetails `json:"incomplete_details"`
	Instructions       *string            `json:"instructions"`
	MaxOutputTokens    int                `json:"max_output_tokens"`
	MaxToolCalls       *int               `json:"max_tool_calls"`
	Metadata           json.RawMessage    `json:"metadata"`
	Model              string             `json:"model"`
	Output             []outputMessage    `json:"output"`
	ParallelToolCalls  bool               `json:"parallel_tool_calls"`
	PreviousResponseID *string            `json:"previous_response_id"`
	Prompt             json.RawMessage    `json:"prompt"`
	Reasoning          json.RawMessage    `json:"reasoning"`
	ServiceTier        string             `json:"service_tier"`
	Temperature        float64            `json:"temperature"`
	Text               json.RawMessage    `json:"text"`
	ToolChoice         json.RawMessage    `json:"tool_choice"`
	Tools              json.RawMessage    `json:"tools"`
	TopLogprobs        *int               `json:"top_logprobs"`
	TopP               float64            `json:"top_p"`
	Truncation         string             `json:"truncation"`
	Usage              *responseUsage     `json:"usage"`
	User               *string            `json:"user"`
}

type incompleteDetails struct {
	Reason string `json:"reason"`
}

type outputMessage struct {
	ID      string       `json:"id"`
	Type    string       `json:"type"`
	Role    string       `json:"role"`
	Status  string       `json:"status"`
	Content []outputText `json:"content"`
}

type outputText struct {
	Type        string          `json:"type"`
	Text        string          `json:"text"`
	Annotations json.RawMessage `json:"annotations"`
	Logprobs    json.RawMessage `json:"logprobs"` // null, or [] in content_part.added (as vLLM)
}

type responseUsage struct {
	InputTokens         int                 `json:"input_tokens"`
	InputTokensDetails  inputTokensDetails  `json:"input_tokens_details"`
	OutputTokens        int                 `json:"output_tokens"`
	OutputTokensDetails outputTokensDetails `json:"output_tokens_details"`
	TotalTokens         int                 `json:"total_tokens"`
}

type inputTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

type outputTokensDetails struct {
	ReasoningTokens int `json:"reasoning_tokens"`
}

var (
	jsonEmptyList = json.RawMessage("[]")
	jsonAuto      = json.RawMessage(`"auto"`)
)

// newResponse is the response object for req before any output (status
// in_progress), with the fields vLLM echoes from the request.
func newResponse(req *responsesRequest, id string, created int64, maxTokens int) *responseObject {
	o := &responseObject{ID: id, Object: "response", CreatedAt: created, Status: "in_progress",
		Instructions: req.Instructions, MaxOutputTokens: maxTokens, MaxToolCalls: req.MaxToolCalls,
		Metadata: req.Metadata, Model: req.Model, Output: []outputMessage{}, ParallelToolCalls: true,
		PreviousResponseID: req.PreviousResponseID, Reasoning: req.Reasoning, ServiceTier: "auto",
		Temperature: 1, Text: req.Text, ToolChoice: jsonAuto, Tools: jsonEmptyList, TopP: 1,
		Truncation: "disabled", User: req.User}
	if req.ParallelToolCalls != nil {
		o.ParallelToolCalls = *req.ParallelToolCalls
	}
	if req.ServiceTier != nil {
		o.ServiceTier = *req.ServiceTier
	}
	if req.Temperature != nil {
		o.Temperature = *req.Temperature
	}
	if req.TopP != nil {
		o.TopP = *req.TopP
	}
	if !isJSONNull(req.ToolChoice) {
		o.ToolChoice = req.ToolChoice
	}
	if !isJSONNull(req.Tools) {
		o.Tools = req.Tools
	}
	if req.Truncation != nil {
		o.Truncation = *req.Truncation
	}
	return o
}

// finished returns a copy of o with the output and final status.
func (o *responseObject) finished(itemID, text, reason string, u *openai.Usage) *responseObject {
	f := *o
	f.Status = "completed"
	if reason == "length" {
		f.Status, f.IncompleteDetails = "incomplete", &incompleteDetails{Reason: "max_output_tokens"}
	}
	item := outputMessage{ID: itemID, Type: "message", Role: "assistant", Status: "completed", Content: []outputText{}}
	if text != "" { // vLLM leaves an empty generation without a text part
		item.Content = append(item.Content, outputText{Type: "output_text", Text: text, Annotations: jsonEmptyList})
	}
	f.Output = []outputMessage{item}
	f.Usage = &responseUsage{InputTokens: u.PromptTokens, OutputTokens: u.CompletionTokens, TotalTokens: u.TotalTokens,
		InputTokensDetails: inputTokensDetails{CachedTokens: u.CachedTokens()}}
	return &f
}

// outputText is the text of o's output messages, as the OpenAI client's
// output_text helper concatenates it.
func (o *responseObject) outputText() string {
	var b strings.Builder
	for _, it := range o.Output {
		for _, c := range it.Content {
			if c.Type == "output_text" {
				b.WriteString(c.Text)
			}
		}
	}
	return b.String()
}

// newRespID returns prefix followed by 32 random hex digits (vLLM's
// random_uuid()).
func newRespID(prefix string) string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// responseStore keeps stored responses and the messages they were
// generated from, bounded to the newest max responses (the oldest is
// evicted first). Safe for concurrent use.
type responseStore struct {
	mu   sync.Mutex
	byID map[string]*storedResponse
	ring []string // ids in insertion order, oldest at head
	head int
	n    int
}

type storedResponse struct {
	resp *responseObject // never modified once stored
	msgs []respMessage   // the input messages the response was generated from
}

func newResponseStore(max int) *responseStore {
	return &responseStore{byID: make(map[string]*storedResponse), ring: make([]string, max)}
}

// put stores a response under its id; a response stored again under the
// same id replaces the old one in place.
func (st *responseStore) put(r *storedResponse) {
	if st == nil {
		return
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	id := r.resp.ID
	if _, ok := st.byID[id]; ok {
		st.byID[id] = r
		return
	}
	if st.n == len(st.ring) {
		delete(st.byID, st.ring[st.head])
		st.ring[st.head] = id
		st.head = (st.head + 1) % len(st.ring)
	} else {
		st.ring[(st.head+st.n)%len(st.ring)] = id
		st.n++
	}
	st.byID[id] = r
}

func (st *responseStore) get(id string) *storedResponse {
	if st == nil {
		return nil
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.byID[id]
}

// writeRespNotFound is vLLM's answer for an unknown response id.
func writeRespNotFound(w http.ResponseWriter, id string) {
	writeRespError(w, http.StatusNotFound, fmt.Sprintf("Response with id '%s' not found.", id))
}

// writeRespError writes an error of type invalid_request_error with the
// status as code, as vLLM's Responses errors are.
func writeRespError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(openai.AppendError(nil, msg, openai.TypeInvalidRequest, "", fmt.Sprint(status)))
}

// create is POST /v1/responses.
func (a *responsesAPI) create(w http.ResponseWriter, r *http.Request) {
	s := a.s
	created := time.Now().Unix()
	req, err := readRequest(s, w, r, decodeResponsesRequest)
	if err != nil {
		s.fail(w, err)
		return
	}
	lora, err := s.resolveModel(&req.Model)
	if err != nil {
		s.fail(w, err)
		return
	}
	store := (req.Store == nil || *req.Store) && a.store != nil // vLLM silently drops store without its store
	if isTrue(req.Background) {
		if a.store == nil {
			writeRespError(w, http.StatusBadRequest, "This vLLM engine does not support `store=True` and therefore does not support "+
				"the background mode. To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` "+
				"when launching the vLLM server.")
		} else {
			writeRespError(w, http.StatusBadRequest, "background mode is not supported by the simulator")
		}
		return
	}
	var msgs []respMessage
	if req.Instructions != nil && *req.Instructions != "" {
		msgs = append(msgs, textMessage("system", *req.Instructions))
	}
	if req.PreviousResponseID != nil {
		prev := a.store.get(*req.PreviousResponseID)
		if prev == nil {
			writeRespNotFound(w, *req.PreviousResponseID)
			return
		}
		msgs = append(msgs, prev.msgs...)
		for _, it := range prev.resp.Output {
			for _, c := range it.Content {
				msgs = append(msgs, textMessage("assistant", c.Text))
			}
		}
	}
	msgs = append(msgs, req.input...)
	if len(msgs) == 0 {
		s.fail(w, badRequest("input: has no messages"))
		return
	}
	prompt, err := a.render(req, msgs)
	if err != nil {
		s.fail(w, err)
		return
	}
	if n, maxLen := len(prompt), s.cfg.Engine.MaxModelLen; n >= maxLen {
		writeRespError(w, http.StatusBadRequest, fmt.Sprintf("The engine prompt length %d exceeds the max_model_len %d. Please reduce prompt.", n, maxLen))
		return
	}
	// vLLM caps max_output_tokens at what the context has left; without it
	// the simulator uses the chat default.
	room := s.cfg.Engine.MaxModelLen - len(prompt)
	maxTokens := min(s.cfg.DefaultChatMaxTokens, room)
	if req.MaxOutputTokens != nil {
		maxTokens = min(*req.MaxOutputTokens, room)
	}
	id := newRespID("resp_")
	if req.RequestID != nil {
		id = *req.RequestID
	}
	g := &gen{id: id, prompts: [][]uint32{prompt}, maxTokens: maxTokens, ignoreEOS: req.IgnoreEOS, lora: lora,
		stream: bool(req.Stream), chat: true}
	if req.CacheSalt != nil {
		g.salt = *req.CacheSalt
	}
	_, calls, notify, ok := s.start(w, r, g)
	if !ok {
		return
	}
	resp := newResponse(req, id, created, maxTokens)
	var keep func(*responseObject)
	if store {
		keep = func(o *responseObject) { a.store.put(&storedResponse{resp: o, msgs: msgs}) }
	}
	if g.stream {
		a.stream(w, r, resp, calls, notify, keep)
		return
	}
	if err := s.waitAll(r, calls, notify); err != nil {
		if errors.Is(err, ErrClosed) {
			s.fail(w, err) // the client is still there: tell it the engine went away
		}
		return
	}
	c := calls[0]
	sn := c.snap()
	text := s.tok.Decode(c.req.OutputTokens(nil, 0, sn.generated), true)
	final := resp.finished(newRespID("msg_"), text, sn.reason, s.usage(calls))
	if keep != nil {
		keep(final)
	}
	writeJSON(w, http.StatusOK, final)
}

// render renders msgs with the chat template as /v1/chat/completions does
// and tokenizes the prompt.
func (a *responsesAPI) render(req *responsesRequest, msgs []respMessage) ([]uint32, error) {
	s := a.s
	chat := make([]openai.ChatMessage, len(msgs))
	for i := range msgs {
		chat[i] = msgs[i].chatMessage()
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		return nil, badRequest("input: %v", err)
	}
	ids, err := s.chatTokens(&openai.ChatRequest{Model: req.Model, Messages: chat, RawMessages: raw, Tools: req.chatTools}, false)
	if err != nil {
		return nil, badRequest("render chat template: %v", err)
	}
	return ids, nil
}

// Stream events. Each event is written as "event: <type>\ndata: <json>\n\n"
// with sequence numbers from 0.
type respEvent struct {
	Type           string          `json:"type"`
	SequenceNumber int             `json:"sequence_number"`
	Response       *responseObject `json:"response,omitempty"`
	OutputIndex    *int            `json:"output_index,omitempty"`
	ContentIndex   *int            `json:"content_index,omitempty"`
	ItemID         string          `json:"item_id,omitempty"`
	Item           *outputMessage  `json:"item,omitempty"`
	Part           *outputText     `json:"part,omitempty"`
	Delta          *string         `json:"delta,omitempty"`
	Text           *string         `json:"text,omitempty"`
	Logprobs       json.RawMessage `json:"logprobs,omitempty"`
}

// respErrorEvent ends a stream that fails after it started (OpenAI's
// ResponseErrorEvent).
type respErrorEvent struct {
	Type           string  `json:"type"`
	Code           string  `json:"code"`
	Message        string  `json:"message"`
	Param          *string `json:"param"`
	SequenceNumber int     `json:"sequence_number"`
}

type respStream struct {
	w   http.ResponseWriter
	seq int
	buf []byte
}

func (st *respStream) send(typ string, v any, setSeq func(int)) error {
	setSeq(st.seq)
	st.seq++
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	st.buf = append(st.buf[:0], "event: "...)
	st.buf = append(st.buf, typ...)
	st.buf = append(st.buf, "\ndata: "...)
	st.buf = append(st.buf, p...)
	st.buf = append(st.buf, '\n', '\n')
	if _, err := st.w.Write(st.buf); err != nil {
		return err
	}
	if f, ok := st.w.(http.Flusher); ok {
		f.Flush()
	}
	return nil
}

func (st *respStream) event(ev *respEvent) error {
	return st.send(ev.Type, ev, func(n int) { ev.SequenceNumber = n })
}

func (st *respStream) fail(status int, msg string) {
	ev := &respErrorEvent{Type: "error", Code: openai.TypeForStatus(status), Message: msg}
	_ = st.send("error", ev, func(n int) { ev.SequenceNumber = n })
}

// stream writes the event stream: response.created and
// response.in_progress at once (before the prefill, as vLLM), the output
// item and content part when the first text arrives, one
// response.output_text.delta per engine step (several steps when the
// client lags), the closing events, then response.completed with the whole
// response. A restart or shutdown mid-stream ends it with an error event;
// a client that goes away aborts the engine call.
func (a *responsesAPI) stream(w http.ResponseWriter, r *http.Request, resp *responseObject, calls []*call, notify chan struct{}, keep func(*responseObject)) {
	s := a.s
	openai.SetHeaders(w.Header())
	w.WriteHeader(http.StatusOK)
	st := &respStream{w: w}
	zero := 0
	if st.event(&respEvent{Type: "response.created", Response: resp}) != nil ||
		st.event(&respEvent{Type: "response.in_progress", Response: resp}) != nil {
		s.abortAll(calls)
		return
	}
	c := calls[0]
	itemID := newRespID("msg_")
	var text strings.Builder
	var tokBuf []uint32
	sent, started := 0, false
	var reason string
	for {
		sn := c.snap()
		if sn.aborted {
			st.fail(http.StatusServiceUnavailable, "request aborted: engine restarted")
			return
		}
		if sn.generated > sent {
			tokBuf = c.req.OutputTokens(tokBuf[:0], sent, sn.generated)
			delta := s.tok.Decode(tokBuf, true)
			sent = sn.generated
			if delta != "" { // vLLM skips empty deltas
				var err error
				if !started {
					started = true
					err = st.event(&respEvent{Type: "response.output_item.added", OutputIndex: &zero,
						Item: &outputMessage{ID: itemID, Type: "message", Role: "assistant", Status: "in_progress", Content: []outputText{}}})
					if err == nil {
						err = st.event(&respEvent{Type: "response.content_part.added", OutputIndex: &zero, ContentIndex: &zero, ItemID: itemID,
							Part: &outputText{Type: "output_text", Text: "", Annotations: jsonEmptyList, Logprobs: jsonEmptyList}})
					}
				}
				if err == nil {
					err = st.event(&respEvent{Type: "response.output_text.delta", OutputIndex: &zero, ContentIndex: &zero, ItemID: itemID,
						Delta: &delta, Logprobs: jsonEmptyList})
				}
				if err != nil {
					s.abortAll(calls)
					return
				}
				text.WriteString(delta)
			}
		}
		if sn.done {
			reason = sn.reason
			break
		}
		select {
		case <-notify:
		case <-r.Context().Done():
			s.abortAll(calls)
			return
		case <-s.quit:
			s.abortAll(calls)
			st.fail(http.StatusServiceUnavailable, ErrClosed.Error())
			return
		}
	}
	full := text.String()
	final := resp.finished(itemID, full, reason, s.usage(calls))
	if started {
		part := final.Output[0].Content[0]
		item := final.Output[0]
		if st.event(&respEvent{Type: "response.output_text.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: itemID,
			Text: &full, Logprobs: jsonEmptyList}) != nil ||
			st.event(&respEvent{Type: "response.content_part.done", OutputIndex: &zero, ContentIndex: &zero, ItemID: itemID, Part: &part}) != nil ||
			st.event(&respEvent{Type: "response.output_item.done", OutputIndex: &zero, Item: &item}) != nil {
			return
		}
	}
	if keep != nil {
		keep(final)
	}
	_ = st.event(&respEvent{Type: "response.completed", Response: final})
}

// stored returns the stored response the path's {id} names, or answers
// vLLM's 404 and returns nil.
func (a *responsesAPI) stored(w http.ResponseWriter, r *http.Request) *storedResponse {
	id := r.PathValue("id")
	sr := a.store.get(id)
	if sr == nil {
		writeRespNotFound(w, id)
	}
	return sr
}

// get is GET /v1/responses/{id}.
func (a *responsesAPI) get(w http.ResponseWriter, r *http.Request) {
	if sr := a.stored(w, r); sr != nil {
		writeJSON(w, http.StatusOK, sr.resp)
	}
}

// cancel is POST /v1/responses/{id}/cancel: only background responses
// still queued or in progress can be cancelled, and the simulator runs none.
func (a *responsesAPI) cancel(w http.ResponseWriter, r *http.Request) {
	sr := a.stored(w, r)
	if sr == nil {
		return
	}
	if sr.resp.Status != "queued" && sr.resp.Status != "in_progress" {
		writeRespError(w, http.StatusBadRequest, "Cannot cancel a synchronous response.")
		return
	}
	writeJSON(w, http.StatusOK, sr.resp)
}
