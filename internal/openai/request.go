package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"reflect"
	"slices"
	"strings"
)

// StreamOptions is the OpenAI stream_options object.
type StreamOptions struct {
	IncludeUsage bool `json:"include_usage"`
	// ContinuousUsageStats is vLLM's extra: usage on every chunk.
	ContinuousUsageStats bool `json:"continuous_usage_stats,omitempty"`
}

// Stop is "stop": a string or a list of strings.
type Stop []string

// UnmarshalJSON accepts a string, a list of strings or null.
func (s *Stop) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	if bytes.Equal(b, []byte("null")) {
		*s = nil
		return nil
	}
	if len(b) > 0 && b[0] == '"' {
		var one string
		if err := json.Unmarshal(b, &one); err != nil {
			return fmt.Errorf("%w: stop: %v", ErrBadRequest, err)
		}
		*s = Stop{one}
		return nil
	}
	var many []string
	if err := json.Unmarshal(b, &many); err != nil {
		return fmt.Errorf("%w: stop: want a string or a list of strings", ErrBadRequest)
	}
	*s = many
	return nil
}

// Bool is a boolean field read as vLLM's pydantic models read one (lax
// mode): true and false, the numbers 0 and 1 (0.0, 1.0), and a string that
// is, in lower case, one of "1" "on" "t" "true" "y" "yes" or "0" "off" "f"
// "false" "n" "no"; null leaves it false. It encodes as a JSON boolean.
type Bool bool

// UnmarshalJSON implements json.Unmarshaler.
func (b *Bool) UnmarshalJSON(data []byte) error {
	var v any
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	switch x := v.(type) {
	case nil:
		return nil
	case bool:
		*b = Bool(x)
		return nil
	case float64:
		if x == 0 || x == 1 {
			*b = x == 1
			return nil
		}
	case string:
		switch strings.ToLower(x) {
		case "1", "on", "t", "true", "y", "yes":
			*b = true
			return nil
		case "0", "off", "f", "false", "n", "no":
			*b = false
			return nil
		}
	}
	kind := "number"
	switch data[0] {
	case '"':
		kind = "string"
	case '[':
		kind = "array"
	case '{':
		kind = "object"
	}
	return &json.UnmarshalTypeError{Value: kind, Type: reflect.TypeFor[bool]()}
}

// SamplingParams are the generation fields completions and chat share
// (OpenAI's plus vLLM's extras).
type SamplingParams struct {
	MaxTokens     *int           `json:"max_tokens,omitempty"`
	MinTokens     int            `json:"min_tokens,omitempty"`
	IgnoreEOS     bool           `json:"ignore_eos,omitempty"`
	Temperature   *float64       `json:"temperature,omitempty"`
	TopP          *float64       `json:"top_p,omitempty"`
	TopK          *int           `json:"top_k,omitempty"`
	Seed          *int64         `json:"seed,omitempty"`
	N             *int           `json:"n,omitempty"`
	Stop          Stop           `json:"stop,omitempty"`
	Stream        Bool           `json:"stream,omitempty"`
	StreamOptions *StreamOptions `json:"stream_options,omitempty"`
	User          string         `json:"user,omitempty"`
	// CacheSalt (vLLM) isolates the request's prefix cache from other salts.
	CacheSalt string `json:"cache_salt,omitempty"`
	// ReturnTokenIDs (vLLM) adds prompt_token_ids/token_ids to choices.
	ReturnTokenIDs bool `json:"return_token_ids,omitempty"`
	// Priority (vLLM) for the priority scheduling policy.
	Priority int `json:"priority,omitempty"`
	// IncludeStopStrInOutput (vLLM) keeps the stop string that ended the
	// output in its text.
	IncludeStopStrInOutput bool `json:"include_stop_str_in_output,omitempty"`
	// TruncatePromptTokens (vLLM) keeps the prompt's last k tokens (-1:
	// the model's context length).
	TruncatePromptTokens *int `json:"truncate_prompt_tokens,omitempty"`
	// StopTokenIDs (vLLM) end the output at the first generated token
	// among them, from min_tokens on (stop_reason is that token's id).
	StopTokenIDs []int64 `json:"stop_token_ids,omitempty"`
}

// MaxN bounds n: vLLM sets none (its scheduler's max_num_seqs bounds how
// many run at once), the simulator allocates a call per sequence.
const MaxN = 256

