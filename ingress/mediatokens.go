package ingress

import (
	"bytes"
	"math"
	"sync"
	"sync/atomic"
)

// Media tokens. The ingress cannot count a media item's tokens: the engine
// decodes the image (or audio, video) and its processor decides how many
// tokens it becomes (Qwen2.5-VL: about one per 28×28 pixels, up to 16k).
// Without them a request with images looks a fraction of its size to the
// cost model, the learner and the token budgets. So the ingress learns
// each model's mean tokens per item from the engines' answers (their
// usage's prompt tokens minus the text tokens it counted itself), and
// counts a media request's prompt as its text plus that mean per item.
// Before the first answer for a model, items count for nothing.

// mediaAlpha is the weight of a new observation in a model's mean
// (exponential moving average).
const mediaAlpha = 0.2

// mediaTokens holds each model's learned tokens per media item.
type mediaTokens struct{ m sync.Map } // model → *atomic.Uint64 (float64 bits)

// perItem returns model's learned tokens per media item (0 before any).
func (mt *mediaTokens) perItem(model string) float64 {
	v, ok := mt.m.Load(model)
	if !ok {
		return 0
	}
	return math.Float64frombits(v.(*atomic.Uint64).Load())
}

// observe folds one answer in: items media items took engine − text
// prompt tokens.
func (mt *mediaTokens) observe(model string, items, text, engine int) {
	if items <= 0 || engine <= text {
		return
	}
	sample := float64(engine-text) / float64(items)
	v, loaded := mt.m.LoadOrStore(model, new(atomic.Uint64))
	a := v.(*atomic.Uint64)
	if !loaded {
		a.Store(math.Float64bits(sample))
		return
	}
	for {
		old := a.Load()
		next := math.Float64bits((1-mediaAlpha)*math.Float64frombits(old) + mediaAlpha*sample)
		if a.CompareAndSwap(old, next) {
			return
		}
	}
}

// Usage members that count a prompt's tokens: OpenAI's (chat, completions),
// and the Responses and Messages APIs' input_tokens (Messages adds the
// cached part, which vLLM leaves out of input_tokens).
var (
	promptTokensKey = []byte(`"prompt_tokens":`)
	inputTokensKey  = []byte(`"input_tokens":`)
	cacheReadKey    = []byte(`"cache_read_input_tokens":`)
)

// usagePromptTokens finds the prompt's token count in an answer or in
// stream events for endpoint ep (0 when absent).
func usagePromptTokens(ep endpoint, b []byte) int {
	at := func(key []byte) int {
		if i := bytes.LastIndex(b, key); i >= 0 {
			return uintAt(b, i+len(key))
		}
		return 0
	}
	switch ep {
	case epResponses:
		return at(inputTokensKey)
	case epMessages:
		return at(inputTokensKey) + at(cacheReadKey)
	}
	return at(promptTokensKey)
}
