package loadgen

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/loadtest/workload"
)

// Error kinds in Report.Errors.
const (
	KindConnect  = "connect"  // could not reach the server
	KindTimeout  = "timeout"  // Config.Timeout expired
	KindCanceled = "canceled" // the run was stopped
	KindStream   = "stream"   // malformed SSE or JSON from the server, or a stream that ended early
	// KindDisconnect: the connection was cut while the body was read
	// (io.ErrUnexpectedEOF, ECONNRESET): the server or a proxy died or
	// dropped it mid-answer.
	KindDisconnect = "disconnect"
	KindInStream   = "in_stream_error"
	KindUsage      = "usage" // a usage block that cannot be right: negative counts, more cached than prompt tokens
	// HTTP errors are "http_<status>", e.g. http_429.
)

// Result is one request's outcome, measured at the client.
type Result struct {
	ID      int
	Group   int
	Session string
	Sent    time.Duration // offset from the start of the run
	SendLag time.Duration // Sent minus the scheduled arrival (waiting for a concurrency slot)
	// TTFT is the time to the first event carrying generated output: text,
	// reasoning or a tool call (E2E for non-streaming requests; 0 when
	// NoOutput).
	TTFT   time.Duration
	E2E    time.Duration
	Status int
	// Sequences is the answers the request sampled (its n; 1 without):
	// OutputTokens counts all of them.
	Sequences int
	// ErrKind is "" on success, else one of the Kind* constants or "http_<status>".
	ErrKind string
	ErrMsg  string
	// NoOutput: the stream completed without any event carrying output (its
	// answer was empty, or in a form not recognised): TTFT is undefined and
	// left out of the report's TTFT distribution.
	NoOutput bool
	// Token counts from the response's usage (OutputTokens falls back to the number of
	// output chunks when the server sends no usage).
	PromptTokens, CachedTokens, OutputTokens int
	// Engine is the X-Kvmesh-Engine response header (kvmesh ingress), or "".
	Engine string
	// NonCanonicalSSE: the stream's framing was valid SSE but not the one
	// form vLLM writes (e.g. "data:" without its space, id: or event:
	// lines, multi-line data), read by the lenient reader
	// (openai.LenientSSEReader).
	NonCanonicalSSE bool
}

// EngineHeader is the response header naming the engine that served the request.
const EngineHeader = "X-Kvmesh-Engine"

// appendBody appends the JSON request body for r. Completions send token ids as the
// prompt; chat renders each token id as a word so the prefix is shared as text.
func appendBody(dst []byte, cfg *Config, r *workload.Request, scratch []uint32) ([]byte, []uint32) {
	scratch = r.AppendPrompt(scratch[:0])
	dst = append(dst, `{"model":`...)
	dst = openai.AppendString(dst, cfg.Model)
	switch cfg.Endpoint {
	case Chat, Messages:
		dst = append(dst, `,"messages":[{"role":"user","content":"`...)
		dst = appendWords(dst, scratch)
		dst = append(dst, `"}]`...)
	case Responses:
		dst = append(dst, `,"input":"`...)
		dst = appendWords(dst, scratch)
		dst = append(dst, '"')
	default:
		dst = append(dst, `,"prompt":`...)
		dst = openai.AppendTokenIDs(dst, scratch)
	}
	out := max(r.OutputTokens, 1)
	if cfg.Endpoint == Responses {
		dst = append(dst, `,"max_output_tokens":`...)
	} else {
		dst = append(dst, `,"max_tokens":`...)
	}
	dst = strconv.AppendInt(dst, int64(out), 10)
	if cfg.N > 1 {
		dst = append(dst, `,"n":`...)
		dst = strconv.AppendInt(dst, int64(cfg.N), 10)
	}
	if cfg.Endpoint == Messages {
		dst = append(dst, `,"temperature":0`...) // the Messages API has no min_tokens or ignore_eos
	} else {
		// ignore_eos + min_tokens make the engine produce exactly the workload's output length.
		dst = append(dst, `,"min_tokens":`...)
		dst = strconv.AppendInt(dst, int64(out), 10)
		dst = append(dst, `,"ignore_eos":true,"temperature":0`...)
	}
	switch {
	case cfg.NoStream:
	case cfg.Endpoint == Responses, cfg.Endpoint == Messages: // their streams always end with the usage
		dst = append(dst, `,"stream":true`...)
	default:
		dst = append(dst, `,"stream":true,"stream_options":{"include_usage":true}`...)
	}
	return append(dst, '}'), scratch
}