// Samples is n: the sequences to sample from each prompt (1 when unset).
func (s *SamplingParams) Samples() int {
	if s.N == nil {
		return 1
	}
	return *s.N
}

// Greedy reports an explicit temperature 0: every sample is the same.
func (s *SamplingParams) Greedy() bool { return s.Temperature != nil && *s.Temperature == 0 }

// IncludeUsage reports whether a stream must end with a usage chunk.
func (s *SamplingParams) IncludeUsage() bool {
	return s.StreamOptions != nil && s.StreamOptions.IncludeUsage
}

// ContinuousUsage reports whether every chunk of a stream carries usage
// (vLLM: continuous_usage_stats, with include_usage).
func (s *SamplingParams) ContinuousUsage() bool {
	return s.IncludeUsage() && s.StreamOptions.ContinuousUsageStats
}

// validate lists the sampling problems common to both endpoints.
func (s *SamplingParams) validate() []string {
	var p []string
	if s.MaxTokens != nil && *s.MaxTokens < 1 {
		p = append(p, fmt.Sprintf("max_tokens %d: must be at least 1", *s.MaxTokens))
	}
	if s.MinTokens < 0 {
		p = append(p, fmt.Sprintf("min_tokens %d: must not be negative", s.MinTokens))
	}
	if s.MaxTokens != nil && s.MinTokens > *s.MaxTokens {
		p = append(p, fmt.Sprintf("min_tokens %d: must not exceed max_tokens %d", s.MinTokens, *s.MaxTokens))
	}
	if s.N != nil && *s.N < 1 {
		p = append(p, fmt.Sprintf("n %d: must be at least 1", *s.N)) // vLLM's SamplingParams check
	} else if s.N != nil && *s.N > MaxN {
		p = append(p, fmt.Sprintf("n %d: the simulator samples at most %d sequences per prompt", *s.N, MaxN))
	}
	if s.Temperature != nil && *s.Temperature < 0 {
		p = append(p, "temperature: must not be negative") // vLLM accepts any t >= 0
	}
	if s.TruncatePromptTokens != nil && *s.TruncatePromptTokens < -1 {
		p = append(p, fmt.Sprintf("truncate_prompt_tokens %d: must be at least -1", *s.TruncatePromptTokens)) // vLLM's field bound
	}
	if slices.Contains(s.Stop, "") {
		p = append(p, "stop cannot contain an empty string") // vLLM's SamplingParams check
	}
	if s.StreamOptions != nil && !s.Stream {
		p = append(p, "stream_options: only allowed when stream is true")
	}
	return p
}

// CompletionRequest is POST /v1/completions.
type CompletionRequest struct {
	Model  string `json:"model"`
	Prompt Prompt `json:"prompt"`
	SamplingParams
	Echo     bool `json:"echo,omitempty"`
	Logprobs *int `json:"logprobs,omitempty"`
	// MaxTokensNull: the body's (last) max_tokens is null. vLLM's
	// completions default is 16 tokens when max_tokens is absent but the
	// model's context when it is null; set by DecodeCompletionRequest.
	MaxTokensNull bool `json:"-"`
	// LoRA adapters are selected by model name in vLLM; kept for routers.
}

// ChatRequest is POST /v1/chat/completions.
type ChatRequest struct {
	Model    string        `json:"model"`
	Messages []ChatMessage `json:"messages"`
	SamplingParams
	// MaxCompletionTokens is OpenAI's newer name for max_tokens; it wins when both are set.
	MaxCompletionTokens *int `json:"max_completion_tokens,omitempty"`
	// vLLM chat-template extras.
	AddGenerationPrompt  *bool           `json:"add_generation_prompt,omitempty"`
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	// Logprobs asks for each output token's log probability and, with
	// TopLogprobs, that many alternatives (vLLM requires logprobs true
	// whenever top_logprobs is given).
	Logprobs    bool `json:"logprobs,omitempty"`
	TopLogprobs *int `json:"top_logprobs,omitempty"`
	// Tools and Documents are passed to the chat template as sent.
	Tools     json.RawMessage `json:"tools,omitempty"`
	Documents json.RawMessage `json:"documents,omitempty"`
	// RawMessages is the messages array as sent (tool calls, content parts
	// and all), for rendering the whole request; set by DecodeChatRequest.
	RawMessages json.RawMessage `json:"-"`
}

