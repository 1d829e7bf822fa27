package openai

import (
	"encoding/json"
	"strconv"
)

// Usage is the token accounting of a request.
type Usage struct {
	PromptTokens        int                  `json:"prompt_tokens"`
	CompletionTokens    int                  `json:"completion_tokens"`
	TotalTokens         int                  `json:"total_tokens"`
	PromptTokensDetails *PromptTokensDetails `json:"prompt_tokens_details,omitempty"`
}

// PromptTokensDetails carries vLLM's cached-token count.
type PromptTokensDetails struct {
	CachedTokens int `json:"cached_tokens"`
}

// CachedTokens is prompt_tokens_details.cached_tokens, 0 when absent.
func (u *Usage) CachedTokens() int {
	if u == nil || u.PromptTokensDetails == nil {
		return 0
	}
	return u.PromptTokensDetails.CachedTokens
}

// CompletionChoice is one choice of a completion or completion chunk.
type CompletionChoice struct {
	Index        int             `json:"index"`
	Text         string          `json:"text"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
	// vLLM return_token_ids.
	PromptTokenIDs []uint32 `json:"prompt_token_ids,omitempty"`
	TokenIDs       []uint32 `json:"token_ids,omitempty"`
}

// Completion is a /v1/completions response, or one chunk of its stream
// (Object "text_completion" in both cases, as vLLM does).
type Completion struct {
	ID      string             `json:"id"`
	Object  string             `json:"object"`
	Created int64              `json:"created"`
	Model   string             `json:"model"`
	Choices []CompletionChoice `json:"choices"`
	Usage   *Usage             `json:"usage"`
}

// ChatMessageOut is an assistant message in a response.
type ChatMessageOut struct {
	Role    string `json:"role"`
	Content string `json:"content"`
}

// ChatChoice is one choice of a chat completion.
type ChatChoice struct {
	Index        int             `json:"index"`
	Message      ChatMessageOut  `json:"message"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
}

// ChatCompletion is a /v1/chat/completions response.
type ChatCompletion struct {
	ID      string       `json:"id"`
	Object  string       `json:"object"`
	Created int64        `json:"created"`
	Model   string       `json:"model"`
	Choices []ChatChoice `json:"choices"`
	Usage   *Usage       `json:"usage"`
}

// ChatDelta is the incremental message of a chat chunk.
type ChatDelta struct {
	Role    string  `json:"role,omitempty"`
	Content *string `json:"content,omitempty"`
}

// ChatChunkChoice is one choice of a chat chunk.
type ChatChunkChoice struct {
	Index        int             `json:"index"`
	Delta        ChatDelta       `json:"delta"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason *string         `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason,omitempty"`
}

// ChatCompletionChunk is one chunk of a chat stream.
type ChatCompletionChunk struct {
	ID      string            `json:"id"`
	Object  string            `json:"object"`
	Created int64             `json:"created"`
	Model   string            `json:"model"`
	Choices []ChatChunkChoice `json:"choices"`
	Usage   *Usage            `json:"usage"`
}

// Model is one entry of GET /v1/models.
type Model struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	Created     int64   `json:"created"`
	OwnedBy     string  `json:"owned_by"`
	Root        string  `json:"root,omitempty"`
	Parent      *string `json:"parent"` // a LoRA adapter's base model; null for base models
	MaxModelLen int     `json:"max_model_len,omitempty"`
}

// ModelList is GET /v1/models.
type ModelList struct {
	Object string  `json:"object"`
	Data   []Model `json:"data"`
}

// Object names.
const (
	ObjectCompletion = "text_completion"
	ObjectChat       = "chat.completion"
	ObjectChatChunk  = "chat.completion.chunk"
)

// Finish reasons.
const (
	FinishStop   = "stop"
	FinishLength = "length"
	FinishAbort  = "abort"
)

// ChunkFields are the per-stream constants of a chunk.
type ChunkFields struct {
	ID      string
	Created int64
	Model   string
	// Usage is written in each chunk when set (vLLM's
	// stream_options.continuous_usage_stats); nil writes null.
	Usage *Usage
}

// AppendCompletionChunk appends one text_completion stream chunk (choice 0)
// as vLLM writes it. finish is "" while generating. No reflection, so the
// sim's and ingress's streaming paths stay cheap.
func AppendCompletionChunk(dst []byte, f *ChunkFields, text, finish string) []byte {
	return AppendCompletionChunkIndex(dst, f, 0, text, finish)
}

// AppendCompletionChunkIndex is AppendCompletionChunk for choice index i
// (a completion with several prompts streams one choice per prompt).
func AppendCompletionChunkIndex(dst []byte, f *ChunkFields, i int, text, finish string) []byte {
	return AppendCompletionChunkLogprobs(dst, f, i, text, finish, nil)
}

// AppendCompletionChunkLogprobs is AppendCompletionChunkIndex with the
// chunk's logprobs object (raw JSON; nil writes null).
func AppendCompletionChunkLogprobs(dst []byte, f *ChunkFields, i int, text, finish string, logprobs []byte) []byte {
	return AppendCompletionChunkStop(dst, f, i, text, finish, nil, logprobs)
}