// appendWords renders token ids as words ("w<id>", space-separated), so a
// shared token prefix is a shared text prefix.
func appendWords(dst []byte, ids []uint32) []byte {
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ' ')
		}
		dst = append(dst, 'w')
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return dst
}

// chunk is the part of a completion, chat chunk or error event the client reads.
type chunk struct {
	Choices []struct {
		Text    string      `json:"text"`
		Delta   chatMessage `json:"delta"`
		Message chatMessage `json:"message"`
	} `json:"choices"`
	Usage *openai.Usage       `json:"usage"`
	Error *openai.ErrorDetail `json:"error"`
}

// chatMessage is a chat answer or delta's output: text, reasoning (vLLM's
// reasoning parsers write reasoning_content; some servers reasoning) and
// tool calls.
type chatMessage struct {
	Content          string          `json:"content"`
	ReasoningContent string          `json:"reasoning_content"`
	Reasoning        string          `json:"reasoning"`
	ToolCalls        json.RawMessage `json:"tool_calls"`
}

func (m *chatMessage) hasOutput() bool {
	return m.Content != "" || m.ReasoningContent != "" || m.Reasoning != "" || nonEmptyArray(m.ToolCalls)
}

// nonEmptyArray reports whether raw is a JSON array with an element.
func nonEmptyArray(raw json.RawMessage) bool {
	if len(raw) == 0 {
		return false
	}
	var xs []json.RawMessage
	return json.Unmarshal(raw, &xs) == nil && len(xs) > 0
}

// respChunk is the part of a Responses API event, answer or error the
// client reads: an event's type and text delta, the final event's response
// (with usage), a non-streamed answer's output and usage, an error event's
// message or an error body.
type respChunk struct {
	Type     string              `json:"type"`
	Delta    string              `json:"delta"`
	Message  string              `json:"message"`
	Response *respChunk          `json:"response"`
	Output   []respOutItem       `json:"output"`
	Usage    *respUsage          `json:"usage"`
	Error    *openai.ErrorDetail `json:"error"`
}

// hasOutput: a delta of any output (response.output_text.delta,
// response.reasoning_text.delta, response.function_call_arguments.delta,
// …), or a non-streamed answer's text, reasoning or function call.
func (c *respChunk) hasOutput() bool {
	if c.Delta != "" && strings.HasSuffix(c.Type, ".delta") {
		return true
	}
	for i := range c.Output {
		o := &c.Output[i]
		if o.Arguments != "" {
			return true
		}
		for _, p := range o.Content {
			if p.Text != "" {
				return true
			}
		}
		for _, p := range o.Summary {
			if p.Text != "" {
				return true
			}
		}
	}
	return false
}

type respOutItem struct {
	Content []struct {
		Text string `json:"text"`
	} `json:"content"`
	Summary []struct {
		Text string `json:"text"`
	} `json:"summary"`
	Arguments string `json:"arguments"`
}

type respUsage struct {
	InputTokens        int `json:"input_tokens"`
	OutputTokens       int `json:"output_tokens"`
	InputTokensDetails struct {
		CachedTokens int `json:"cached_tokens"`
	} `json:"input_tokens_details"`
}

// msgChunk is the part of a Messages API event, answer or error the client
// reads: a text delta, a non-streamed answer's content, the usage (of
// message_delta, or of message_start's message), an error.
type msgChunk struct {
	Type  string `json:"type"`
	Delta struct {
		Text        string `json:"text"`
		Thinking    string `json:"thinking"`
		PartialJSON string `json:"partial_json"`
	} `json:"delta"`
	ContentBlock *msgBlock  `json:"content_block"`
	Content      []msgBlock `json:"content"`
	Message      *msgChunk  `json:"message"`
	Usage        *struct {
		InputTokens          int `json:"input_tokens"`
		OutputTokens         int `json:"output_tokens"`
		CacheReadInputTokens int `json:"cache_read_input_tokens"`
	} `json:"usage"`
	Error *openai.ErrorDetail `json:"error"`
}

