package ingress

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/ingress/routes"
	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/scheduler/pd"
)

// RouteSource gives the current model routes; *routes.Watcher (hot reload
// from Config.Routes) and routes.Static implement it. Table must be cheap
// and safe for concurrent use; a request keeps the table it started with.
type RouteSource interface {
	Table() *routes.Table
}

var (
	_ RouteSource = (*routes.Watcher)(nil)
	_ RouteSource = routes.Static{}
)

// routeCall is a request's routing state (zero when no route matched).
type routeCall struct {
	route   *routes.Route
	asked   string   // the model the client named
	upModel string   // model named upstream when it is not c.model (a LoRA adapter)
	chain   []string // picked backend, then the route's fallbacks
	next    int      // chain index of the next model to try
	buf     []byte   // upstream body with "model" rewritten
}

func (r *routeCall) reset() routeCall {
	return routeCall{chain: r.chain[:0], buf: r.buf[:0]}
}

func (c *call) routePath() string {
	if c.ep == epOther {
		return c.path
	}
	return epPath(c.ep)
}

func epPath(ep endpoint) string {
	switch ep {
	case epChat:
		return "/v1/chat/completions"
	case epResponses:
		return "/v1/responses"
	case epMessages:
		return "/v1/messages"
	}
	return "/v1/completions"
}

// applyRoute matches the parsed request against the routes and points
// c.model at the pool that serves it: the weighted pick, or the first
// fallback with a healthy engine when the pick has none (for a LoRA
// adapter, the first that can serve it: nextRouteModel).
func (c *call) applyRoute(ctx *fasthttp.RequestCtx) {
	if c.s.deps.Routes == nil {
		return
	}
	r, ok := c.s.deps.Routes.Table().Match(c.model, c.routePath(), func(name string) []byte {
		return ctx.Request.Header.Peek(name)
	})
	if !ok {
		return
	}
	rt := &c.rt
	rt.route, rt.asked = r, c.model
	if r.IsAdapter(c.model) {
		rt.upModel = c.model
	}
	rt.chain = append(rt.chain[:0], r.Pick(rand.Uint64()))
	for _, f := range r.Fallback() {
		if f != rt.chain[0] {
			rt.chain = append(rt.chain, f)
		}
	}
	c.infos = c.s.deps.Membership.Engines(c.infos[:0])
	if m := c.nextRouteModel(); m != "" {
		c.model = m
	} else {
		// No pool has a healthy engine: the usual path reports it.
		c.model, rt.next = rt.chain[0], len(rt.chain)
	}
}

// nextRouteModel returns the next model of the chain with a healthy engine
// in c.infos ("" when none is left) and moves past it. For a route's LoRA
// adapter it is the first model of the rest of the chain whose pool serves
// it best (poolRank): a pool none of whose engines can take the adapter is
// passed over for one whose can, and stays next in the chain, in order, for
// the fallback.
func (c *call) nextRouteModel() string {
	rt := &c.rt
	best, at := poolDown, -1
	for i := rt.next; i < len(rt.chain) && best != poolServes; i++ {
		if r := c.poolRank(rt.chain[i]); r < best {
			best, at = r, i
		}
	}
	if at < 0 {
		rt.next = len(rt.chain)
		return ""
	}
	m := rt.chain[at]
	copy(rt.chain[rt.next+1:at+1], rt.chain[rt.next:at])
	rt.chain[rt.next] = m
	rt.next++
	return m
}

// How well a pool of a route can serve a request (poolRank), best first.
const (
	poolServes  = iota // a healthy engine that takes the request: for an adapter, one that lists it, when one does
	poolMayLoad        // an adapter: a healthy engine that no engine of the pool lists it on, not lately denied it (it may load it on demand)
	poolDenied         // an adapter: every healthy engine that would get it lately answered that it lacks it (its 404)
	poolDown           // no healthy engine
)

// poolRank ranks model's pool for the request as candidates would fill it
// from c.infos: for a route's LoRA adapter, the engines of the pool that
// list it when a healthy one does, else all of them, less the ones that
// lately answered that they lack it (wrongmodel.go).
func (c *call) poolRank(model string) int {
	adapter := c.rt.upModel
	listed := adapter != "" && listsAdapter(c.infos, model, adapter)
	rank := poolDown
	for i := range c.infos {
		e := &c.infos[i]
		if e.Model != model || !e.Healthy {
			continue
		}
		switch {
		case adapter == "":
			return poolServes
		case listed && !slices.Contains(e.LoRAs, adapter):
		case c.keptFromAdapter(e, adapter):
			rank = min(rank, poolDenied)
		case listed:
			return poolServes
		default:
			rank = min(rank, poolMayLoad)
		}
	}
	return rank
}

// keptFromAdapter reports whether engine e lately answered that it lacks
// the adapter (addCandidate takes it out of routing for it).
func (c *call) keptFromAdapter(e *EngineInfo, adapter string) bool {
	up := c.s.ups.lookup(e.ID)
	return up != nil && up.url == e.URL && up.wrong.has(adapter, c.start, e.LoRAs)
}

