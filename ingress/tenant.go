package ingress

import (
	"context"
	"errors"
	"fmt"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/ingress/fair"
)

// TenantAdmitter is an Admitter that shares the slots fairly across tenants
// (ingress/fair): the ingress uses AcquireFor when Deps.Admitter has it.
type TenantAdmitter interface {
	AcquireFor(ctx context.Context, t fair.Ticket) (release func(), err error)
}

var _ TenantAdmitter = (*fair.Queue)(nil)

// tenant names whom the request is charged to: the authenticated identity
// (API key or JWT tenant) when auth is on, else Config.TenantHeader's value
// when configured (a header is only as trustworthy as whatever sets it: use
// it behind a gateway that does), else "".
func (c *call) tenant(ctx *fasthttp.RequestCtx) string {
	if c.keyID != "" {
		return c.keyID
	}
	if h := c.s.cfg.TenantHeader; h != "" {
		return string(ctx.Request.Header.Peek(h))
	}
	return ""
}

// acquire asks Deps.Admitter for a slot: per tenant, priced in tokens of
// work (fairCost), when it shares fairly; per session otherwise.
// A client that closes its connection while queued leaves the queue
// (ErrClientGone).
func (c *call) acquire(ctx *fasthttp.RequestCtx, promptTokens int) (func(), error) {
	wctx := c.waitContext(ctx)
	defer c.wctx.stop()
	if ta, ok := c.s.deps.Admitter.(TenantAdmitter); ok {
		return ta.AcquireFor(wctx, fair.Ticket{Tenant: c.tenant(ctx), Cost: c.fairCost(promptTokens)})
	}
	return c.s.deps.Admitter.Acquire(wctx, string(c.req.sessionID))
}

// fairCost prices a request for the fair queue by the work it asks for: its
// prompt tokens plus the output it may produce, max_tokens × the sequences
// the engine decodes, bounded by what the model's context leaves when the
// engines report it (contextLeft). Without max_tokens the output is the
// mean this replica has seen the model give per sequence (defaultOutputTokens
// before any answer), equally bounded. A request is at least 1.
func (c *call) fairCost(promptTokens int) float64 {
	var out int
	switch {
	case c.ep == epOther: // no output
	case c.req.maxTokens >= 0:
		out = satMul(c.req.maxTokens, c.seqs)
		if left := c.contextLeft(promptTokens); left > 0 && out > left {
			out = left
		}
	default:
		out = c.expectedOutput(promptTokens) // budget.go: bounded by the context too
	}
	return max(float64(promptTokens)+float64(out), 1)
}

// FairErrors maps ingress/fair's errors onto the ingress sentinels (for
// Deps.ClassifyError): a full queue is 429 with Retry-After, a wait past
// MaxWait is 504.
func FairErrors(err error) error {
	switch {
	case errors.Is(err, fair.ErrQueueTimeout):
		return fmt.Errorf("%w: %w", ErrQueueTimeout, err)
	case errors.Is(err, fair.ErrQueueFull):
		return fmt.Errorf("%w: %w", ErrOverloaded, err)
	}
	return err
}