// msgBlock is a Messages API content block: text, thinking or a tool call.
type msgBlock struct {
	Type     string `json:"type"`
	Text     string `json:"text"`
	Thinking string `json:"thinking"`
}

func (b *msgBlock) hasOutput() bool {
	return b.Text != "" || b.Thinking != "" || b.Type == "tool_use"
}

// hasOutput: a text, thinking or tool input delta, a tool call's block
// starting, or a non-streamed answer's text, thinking or tool call.
func (c *msgChunk) hasOutput() bool {
	if c.Delta.Text != "" || c.Delta.Thinking != "" || c.Delta.PartialJSON != "" {
		return true
	}
	if c.ContentBlock != nil && c.ContentBlock.hasOutput() {
		return true
	}
	for i := range c.Content {
		if c.Content[i].hasOutput() {
			return true
		}
	}
	return false
}

func (c *chunk) hasOutput() bool {
	for i := range c.Choices {
		ch := &c.Choices[i]
		if ch.Text != "" || ch.Delta.hasOutput() || ch.Message.hasOutput() {
			return true
		}
	}
	return false
}

// do sends one request and fills res. start is the run's start time.
func (g *generator) do(ctx context.Context, url string, body []byte, r *workload.Request, res *Result) {
	ctx, cancel := context.WithTimeout(ctx, g.cfg.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, url, bytes.NewReader(body))
	if err != nil {
		res.ErrKind, res.ErrMsg = KindConnect, err.Error()
		return
	}
	req.Header.Set("Content-Type", "application/json")
	if g.cfg.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+g.cfg.APIKey)
	}
	if g.cfg.SessionHeader != "" && r.Session != "" {
		req.Header.Set(g.cfg.SessionHeader, r.Session)
	}
	for k, v := range g.cfg.Headers {
		req.Header.Set(k, v)
	}
	t0 := time.Now()
	resp, err := g.client.Do(req)
	if err != nil {
		res.ErrKind, res.ErrMsg = classify(ctx, err), err.Error()
		res.E2E = time.Since(t0)
		return
	}
	defer resp.Body.Close()
	res.Status = resp.StatusCode
	res.Engine = resp.Header.Get(EngineHeader)
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		res.ErrKind = "http_" + strconv.Itoa(resp.StatusCode)
		if d, ok := openai.DecodeError(b); ok {
			res.ErrMsg = d.Message
		} else {
			res.ErrMsg = string(bytes.TrimSpace(b[:min(len(b), 200)]))
		}
		res.E2E = time.Since(t0)
		return
	}
	readBody(ctx, resp.Body, !g.cfg.NoStream, g.cfg.Endpoint, g.cfg.StrictSSE, t0, res)
}

