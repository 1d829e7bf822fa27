package ingress

import (
	"fmt"
	"math"
	"time"

	"github.com/kvmesh/kvmesh/ingress/ratelimit"
)

// The admission stage's token budgets: what a request reserves of its key's
// and its model's budgets (ingress/ratelimit) and how it settles them.

// budgeter is a RateLimiter that reserves a request's output at admission
// (its largest, or without max_tokens the output expected) and settles it
// to the actual at the end (ingress/ratelimit), so requests in flight
// together cannot reserve more than the budget. Settle is called once per
// admitted request, whatever its status.
type budgeter interface {
	Reserve(keyID, model string, a ratelimit.Ask) ratelimit.Decision
	Settle(keyID, model string, r ratelimit.Reservation, outputTokens int)
}

var _ budgeter = (*ratelimit.Limiter)(nil)

// admitBudget charges the prompt to the key's and the model's token budgets
// and reserves the output the request may produce (budgetAsk): 429 with
// Retry-After when it does not fit now, 429 without when it alone asks more
// than a whole budget (as OpenAI's "Request too large"). The model's budget
// is the served model's (budgetModelOf).
func (c *call) admitBudget(promptTokens int) error {
	model := c.budgetModelOf()
	lim := c.s.deps.Limiter
	b, ok := lim.(budgeter)
	if !ok {
		if wait, ok := lim.Admit(c.keyID, model, promptTokens); !ok {
			return c.budgetRefusal(model, ratelimit.Decision{RetryAfter: wait})
		}
		c.budgeted, c.budgetModel = true, model
		return nil
	}
	d := b.Reserve(c.keyID, model, c.budgetAsk(promptTokens))
	if !d.Allowed {
		return c.budgetRefusal(model, d)
	}
	c.budget, c.budgeted, c.budgetModel = d.Reservation, true, model
	return nil
}

// budgetModelOf is the model whose budgets the request is charged to: the
// model its engines serve. A LoRA adapter runs on its base model's engines,
// so its requests count against the base model's budgets however the
// ingress learned the adapter (--lora-adapter, a route's loraAdapters, the
// engines' lists); a budget per adapter name would add a whole budget on the
// same engines for every adapter.
func (c *call) budgetModelOf() string {
	served, _ := c.adapterOf()
	return served
}

// budgetRefusal is the 429 of a refused admission, naming the budget that
// refused it (d.Scope): the caller's key's own, or the model's, which every
// key shares (and a tenant may find spent by the others). model is the
// model charged (budgetModelOf).
func (c *call) budgetRefusal(model string, d ratelimit.Decision) error {
	if d.TooLarge {
		name := c.keyID
		if d.Scope == "model" {
			name = model
		}
		param := c.req.maxTokensParam()
		return newAPIError(429, "rate_limit_error", "rate_limit_exceeded", param,
			fmt.Errorf("%w: request too large for the %s %q on %s tokens per min: Limit %d, Requested %d (%s × n). Reduce %s or n to run it",
				ErrRateLimited, d.Scope, clip(name), d.Dim, d.Limit, d.Requested, param, param))
	}
	dim := d.Dim
	if dim != "" {
		dim += " "
	}
	var err error
	switch d.Scope {
	case "key":
		err = fmt.Errorf("%w: the %stoken budget of key %q is spent", ErrRateLimited, dim, c.keyID)
	case "model":
		err = fmt.Errorf("%w: the %stoken budget of model %q, shared by every key, is spent", ErrRateLimited, dim, clip(model))
		if _, adapter := c.adapterOf(); adapter != "" {
			err = fmt.Errorf("%w (LoRA adapter %q runs on it and counts against it)", err, clip(adapter))
		}
	default: // a RateLimiter without Reserve does not say which
		err = fmt.Errorf("%w: the token budget of key %q or of model %q is spent", ErrRateLimited, c.keyID, clip(model))
	}
	e := newAPIError(429, "rate_limit_error", "rate_limit_exceeded", "", err)
	e.retryAfter = max(d.RetryAfter, time.Second)
	return e
}

// maxTokensParam names the output limit the request sent, as settle
// (request.go) reads them: chat's max_completion_tokens wins over
// max_tokens, the Responses API's is max_output_tokens. A completions
// request that sent none is limited by vLLM's default max_tokens.
func (r *request) maxTokensParam() string {
	switch {
	case r.hasMCT:
		return "max_completion_tokens"
	case r.ep == epResponses:
		return "max_output_tokens"
	}
	return "max_tokens"
}

// budgetAsk is what the request asks of the token budgets: its prompt and
// the most output it may produce, max_tokens (or max_completion_tokens,
// max_output_tokens) × the sequences the engine decodes. Without max_tokens
// the engine stops only at the model's context, which would hold a budget
// for one request at a time: the reservation is then the output expected
// (expectedOutput), and what the answer produces beyond it is charged when
// it ends (the limiter carries it into later windows). vLLM's other
// endpoints produce no output.
func (c *call) budgetAsk(promptTokens int) ratelimit.Ask {
	a := ratelimit.Ask{InputTokens: promptTokens}
	switch {
	case c.ep == epOther:
	case c.req.maxTokens >= 0:
		a.OutputTokens = satMul(c.req.maxTokens, c.seqs)
	default:
		a.Unbounded = true
		a.OutputTokens = c.expectedOutput(promptTokens)
	}
	return a
}

// expectedOutput is the output a request without max_tokens is expected to
// produce: the mean answer this replica has seen the model give
// (outputLengths; defaultOutputTokens before any) for each of its
// sequences, bounded by what the model's context leaves (contextLeft).
func (c *call) expectedOutput(promptTokens int) int {
	served, _ := c.adapterOf()
	per := c.s.outLens.estimate(served, -1)
	if per <= 0 {
		per = defaultOutputTokens
	}
	out := satMul(per, c.seqs)
	if left := c.contextLeft(promptTokens); left > 0 && out > left {
		out = left
	}
	return out
}

// contextLeft is the most output the engines let the request produce: what
// the served model's max_model_len (the smallest its engines report) leaves
// after each prompt, for each of the n sequences; 0 when no engine reports it.
func (c *call) contextLeft(promptTokens int) int {
	served, _ := c.adapterOf()
	ctxLen := 0
	for i := range c.infos {
		if e := &c.infos[i]; e.Model == served && e.MaxModelLen > 0 && (ctxLen == 0 || e.MaxModelLen < ctxLen) {
			ctxLen = e.MaxModelLen
		}
	}
	if ctxLen == 0 {
		return 0
	}
	// Σ over the prompts of n × (ctxLen − prompt) = seqs × ctxLen − n × Σ prompts.
	return max(satMul(ctxLen, c.seqs)-satMul(promptTokens, max(1, c.req.n)), 1)
}

// satMul is a × b for non-negative a and b, saturating at math.MaxInt.
func satMul(a, b int) int {
	if a != 0 && b > math.MaxInt/a {
		return math.MaxInt
	}
	return a * b
}

// settleBudget charges the output the request produced to its token
// budgets and releases the rest of what admitBudget reserved, whatever the
// status: a stream the client cut (499) or that failed produced tokens too.
func (c *call) settleBudget() {
	if !c.budgeted {
		return
	}
	c.budgeted = false
	if b, ok := c.s.deps.Limiter.(budgeter); ok {
		b.Settle(c.keyID, c.budgetModel, c.budget, c.outTokens)
		return
	}
	c.s.deps.Limiter.Observe(c.keyID, c.budgetModel, c.outTokens)
}