// deniedPools names the pools of the route's chain a request for its
// adapter is out of when every engine of its pool (c.model, of engines
// engines) lately denied the adapter: that pool and the rest of the chain,
// which nextRouteModel ranked no better (each one denied, or down), with
// the denied pools' engines counted. ("pool "A"", 1; "pools "A", "B"", 2.)
func (c *call) deniedPools(engines int) (string, int) {
	names := []string{strconv.Quote(c.model)}
	for _, m := range c.rt.chain[min(c.rt.next, len(c.rt.chain)):] {
		if m == c.model || c.poolRank(m) != poolDenied {
			continue
		}
		names = append(names, strconv.Quote(m))
		for i := range c.infos {
			if e := &c.infos[i]; e.Model == m && e.Healthy && c.keptFromAdapter(e, c.rt.upModel) {
				engines++
			}
		}
	}
	if len(names) == 1 {
		return "pool " + names[0], engines
	}
	return "pools " + strings.Join(names, ", "), engines
}

// admitRoute charges the route's rate limit (429 with Retry-After).
func (c *call) admitRoute(promptTokens int) error {
	r := c.rt.route
	if r == nil {
		return nil
	}
	wait, ok := r.Admit(time.Now(), promptTokens)
	if ok {
		return nil
	}
	e := newAPIError(fasthttp.StatusTooManyRequests, "rate_limit_error", "rate_limit_exceeded", "",
		fmt.Errorf("%w: route %q", ErrRateLimited, r.Name()))
	e.retryAfter = max(wait, time.Second)
	return e
}

// upstreamBody is the body to send: the rewritten one (or the client's),
// with "model" naming the routed model when it differs from the client's.
func (c *call) upstreamBody() []byte {
	body := c.body
	if len(body) == 0 {
		body = c.req.body
	}
	rt := &c.rt
	if rt.route == nil {
		return body
	}
	want := rt.upModel
	if want == "" {
		want = c.model
	}
	if want == rt.asked {
		return body
	}
	rt.buf = rewriteModel(rt.buf[:0], body, want)
	return rt.buf
}

// rewriteModel appends body with its top-level "model" value replaced by
// model. Every "model" member is: a body that repeats the key (the ingress
// reads the last, as parsers such as the engine's do; others read the
// first) names the routed model to any parser. A body without one (it was
// validated, so only a malformed rewrite could cause that) goes as it is.
func rewriteModel(dst, body []byte, model string) []byte {
	from := 0
	_ = jsonscan.ForEachMember(body, func(key, val []byte, _, off int) error {
		if string(key) == "model" {
			dst = append(dst, body[from:off]...)
			dst = openai.AppendString(dst, model)
			from = off + len(val)
		}
		return nil
	})
	return append(dst, body[from:]...)
}

// routeFallback moves a request whose attempts all failed before the first
// byte to the next fallback pool and proxies it again. False when there is
// no route or no fallback left: the caller reports lastErr.
func (c *call) routeFallback(ctx *fasthttp.RequestCtx, lastErr error) bool {
	if c.rt.route == nil || c.rt.next >= len(c.rt.chain) {
		return false
	}
	c.infos = c.s.deps.Membership.Engines(c.infos[:0])
	for {
		m := c.nextRouteModel()
		if m == "" {
			return false
		}
		from := c.model
		c.model = m
		err := c.reschedule()
		if err == nil {
			c.s.log.Info("route fallback", "route", c.rt.route.Name(), "from", from, "to", m, "cause", lastErr)
			break
		}
		lastErr = err
	}
	if c.watch != nil {
		// proxy starts a new one for the new attempts.
		c.watch.stop()
		c.watch = nil
	}
	if c.prefillLeg(ctx) { // false: it answered the client itself
		c.proxy(ctx)
	}
	return true
}

// reschedule redoes prepare's steps after parsing for the new c.model
// (candidates, tokenization: the pool may use another tokenizer, keys,
// ranking and the P/D plan), without charging the limits again.
func (c *call) reschedule() error {
	c.block = 0
	if err := c.refreshCandidates(); err != nil {
		return err
	}
	c.body, c.wrap, c.dropUsage, c.approx, c.promptTokens, c.media = c.body[:0], false, false, 0, 0, 0
	c.tokens = c.tokens[:0]
	if err := c.tokenize(); err != nil {
		return err
	}
	if c.promptTokens == 0 {
		c.promptTokens = len(c.tokens)
		if c.tokens == nil {
			c.promptTokens = c.approx
		}
	}
	c.pd = pdCall{plan: pd.Plan{Options: c.pd.plan.Options[:0]}}
	return c.schedule()
}

// routeModels are the names /v1/models adds for the routes (route match
// models and LoRA adapters).
func (s *Server) routeModels() []string {
	if s.deps.Routes == nil {
		return nil
	}
	return s.deps.Routes.Table().Models()
}