// MaxOutput is the request's output cap: max_completion_tokens, else max_tokens, else 0 (unset).
func (r *ChatRequest) MaxOutput() int {
	if r.MaxCompletionTokens != nil {
		return *r.MaxCompletionTokens
	}
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return 0
}

// MaxOutput is the request's max_tokens, 0 when unset.
func (r *CompletionRequest) MaxOutput() int {
	if r.MaxTokens != nil {
		return *r.MaxTokens
	}
	return 0
}

// ChatMessage is one chat message. Content may be a string or a list of
// content parts; only text parts are kept in Content.Text (concatenated).
type ChatMessage struct {
	Role    string  `json:"role"`
	Content Content `json:"content"`
	Name    string  `json:"name,omitempty"`
}

// ContentPart is one element of a list-form message content.
type ContentPart struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`
}

// Content is a message's content: a string (Parts nil) or a list of parts
// (Text is then the concatenation of the text parts).
type Content struct {
	Text  string
	Parts []ContentPart
	Null  bool // JSON null (assistant messages with tool calls)
}

// UnmarshalJSON accepts a string, a list of parts or null.
func (c *Content) UnmarshalJSON(b []byte) error {
	*c = Content{}
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		c.Null = true
		return nil
	case len(b) > 0 && b[0] == '"':
		if err := json.Unmarshal(b, &c.Text); err != nil {
			return fmt.Errorf("%w: content: %v", ErrBadRequest, err)
		}
		return nil
	case len(b) > 0 && b[0] == '[':
		if err := json.Unmarshal(b, &c.Parts); err != nil {
			return fmt.Errorf("%w: content: want a string or a list of parts", ErrBadRequest)
		}
		for _, p := range c.Parts {
			if p.Type == "text" {
				c.Text += p.Text
			}
		}
		return nil
	}
	return fmt.Errorf("%w: content: want a string or a list of parts", ErrBadRequest)
}

// MarshalJSON writes the content in its original shape.
func (c Content) MarshalJSON() ([]byte, error) {
	switch {
	case c.Null:
		return []byte("null"), nil
	case c.Parts != nil:
		return json.Marshal(c.Parts)
	}
	return AppendString(nil, c.Text), nil
}

// DecodeCompletionRequest decodes and validates a completions body.
func DecodeCompletionRequest(body []byte) (*CompletionRequest, error) {
	var r CompletionRequest
	if err := decodeStrictJSON(body, &r); err != nil {
		return nil, err
	}
	if r.MaxTokens == nil {
		var mt struct {
			MaxTokens json.RawMessage `json:"max_tokens"`
		}
		r.MaxTokensNull = json.Unmarshal(body, &mt) == nil && string(mt.MaxTokens) == "null"
	}
	var problems []string
	if r.Prompt.Len() == 0 {
		problems = append(problems, "prompt: required")
	}
	if r.Logprobs != nil {
		problems = append(problems, logprobsProblems("logprobs", *r.Logprobs)...)
	}
	problems = append(problems, r.validate()...)
	return &r, joinProblems(problems)
}

// MaxLogprobs is the most alternatives a request may ask for per token
// (vLLM's --max-logprobs default).
const MaxLogprobs = 20

// logprobsProblems checks a requested number of alternatives per token.
func logprobsProblems(field string, n int) []string {
	switch {
	case n < 0:
		return []string{fmt.Sprintf("%s %d: must not be negative", field, n)}
	case n > MaxLogprobs:
		return []string{fmt.Sprintf("%s %d: at most %d (the engine's max_logprobs)", field, n, MaxLogprobs)}
	}
	return nil
}

// DecodeChatRequest decodes and validates a chat completions body.
func DecodeChatRequest(body []byte) (*ChatRequest, error) {
	var r ChatRequest
	if err := decodeStrictJSON(body, &r); err != nil {
		return nil, err
	}
	var raw struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &raw); err == nil {
		r.RawMessages = raw.Messages
	}
	var problems []string
	if len(r.Messages) == 0 {
		problems = append(problems, "messages: required")
	}
	for i, m := range r.Messages {
		// Any role is taken, as vLLM takes it (its
		// CustomChatCompletionMessageParam: the chat template decides
		// what a role means, and may refuse it); only a message with none
		// is refused.
		if m.Role == "" {
			problems = append(problems, fmt.Sprintf("messages[%d].role: required", i))
		}
	}
	if r.MaxCompletionTokens != nil && *r.MaxCompletionTokens < 1 {
		problems = append(problems, "max_completion_tokens: must be at least 1")
	}
	if r.TopLogprobs != nil {
		problems = append(problems, logprobsProblems("top_logprobs", *r.TopLogprobs)...)
		if !r.Logprobs {
			problems = append(problems, "top_logprobs: logprobs must be true when top_logprobs is given")
		}
	}
	problems = append(problems, r.validate()...)
	return &r, joinProblems(problems)
}

// decodeStrictJSON decodes one JSON object; unknown fields are ignored (as
// vLLM does by default) but trailing data is not.
func decodeStrictJSON(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, ErrBadRequest) {
			return fmt.Errorf("decode body: %w", err)
		}
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) { // its text names Go types and struct fields
			return fmt.Errorf("decode body: %w: %s: expected %s, got %s", ErrBadRequest, te.Field, JSONKind(te.Type), te.Value)
		}
		return fmt.Errorf("decode body: %w: %v", ErrBadRequest, err)
	}
	if TrailingData(dec) {
		return fmt.Errorf("decode body: %w: trailing data after the JSON object", ErrBadRequest)
	}
	return nil
}

// TrailingData reports whether anything but white space follows the value
// dec decoded last. dec.More is not that: it is false before a stray '}' or
// ']', so `{...}}` would pass.
func TrailingData(dec *json.Decoder) bool {
	_, err := dec.Token()
	return err != io.EOF
}

// JSONKind names the JSON type a Go type is decoded from ("a string", "an
// array", …), for errors that name JSON fields, never Go types.
func JSONKind(t reflect.Type) string {
	if t == nil {
		return "a value"
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	}
	return "a value"
}

func joinProblems(p []string) error {
	if len(p) == 0 {
		return nil
	}
	msg := p[0]
	for _, s := range p[1:] {
		msg += "; " + s
	}
	return fmt.Errorf("%w: %s", ErrBadRequest, msg)
}

// TokenizeRequest is vLLM's POST /tokenize: either a prompt or messages.
type TokenizeRequest struct {
	Model               string        `json:"model,omitempty"`
	Prompt              string        `json:"prompt,omitempty"`
	Messages            []ChatMessage `json:"messages,omitempty"`
	AddSpecialTokens    *bool         `json:"add_special_tokens,omitempty"`
	AddGenerationPrompt *bool         `json:"add_generation_prompt,omitempty"`
	ReturnTokenStrs     bool          `json:"return_token_strs,omitempty"`
	// The chat request's other template inputs, as in ChatRequest.
	ContinueFinalMessage bool            `json:"continue_final_message,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	Documents            json.RawMessage `json:"documents,omitempty"`
	RawMessages          json.RawMessage `json:"-"`
}

