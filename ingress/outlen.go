package ingress

import (
	"sync"

	"github.com/kvmesh/kvmesh/scheduler/learn"
)

// outputLengths predicts a request's output length per served model from
// the answers this replica has seen finish (learn.OutputLength: their mean,
// forgetting over about 500), as the discrete-event benchmark's router
// does: a router is not told the length, and max_tokens, where a client
// sends it, is only a cap. The cost model prices a request's decode with
// it (scheduler.Request.OutputTokens). Safe for concurrent use.
type outputLengths struct {
	mu sync.Mutex
	m  map[string]*learn.OutputLength // served models that answered
}

// estimate is the output tokens to expect of one prompt for model: the
// prediction, capped by maxTokens when the client set one (> 0); 0 (the
// policy's default) before any answer and without max_tokens.
func (o *outputLengths) estimate(model string, maxTokens int) int {
	o.mu.Lock()
	var pred int
	if l := o.m[model]; l != nil {
		pred = l.Predict()
	}
	o.mu.Unlock()
	switch {
	case maxTokens <= 0:
		return pred
	case pred <= 0:
		return maxTokens
	default:
		return min(pred, maxTokens)
	}
}

// observe records one answer's output tokens per prompt for model.
func (o *outputLengths) observe(model string, n int) {
	if n <= 0 || model == "" {
		return
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	l := o.m[model]
	if l == nil {
		if o.m == nil {
			o.m = make(map[string]*learn.OutputLength)
		}
		l = new(learn.OutputLength)
		o.m[model] = l
	}
	l.Observe(n)
}