// readBody reads a 200 response (an SSE stream, or one JSON body when stream is false)
// into res: TTFT at the first event carrying output, usage, and an error kind when the body
// is malformed or carries an error event. A stream is read as the SSE standard
// allows (openai.LenientSSEReader), or only in vLLM's form when strict. It never
// panics on bad input.
func readBody(ctx context.Context, body io.Reader, stream bool, ep Endpoint, strict bool, t0 time.Time, res *Result) {
	var (
		c      chunk
		rc     respChunk
		mc     msgChunk
		chunks int
		err    error
	)
	output := func(has bool) {
		if has {
			if chunks == 0 {
				res.TTFT = time.Since(t0)
			}
			chunks++
		}
	}
	apply := func(payload []byte) error {
		c = chunk{}
		if err := json.Unmarshal(payload, &c); err != nil {
			return fmt.Errorf("%w: %w", openai.ErrBadStream, err)
		}
		if c.Error != nil {
			return &inStreamError{msg: c.Error.Message}
		}
		output(c.hasOutput())
		if c.Usage != nil {
			res.PromptTokens = c.Usage.PromptTokens
			res.CachedTokens = c.Usage.CachedTokens()
			res.OutputTokens = c.Usage.CompletionTokens
		}
		return nil
	}
	switch ep {
	case Messages:
		apply = func(payload []byte) error {
			mc = msgChunk{}
			if err := json.Unmarshal(payload, &mc); err != nil {
				return fmt.Errorf("%w: %w", openai.ErrBadStream, err)
			}
			if mc.Type == "error" || mc.Error != nil && mc.Error.Message != "" {
				msg := ""
				if mc.Error != nil {
					msg = mc.Error.Message
				}
				return &inStreamError{msg: msg}
			}
			output(mc.hasOutput())
			u := mc.Usage
			if mc.Message != nil && mc.Message.Usage != nil {
				u = mc.Message.Usage
			}
			if u != nil {
				// vLLM's input_tokens is the uncached part (cache_read_input_tokens the rest).
				res.PromptTokens, res.CachedTokens = u.InputTokens+u.CacheReadInputTokens, u.CacheReadInputTokens
				if u.OutputTokens > 0 {
					res.OutputTokens = u.OutputTokens
				}
			}
			return nil
		}
	case Responses:
		apply = func(payload []byte) error {
			rc = respChunk{}
			if err := json.Unmarshal(payload, &rc); err != nil {
				return fmt.Errorf("%w: %w", openai.ErrBadStream, err)
			}
			switch {
			case rc.Error != nil:
				return &inStreamError{msg: rc.Error.Message}
			case rc.Type == "error" || rc.Type == "response.failed":
				return &inStreamError{msg: rc.Message}
			}
			output(rc.hasOutput())
			u := rc.Usage
			if rc.Response != nil {
				u = rc.Response.Usage
			}
			if u != nil {
				res.PromptTokens, res.CachedTokens, res.OutputTokens = u.InputTokens, u.InputTokensDetails.CachedTokens, u.OutputTokens
			}
			return nil
		}
	}
	named := ep == Responses || ep == Messages // named events, no [DONE]
	switch {
	case stream && strict && named:
		err = openai.ReadAllResponses(body, apply)
	case stream && strict:
		err = openai.ReadAll(body, apply)
	case stream:
		res.NonCanonicalSSE, err = openai.ReadAllLenient(body, named, apply)
	default:
		b, rerr := io.ReadAll(io.LimitReader(body, 64<<20))
		if rerr == nil {
			rerr = apply(b)
		}
		err = rerr
		res.TTFT = time.Since(t0)
	}
	res.E2E = time.Since(t0)
	if res.OutputTokens == 0 {
		res.OutputTokens = chunks
	}
	if err != nil {
		var ise *inStreamError
		switch {
		case errors.As(err, &ise):
			res.ErrKind, res.ErrMsg = KindInStream, ise.msg
		case ctx.Err() != nil:
			res.ErrKind, res.ErrMsg = classify(ctx, err), err.Error()
		case disconnected(err):
			res.ErrKind, res.ErrMsg = KindDisconnect, err.Error()
		default:
			res.ErrKind, res.ErrMsg = KindStream, err.Error()
		}
	}
	if res.ErrKind == "" {
		if msg := badUsage(res); msg != "" {
			res.ErrKind, res.ErrMsg = KindUsage, msg
		}
	}
	res.NoOutput = res.ErrKind == "" && stream && chunks == 0
}

// badUsage says what is impossible in res's token counts (from the
// answer's usage), or "".
func badUsage(res *Result) string {
	switch {
	case res.PromptTokens < 0 || res.CachedTokens < 0 || res.OutputTokens < 0:
		return fmt.Sprintf("usage has a negative token count: %d prompt, %d cached, %d output", res.PromptTokens, res.CachedTokens, res.OutputTokens)
	case res.CachedTokens > res.PromptTokens:
		return fmt.Sprintf("usage has more cached tokens (%d) than prompt tokens (%d)", res.CachedTokens, res.PromptTokens)
	}
	return ""
}

type inStreamError struct{ msg string }

func (e *inStreamError) Error() string { return "error event in stream: " + e.msg }

// disconnected reports whether a body read failed because the connection
// was cut: a body shorter than its length or its chunked framing says
// (io.ErrUnexpectedEOF), or a reset.
func disconnected(err error) bool {
	return errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNABORTED)
}

// classify names a transport error.
func classify(ctx context.Context, err error) string {
	switch {
	case errors.Is(ctx.Err(), context.DeadlineExceeded) || errors.Is(err, context.DeadlineExceeded):
		return KindTimeout
	case errors.Is(ctx.Err(), context.Canceled) || errors.Is(err, context.Canceled):
		return KindCanceled
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return KindTimeout
	}
	return KindConnect
}