// Chat is the chat request whose prompt a /tokenize with messages asks for.
func (r *TokenizeRequest) Chat() *ChatRequest {
	return &ChatRequest{Model: r.Model, Messages: r.Messages, AddGenerationPrompt: r.AddGenerationPrompt,
		ContinueFinalMessage: r.ContinueFinalMessage, ChatTemplateKwargs: r.ChatTemplateKwargs, Tools: r.Tools,
		Documents: r.Documents, RawMessages: r.RawMessages}
}

// DecodeTokenizeRequest decodes and validates a /tokenize body.
func DecodeTokenizeRequest(body []byte) (*TokenizeRequest, error) {
	var r TokenizeRequest
	if err := decodeStrictJSON(body, &r); err != nil {
		return nil, err
	}
	if r.Prompt == "" && len(r.Messages) == 0 {
		return &r, fmt.Errorf("%w: prompt or messages: required", ErrBadRequest)
	}
	var raw struct {
		Messages json.RawMessage `json:"messages"`
	}
	if err := json.Unmarshal(body, &raw); err == nil {
		r.RawMessages = raw.Messages
	}
	return &r, nil
}

// TokenizeResponse is the /tokenize answer.
type TokenizeResponse struct {
	Count       int      `json:"count"`
	MaxModelLen int      `json:"max_model_len"`
	Tokens      []uint32 `json:"tokens"`
	TokenStrs   []string `json:"token_strs,omitempty"`
}