// AppendCompletionChunkStop is AppendCompletionChunkLogprobs with the
// choice's stop_reason as raw JSON: the stop string or stop token id that
// ended it (nil writes null).
func AppendCompletionChunkStop(dst []byte, f *ChunkFields, i int, text, finish string, stop, logprobs []byte) []byte {
	dst = appendChunkHead(dst, f, ObjectCompletion)
	dst = append(dst, `"choices":[{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"text":`...)
	dst = AppendString(dst, text)
	dst = append(dst, `,"logprobs":`...)
	dst = appendRawOrNull(dst, logprobs)
	dst = append(dst, `,"finish_reason":`...)
	dst = appendNullableString(dst, finish)
	dst = append(dst, `,"stop_reason":`...)
	dst = appendRawOrNull(dst, stop)
	dst = appendChunkUsage(dst, f)
	return dst
}

// AppendChatChunk appends one chat.completion.chunk (choice 0). role is set
// only on the first chunk; content nil omits the field (final chunk).
func AppendChatChunk(dst []byte, f *ChunkFields, role string, content *string, finish string) []byte {
	return AppendChatChunkLogprobs(dst, f, 0, role, content, finish, nil)
}

// AppendChatChunkLogprobs is AppendChatChunk for choice index i (n > 1
// streams one choice per sample) with the chunk's logprobs object (raw
// JSON; nil writes null).
func AppendChatChunkLogprobs(dst []byte, f *ChunkFields, i int, role string, content *string, finish string, logprobs []byte) []byte {
	return AppendChatChunkStop(dst, f, i, role, content, finish, nil, logprobs)
}

// AppendChatChunkStop is AppendChatChunkLogprobs with the choice's
// stop_reason as raw JSON, written when stop is set (the stop string or
// stop token id that ended it), as vLLM writes it on the last chunk only.
func AppendChatChunkStop(dst []byte, f *ChunkFields, i int, role string, content *string, finish string, stop, logprobs []byte) []byte {
	dst = appendChunkHead(dst, f, ObjectChatChunk)
	dst = append(dst, `"choices":[{"index":`...)
	dst = strconv.AppendInt(dst, int64(i), 10)
	dst = append(dst, `,"delta":{`...)
	comma := false
	if role != "" {
		dst = append(dst, `"role":`...)
		dst = AppendString(dst, role)
		comma = true
	}
	if content != nil {
		if comma {
			dst = append(dst, ',')
		}
		dst = append(dst, `"content":`...)
		dst = AppendString(dst, *content)
	}
	dst = append(dst, `},"logprobs":`...)
	dst = appendRawOrNull(dst, logprobs)
	dst = append(dst, `,"finish_reason":`...)
	dst = appendNullableString(dst, finish)
	if len(stop) > 0 {
		dst = append(dst, `,"stop_reason":`...)
		dst = append(dst, stop...)
	}
	dst = appendChunkUsage(dst, f)
	return dst
}

// appendRawOrNull appends raw JSON, or null when raw is empty.
func appendRawOrNull(dst, raw []byte) []byte {
	if len(raw) == 0 {
		return append(dst, "null"...)
	}
	return append(dst, raw...)
}

// AppendUsageChunk appends the final usage-only chunk ("choices":[]) of a
// stream with stream_options.include_usage. object is ObjectCompletion or ObjectChatChunk.
func AppendUsageChunk(dst []byte, f *ChunkFields, object string, u *Usage) []byte {
	dst = appendChunkHead(dst, f, object)
	dst = append(dst, `"choices":[],"usage":`...)
	dst = AppendUsage(dst, u)
	return append(dst, '}')
}

// AppendUsage appends a usage object.
func AppendUsage(dst []byte, u *Usage) []byte {
	dst = append(dst, `{"prompt_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.PromptTokens), 10)
	dst = append(dst, `,"total_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.TotalTokens), 10)
	dst = append(dst, `,"completion_tokens":`...)
	dst = strconv.AppendInt(dst, int64(u.CompletionTokens), 10)
	if u.PromptTokensDetails != nil {
		dst = append(dst, `,"prompt_tokens_details":{"cached_tokens":`...)
		dst = strconv.AppendInt(dst, int64(u.PromptTokensDetails.CachedTokens), 10)
		dst = append(dst, '}')
	}
	return append(dst, '}')
}

// appendChunkUsage closes a chunk's choices with its usage: f.Usage, or null.
func appendChunkUsage(dst []byte, f *ChunkFields) []byte {
	dst = append(dst, `}],"usage":`...)
	if f.Usage == nil {
		return append(dst, "null}"...)
	}
	return append(AppendUsage(dst, f.Usage), '}')
}

func appendChunkHead(dst []byte, f *ChunkFields, object string) []byte {
	dst = append(dst, `{"id":`...)
	dst = AppendString(dst, f.ID)
	dst = append(dst, `,"object":"`...)
	dst = append(dst, object...)
	dst = append(dst, `","created":`...)
	dst = strconv.AppendInt(dst, f.Created, 10)
	dst = append(dst, `,"model":`...)
	dst = AppendString(dst, f.Model)
	return append(dst, ',')
}

func appendNullableString(dst []byte, s string) []byte {
	if s == "" {
		return append(dst, "null"...)
	}
	return AppendString(dst, s)
}

// StringPtr returns &s (for FinishReason and ChatDelta.Content).
func StringPtr(s string) *string { return &s }
