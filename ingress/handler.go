package ingress

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/index"
	"github.com/kvmesh/kvmesh/ingress/ratelimit"
	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/scheduler"
	"github.com/kvmesh/kvmesh/scheduler/pd"
)

// call is one request's state from arrival to the end of its response. It is
// pooled; a streamed response keeps it until the stream closes.
type call struct {
	s     *Server
	ep    endpoint
	req   request
	start time.Time

	keyID  string
	model  string
	tokens []uint32 // prompt tokens (nil when the model has no tokenizer)
	approx int      // prompt token estimate when tokens is nil
	keys   []uint64
	block  int // tokens per block of keys: the candidates' most common block size (blockSizes)
	// A model whose engines differ in block size: the sizes among the
	// candidates, and the prompt's keys at the keyed sizes other than
	// block (scheduler.Request.Chains; altKeys holds their buffers).
	sizes   blockSizes
	chains  []scheduler.Chain
	altKeys [maxKeyedSizes - 1][]uint64

	infos       []EngineInfo
	cands       []scheduler.Engine
	urls        []string // parallel to cands
	ctxLens     []int    // parallel to cands: the engine's max_model_len (0: not reported)
	sreq        scheduler.Request
	dec         scheduler.Decision
	body        []byte      // upstream body (rewritten) or nil: the client's body
	alt         []byte      // second body buffer (swapped with body when rewriting twice)
	dropUsage   bool        // the usage chunk was added by us: keep it from the client
	usage       *usageState // the model's forced-usage state when this stream is its probe (forcedusage.go)
	loraBase    string      // base model of a LoRA adapter the engines list (gossip) and no config names
	path        string      // upstream path
	wrap        bool        // chat answered through /v1/completions and re-wrapped
	media       int         // media items in the chat prompt (keys stop at the first)
	textToks    int         // with media: the prompt's text tokens (mediatokens.go)
	engPrompt   int         // the prompt tokens the engine's usage reported (tokencheck.go)
	engCached   int         // the cached prompt tokens it reported, when engCachedOK
	engCachedOK bool
	fwd         [len(forwardHeaders)][]byte // the client's forwarded headers, the request id first (upstreamhdr.go)
	engineReqID []byte                      // the engine's X-Request-Id when not the request's (upstreamhdr.go)
	engine      string
	picked      string // the policy's pick, until reported finished (policyDone)
	match       index.Match
	pd          pdCall // the P/D plan and prefill leg (pd.go)
	baton       bool   // released from the hold with its baton, not passed on yet (hold.go)

	tParse, tTokenize, tSchedule time.Duration
	ttft                         time.Duration
	promptTokens                 int // all prompts of a batch
	longest, longestAt           int // a batch's longest prompt (after truncate_prompt_tokens) and its index; 0: not a batch
	seqs                         int // sequences the engine decodes: prompts × n (parallel sampling)
	scratch                      []uint32
	scratchText                  []byte
	prefillCharge                int64     // tokens charged to the engine's prefill until the first byte
	streamCharge                 int64     // the same when the request streams (upstream.streamPrefill)
	bufEnd, bufDur               int64     // a non-streamed attempt's estimated prefill end and length on upstream.bufDone (ns; hold.go)
	activeCharge                 int64     // tokens charged to the engine's active set until the end
	kvCharge                     int64     // the prompt tail and expected output charged to the engine's KV (upstream.kv)
	kvKeys                       []uint64  // the prompt block keys registered there (upstream.kvAdd), at its block size (keysOf)
	kvBlock                      int       // tokens per block of kvKeys (blockOf)
	sentAt                       time.Time // the last attempt's sending, with Server.outs or the learner
	attemptAt                    int64     // the last attempt's sending on monoNow's clock (health: panic readmission)
	uri                          []byte    // the attempt's upstream URI (reused: no allocation per attempt)
	attempts                     int
	status                       int
	outTokens                    int
	errMsg                       string
	release                      func()
	watch                        *watch    // non-streamed requests: the client connection watcher
	wctx                         waitCtx   // the waits in the router (admission queue, hold): clientwatch.go
	upConn                       *idleConn // the attempt's upstream connection, held until the answer commits (proxy.go)
	finishOnce                   sync.Once
	engineEnded                  bool      // endEngine ran (sendAnswer: before the answer is written)
	took                         bool      // an engine took the request: its answer committed with a 200 head (tokens_total)
	rt                           routeCall // model route (route.go)
	lc                           learnCall // the cost learner's samples (learn.go)

	// The token budgets (admitBudget): the output they reserved, the model
	// they were charged under, and whether the end must settle them.
	budget      ratelimit.Reservation
	budgetModel string
	budgeted    bool

	bodyHeld int64 // body bytes charged to Server.bodyBytes until endClient (bodybudget.go)
}

func (c *call) reset() {
	*c = call{
		req:     c.req,
		tokens:  c.tokens[:0],
		keys:    c.keys[:0],
		chains:  c.chains[:0],
		altKeys: c.altKeys,
		infos:   c.infos[:0],
		cands:   c.cands[:0],
		urls:    c.urls[:0],
		ctxLens: c.ctxLens[:0],
		dec:     scheduler.Decision{Ranked: c.dec.Ranked[:0]},
		pd:      pdCall{plan: pd.Plan{Options: c.pd.plan.Options[:0]}},
		body:    c.body[:0],
		alt:     c.alt[:0],

		scratch:     c.scratch[:0],
		scratchText: c.scratchText[:0],
		fwd:         c.fwd,
		engineReqID: c.engineReqID[:0],
		rt:          c.rt.reset(),
		uri:         c.uri[:0],
	}
	c.req.reset()
}

// handleInference runs the request path of DESIGN.md Contract 4.
func (s *Server) handleInference(ctx *fasthttp.RequestCtx, ep endpoint) {
	c := s.reqPool.Get().(*call)
	c.reset()
	c.s, c.ep, c.start = s, ep, time.Now()
	c.keepForwardHeaders(&ctx.Request.Header) // upstreamhdr.go: the request id first, for every answer
	s.m.inflight.Inc()
	n := s.inflight.Add(1)
	var err error
	switch {
	case !ctx.IsPost():
		err = methodNotAllowed("POST", ctx.Method(), ctx.Path())
	case s.draining.Load():
		err = ErrDraining
	case n > int64(s.cfg.MaxConcurrent):
		err = fmt.Errorf("%w: limit is %d", ErrOverloaded, s.cfg.MaxConcurrent)
	default:
		// bodybudget.go: the body's bytes, before anything copies them.
		if err = c.holdBody(len(ctx.PostBody())); err == nil {
			err = c.prepare(ctx)
		}
	}
	if errors.Is(err, ErrClientGone) {
		c.clientGone(ctx) // it left while waiting in the router: never sent
		return
	}
	if err != nil {
		c.fail(ctx, err)
		c.finish()
		return
	}
	if !c.prefillLeg(ctx) {
		return
	}
	c.proxy(ctx)
}

// prepare authenticates, parses, tokenizes, applies limits and schedules:
// the request path of DESIGN.md Contract 4, one named step each.
func (c *call) prepare(ctx *fasthttp.RequestCtx) error {
	if err := c.parse(ctx); err != nil {
		return err
	}
	// Candidates first: an unknown model is a 404 before any tokenizing.
	if err := c.candidates(); err != nil {
		return err
	}
	t := time.Now()
	c.wctx.rc = ctx // tokenizing polls for a client that left (tokenize_stage.go: Stopped)
	if err := c.tokenize(); err != nil {
		return err
	}
	c.tTokenize = time.Since(t)
	if err := c.admit(ctx); err != nil {
		return err
	}
	if err := c.holdStep(ctx); err != nil { // hold.go: the router-side hold
		return err
	}
	if err := c.schedule(); err != nil {
		return err
	}
	s := c.s
	s.m.decisions.WithLabelValues(c.dec.Policy, c.dec.Reason).Inc()
	s.m.stageParse.Observe(c.tParse.Seconds())
	s.m.stageTokenize.Observe(c.tTokenize.Seconds())
	s.m.stageSchedule.Observe(c.tSchedule.Seconds())
	return nil
}

// parse authenticates the caller and parses the body.
func (c *call) parse(ctx *fasthttp.RequestCtx) error {
	id, err := c.s.identify(&ctx.Request.Header) // header.go
	if err != nil {
		return err
	}
	c.keyID = id
	if len(ctx.Request.Header.ContentEncoding()) > 0 {
		n, err := c.s.decodeBody(&ctx.Request, c.bodyHeld) // encoding.go: the decoded bytes charged too
		if err != nil {
			return err
		}
		c.bodyHeld += n
	}
	t := time.Now()
	if err := parseRequest(&c.req, c.ep, ctx.PostBody()); err != nil {
		return err
	}
	c.model = c.s.modelNames.name(c.req.model) // modelname.go: no copy for a name served before
	if c.model == "" {
		if err := c.defaultModel(); err != nil {
			return err
		}
	}
	if c.ep == epOther {
		c.path = string(ctx.Path()) // passthrough.go
	}
	c.applyRoute(ctx) // a model route may name another pool (route.go)
	if sid := ctx.Request.Header.Peek("X-Session-ID"); len(sid) > 0 {
		// Copied: a streamed response outlives the handler that owns the header.
		c.req.sessionID = append(c.req.sessionID[:0], sid...)
	}
	c.tParse = time.Since(t)
	return nil
}

// defaultModel names the model of a request without one, as vLLM serves
// its one model then: the model every live engine serves. The body goes
// upstream without a model too, and the engine takes its own.
func (c *call) defaultModel() error {
	c.infos = c.s.deps.Membership.Engines(c.infos[:0])
	for i := range c.infos {
		switch m := c.infos[i].Model; {
		case c.model == "":
			c.model = m
		case m != c.model:
			c.model = ""
			return badRequest("model", fmt.Errorf("%w: model is required: more than one model is served (%s, %s, ...)", ErrBadRequest, c.infos[0].Model, m))
		}
	}
	if c.model == "" {
		return fmt.Errorf("%w: no live engines", ErrNoEngine)
	}
	return nil
}

// candidates lists the live engines serving the model, with this
// replica's own load added, and the block size they use.
func (c *call) candidates() error {
	s := c.s
	c.infos = s.deps.Membership.Engines(c.infos[:0])
	s.health.panicRoute(c.infos) // health.go: a model whose every engine is ejected
	c.sizes = blockSizes{}
	known := false
	served, adapter := c.adapterOf()
	// A named adapter (--lora-adapter, a route's loraAdapters) goes to the
	// engines of its base model that list it loaded, when any does: the
	// others would answer 404 (and be kept from it for a while) unless they
	// load adapters on demand. When no healthy one lists it, every engine of
	// the base model is a candidate (one may load it on first use: vLLM's
	// runtime LoRA loading).
	listed := adapter != "" && listsAdapter(c.infos, served, adapter)
	for i := range c.infos {
		if e := &c.infos[i]; e.Model == served {
			known = true
			if !listed || slices.Contains(e.LoRAs, adapter) {
				c.addCandidate(e)
			}
		}
	}
	if !known && adapter == "" {
		// A LoRA adapter the engines list (their sidecars read /v1/models)
		// that no flag or route names: served by the engines that list it,
		// under their base model, keyed as the adapter.
		for i := range c.infos {
			e := &c.infos[i]
			if (c.loraBase == "" || e.Model == c.loraBase) && slices.Contains(e.LoRAs, c.model) {
				c.loraBase, known = e.Model, true
				c.addCandidate(e)
			}
		}
	}
	if !known {
		if len(c.infos) == 0 {
			// No engine at all (starting, or gossip not converged): not the client's fault.
			return fmt.Errorf("%w: no live engines", ErrNoEngine)
		}
		if now := time.Now(); s.served.recently(served, now) {
			if base := c.unloadedFrom(now); base != "" {
				// An adapter the engines listed, now listed by none while
				// its base model's engines are live: unloaded, as vLLM
				// answers it. Its base model is known, so the access log
				// names the adapter (adapterOf), as for one still listed.
				c.loraBase = base
				return fmt.Errorf("%w: the model %q does not exist: no engine of its base model %q lists it any more", ErrModelNotFound, clip(c.model), base)
			}
			// Served minutes ago: its engines' sidecars are gone or
			// restarting, an outage to retry, not a model that does not exist.
			return fmt.Errorf("%w: no live engine serves the model %q right now", ErrNoEngine, clip(c.model))
		}
		return fmt.Errorf("%w: the model %q does not exist or no engine serves it", ErrModelNotFound, clip(c.model))
	}
	now := time.Now()
	s.served.seen(served, now)
	if c.loraBase != "" {
		// An adapter the engines list, remembered with its base model too
		// (unloadedFrom).
		s.served.seen(adapterServedKey(c.loraBase, c.model), now)
	}
	s.modelNames.add(c.model)
	c.block = c.sizes.rank(s.cfg.BlockSize)
	return nil
}

// adapterServedKey is the servedModels key of adapter served on base's
// engines (both engines' names: NUL is in neither).
func adapterServedKey(base, adapter string) string { return base + "\x00" + adapter }

// unloadedFrom is the base model of c.model when it is an adapter the
// engines listed within servedWindow under a base model that has a
// healthy engine in c.infos now ("" if none): no engine lists it any more
// while its base model is served, so it was unloaded (vLLM answers 404),
// not lost to an outage of its engines' sidecars (503 to retry).
func (c *call) unloadedFrom(now time.Time) string {
	for i := range c.infos {
		// No engine is a candidate, so none is checked for its denial of
		// the adapter: an engine that denied it sees its listing drop here,
		// and a listing after this one clears its denial (wrongAdapters.has).
		if e := &c.infos[i]; e.Healthy {
			if up := c.s.ups.lookup(e.ID); up != nil && up.url == e.URL {
				up.wrong.has(c.model, now, e.LoRAs)
			}
		}
	}
	for i := range c.infos {
		if e := &c.infos[i]; e.Healthy && c.s.served.recently(adapterServedKey(e.Model, c.model), now) {
			return e.Model
		}
	}
	return ""
}

// listsAdapter reports whether a healthy engine of model in list has
// adapter loaded (its sidecar's last read of the engine's /v1/models).
func listsAdapter(list []EngineInfo, model, adapter string) bool {
	for i := range list {
		if list[i].Model == model && list[i].Healthy && slices.Contains(list[i].LoRAs, adapter) {
			return true
		}
	}
	return false
}

// maxNamedEngines bounds the engines an error names.
const maxNamedEngines = 3

// allOutOfRouting is the 503 of a model whose engines are all out of
// routing (the scheduler's health filter left none), naming them by id
// (never by address) with why each is out: ejected by this replica after
// failures (health.go), denied the adapter lately (wrongmodel.go), or not
// ready as its sidecar reports. nil when some candidate is healthy: then
// another filter (roles, max waiting, strict LoRA) left none.
func (c *call) allOutOfRouting() error {
	if len(c.cands) == 0 {
		return nil
	}
	for i := range c.cands {
		if c.cands[i].Healthy {
			return nil
		}
	}
	ids := make([]string, len(c.cands))
	for i := range c.cands {
		ids[i] = c.cands[i].ID
	}
	slices.Sort(ids)
	m, adapter := c.sentModel()
	if adapter && c.allLackAdapter(ids, m) {
		if r := c.rt.route; r != nil {
			// A route's adapter is served under its pool's model, which
			// need not be the adapter's base model.
			pools, n := c.deniedPools(len(ids))
			return fmt.Errorf("%w: the model %q does not exist: every engine of the %s of route %q (%d) answered that it does not serve it",
				ErrModelNotFound, clip(m), pools, r.Name(), n)
		}
		return adapterNotFound(m, len(ids))
	}
	var b strings.Builder
	for i, id := range ids {
		if i == maxNamedEngines {
			fmt.Fprintf(&b, " and %d more", len(ids)-i)
			break
		}
		if i > 0 {
			b.WriteString(", ")
		}
		why := "not ready (its sidecar says so)"
		if !c.s.health.allowed(id) {
			why = "ejected after failing (probed until it answers again)"
		} else if up := c.s.ups.lookup(id); adapter && up != nil && up.wrong.has(m, c.start, c.candLoRAs(id)) {
			why = "lately answered that it lacks the adapter"
		}
		fmt.Fprintf(&b, "%s %s", clip(id), why)
	}
	return fmt.Errorf("%w: no live engine serves the model %q right now: all %d of its engines are out of routing: %s",
		ErrNoEngine, clip(c.model), len(ids), b.String())
}

// allLackAdapter reports whether every one of the engines ids is out of
// routing only because it lately answered that it lacks the adapter m.
func (c *call) allLackAdapter(ids []string, m string) bool {
	for _, id := range ids {
		up := c.s.ups.lookup(id)
		if !c.s.health.allowed(id) || up == nil || !up.wrong.has(m, c.start, c.candLoRAs(id)) {
			return false
		}
	}
	return true
}

// candLoRAs is the adapters candidate id lists (its gossip's, as the
// request read it).
func (c *call) candLoRAs(id string) []string {
	for i := range c.cands {
		if c.cands[i].ID == id {
			return c.cands[i].LoRAs
		}
	}
	return nil
}

// addCandidate adds e, with this replica's own load, to the candidates.
func (c *call) addCandidate(e *EngineInfo) {
	c.sizes.add(e.BlockSize)
	eng := e.Engine
	eng.BlockSize = e.BlockSize
	eng.PrefillOnly = e.prefillOnly()
	if up := c.s.ups.lookup(e.ID); up != nil {
		addLocalLoad(&eng, up, c.start)
		if up.wrong.n.Load() > 0 && up.url == e.URL {
			// The engine lately denied the adapter (wrongmodel.go).
			if m, adapter := c.sentModel(); adapter && up.wrong.has(m, c.start, e.LoRAs) {
				eng.Healthy = false
			}
		}
	}
	c.cands = append(c.cands, eng)
	c.urls = append(c.urls, e.URL)
	c.ctxLens = append(c.ctxLens, e.MaxModelLen)
}

// Block sizes. Engines of one model may run with different KV block sizes
// (vLLM's --block-size per GPU type; SGLang's page size beside vLLM's 16),
// and an engine's cache holds the chain keys of its own size only. So the
// prompt is keyed once per distinct size among the candidates and each
// engine is looked up with its own size's chain (scheduler.Request.Chains);
// the scheduler compares them by the share of the prompt and the tokens
// they hold. The usual fleet has one size: one chain, as before. At most
// maxKeyedSizes sizes are keyed, the most common first; an engine of a
// size beyond them gets no prefix match (routed by load).
const (
	maxKeyedSizes   = 4
	maxCountedSizes = 8
)

// blockSizes counts the candidates' block sizes (those reporting one).
type blockSizes struct {
	size, count [maxCountedSizes]int
	n           int  // distinct sizes counted
	over        bool // a size beyond maxCountedSizes was not counted
}

func (b *blockSizes) add(bs int) {
	if bs <= 0 {
		return
	}
	for i := range b.n {
		if b.size[i] == bs {
			b.count[i]++
			return
		}
	}
	if b.n == maxCountedSizes {
		b.over = true
		return
	}
	b.size[b.n], b.count[b.n] = bs, 1
	b.n++
}

// rank orders the sizes most common first (ties: first listed) and
// returns the first, or def when no candidate reports one.
func (b *blockSizes) rank(def int) int {
	for i := 1; i < b.n; i++ {
		for j := i; j > 0 && b.count[j] > b.count[j-1]; j-- {
			b.size[j], b.size[j-1] = b.size[j-1], b.size[j]
			b.count[j], b.count[j-1] = b.count[j-1], b.count[j]
		}
	}
	if b.n == 0 {
		return def
	}
	return b.size[0]
}

// blockOf is the tokens per block of engine id's Match (the scheduler's
// MatchBlock): its own block size when the prompt was keyed per size.
func (c *call) blockOf(id string) int {
	if len(c.chains) == 0 {
		return c.block
	}
	for i := range c.cands {
		if e := &c.cands[i]; e.ID == id && e.BlockSize > 0 {
			return e.BlockSize
		}
	}
	return c.block
}

// keysOf is the prompt's chain keys at engine id's block size (c.keys
// unless the prompt was keyed per size), nil for a size not keyed.
func (c *call) keysOf(id string) []uint64 {
	if len(c.chains) == 0 {
		return c.keys
	}
	bs := c.blockOf(id)
	if bs == c.block {
		return c.keys
	}
	for i := range c.chains {
		if c.chains[i].BlockSize == bs {
			return c.chains[i].Keys
		}
	}
	return nil
}

// addLocalLoad adds to eng, an engine as gossip describes it, what this
// replica knows of it itself: its requests in flight here, the prompt
// tokens they charge to its prefill and active set, the KV they hold there
// (a prefix they share once), and, when gossip carries no latencies,
// the TTFT and TPOT its streams here saw (latency.go). The scheduler ranks engines so (addCandidate), and
// /debug/engines shows them so (debug.go).
func addLocalLoad(eng *scheduler.Engine, up *upstream, now time.Time) {
	n, pre, act := up.load()
	eng.InFlight += n
	eng.LocalPrefillTokens, eng.LocalActiveTokens, eng.LocalKVTokens = pre, act, up.kvTokens()
	if eng.TTFT == 0 && eng.TPOT == 0 {
		eng.TTFT, eng.TPOT = up.lat.get(now)
	}
}

// estimateSlack is how far past the prompt limit an estimated count (about
// 4 bytes a token) must be for the ingress to refuse the prompt itself.
const estimateSlack = 4

// admit applies the prompt-length limit, the token rate limits and the
// admission queue.
func (c *call) admit(ctx *fasthttp.RequestCtx) error {
	s := c.s
	if c.promptTokens == 0 {
		c.promptTokens = len(c.tokens)
		if c.tokens == nil {
			c.promptTokens = c.approx
		}
	}
	promptTokens := c.promptTokens
	if lim := c.promptLimit(); lim > 0 {
		// A batch's limit is per prompt, as vLLM's (countBatchPrompt).
		// Without the prompt's tokens (c.tokens nil: no tokenizer here and
		// no engine's /tokenize answer; token ids are their own count) the
		// count is an estimate, about 4 bytes a token, and the refusal
		// says so rather than state it as the engine's count.
		// An estimate is held to estimateSlack × the engines' context: no
		// tokenizer averages 16 bytes a token, but code's runs of spaces go
		// well past 4, so a prompt the engine would take is not refused on
		// a guess; the engine refuses what it cannot hold. The operator's
		// MaxPromptTokens has no slack: no engine enforces it, so the
		// estimate is all the ingress has to hold it to.
		has, est, over := "has", "", lim
		if c.tokens == nil && (c.ep == epOther || c.req.kind != promptIDs) {
			has, est = "has about", " (an estimate: the ingress did not get the engine's tokens for it)"
			over = lim * estimateSlack
			if cp := s.cfg.MaxPromptTokens; cp > 0 {
				over = min(over, cp)
			}
		}
		if c.longest > over {
			return promptTooLong(c.ep, "the maximum context length is %d tokens, and prompt[%d] %s %d prompt tokens%s", lim, c.longestAt, has, c.longest, est)
		}
		if c.longest == 0 && promptTokens > over {
			return promptTooLong(c.ep, "the maximum context length is %d tokens, and the request %s %d prompt tokens%s", lim, has, promptTokens, est)
		}
	}
	if err := c.admitRoute(promptTokens); err != nil {
		return err
	}
	if s.deps.Limiter != nil {
		if err := c.admitBudget(promptTokens); err != nil {
			return err
		}
	}
	if s.deps.Admitter != nil {
		rel, err := c.acquire(ctx, promptTokens)
		if err != nil {
			if s.deps.ClassifyError != nil {
				err = s.deps.ClassifyError(err)
			}
			if !errors.Is(err, ErrClientGone) && (errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded)) {
				err = fmt.Errorf("%w: %w", ErrQueueTimeout, err)
			}
			return fmt.Errorf("admission: %w", err)
		}
		c.release = rel
		// Routed on the engines' load when admitted, not when it
		// arrived: requests that waited together in the admission queue
		// (up to its maxWait) would all carry the view of their arrival
		// and go to the engine that looked emptiest then, while others
		// sat idle. Read again after every admission: no wait is too
		// short to matter (a waiter woken a microsecond after it queued
		// was woken by a request that finished), and the read is the one
		// the request made on arrival (the engines' snapshot, no
		// allocation).
		return c.refreshCandidates()
	}
	return nil
}

// refreshCandidates reads the engines and this replica's load on them
// again, for a request that waited (admission, the hold) or moved to
// another pool (route.go).
func (c *call) refreshCandidates() error {
	c.cands, c.urls, c.ctxLens = c.cands[:0], c.urls[:0], c.ctxLens[:0]
	return c.candidates()
}

// fitContext takes out of routing the candidates whose context
// (max_model_len) is shorter than the request when another candidate's is
// long enough: engines of one model may run with different context
// lengths (--max-model-len per GPU type), and one too short refuses it
// (400). The request is the prompt and its max_tokens first, as vLLM
// refuses a max_tokens the context cannot hold after the prompt; when no
// candidate, live or not, holds both, the longest live context's (its
// refusal says the most the model can give). When the only engines whose
// context holds it are out of routing (down, ejected, not ready), the
// short ones are not tried: their 400 would tell the client the model's
// context is theirs, and the request succeeds once a long one is back; it
// is ErrNoEngine (503, Retry-After), naming the model and the tokens.
// When none holds the prompt the prompt limit refused the request already
// (admit), unless no engine reports a context or the prompt's count is an
// estimate within estimateSlack of the context (the engine then refuses
// it).
func (c *call) fitContext() error {
	n := c.longest // a batch's longest prompt
	if n == 0 {
		n = c.promptTokens
	}
	if !c.anyLive() {
		return nil // the scheduler finds none, and allOutOfRouting says why
	}
	need := n
	if m := c.req.maxTokens; m > 0 {
		need = n + m
		if !c.holds(need, false) {
			// No engine holds both: the longest live context's engines,
			// whose refusal names the most the model can give after this
			// prompt, when one holds the prompt.
			if longest := c.longestContext(); longest > 0 && c.holds(n, true) {
				c.fitOut(longest)
				return nil
			}
			need = n
		}
	}
	switch {
	case c.holds(need, true):
		c.fitOut(need)
	case c.holds(need, false):
		return c.noLiveContext(n, need)
	}
	return nil
}

// anyLive reports whether a candidate is healthy.
func (c *call) anyLive() bool {
	for i := range c.cands {
		if c.cands[i].Healthy {
			return true
		}
	}
	return false
}

// holds reports whether a candidate's context holds need tokens (a live
// one's, or any's when live is false); an engine that reports no context
// may hold anything.
func (c *call) holds(need int, live bool) bool {
	for i, l := range c.ctxLens {
		if (!live || c.cands[i].Healthy) && (l == 0 || need <= l) {
			return true
		}
	}
	return false
}

// noLiveContext is the 503 of a request of need tokens (a prompt of n and
// its max_tokens) that only engines out of routing hold.
func (c *call) noLiveContext(n, need int) error {
	held, live := 0, 0
	for i, l := range c.ctxLens {
		if c.cands[i].Healthy {
			live = max(live, l)
		} else if l == 0 || need <= l {
			held++
		}
	}
	what := fmt.Sprintf("%d tokens", need)
	if need > n {
		what = fmt.Sprintf("%d tokens (a prompt of %d and its max_tokens %d)", need, n, need-n)
	}
	return fmt.Errorf("%w: no live engine of the model %q takes %s right now: the %d whose context holds them are out of routing, "+
		"and the live ones' context is %d tokens; retry when one is back", ErrNoEngine, clip(c.model), what, held, live)
}

// longestContext is the longest context among the healthy candidates, 0
// when one of them reports none (it may hold anything).
func (c *call) longestContext() int {
	longest := 0
	for i, l := range c.ctxLens {
		if !c.cands[i].Healthy {
			continue
		}
		if l == 0 {
			return 0
		}
		longest = max(longest, l)
	}
	return longest
}

// fitOut takes out of routing the healthy candidates whose context is
// shorter than need when another's holds it, and reports whether it did.
func (c *call) fitOut(need int) bool {
	short, fits := false, false
	for i, l := range c.ctxLens {
		switch {
		case !c.cands[i].Healthy:
		case l > 0 && need > l:
			short = true
		default:
			fits = true
		}
	}
	if !short || !fits {
		return false
	}
	for i, l := range c.ctxLens {
		if l > 0 && need > l {
			c.cands[i].Healthy = false
		}
	}
	return true
}

// schedule computes the prompt's chain keys and ranks the engines: the
// policy, the hold's pick of an engine with room (hold.go), session
// affinity, then the P/D step.
func (c *call) schedule() error {
	s := c.s
	c.policyDone() // a reschedule: the earlier pick is over
	t := time.Now()
	served, adapter := c.adapterOf()
	c.chains = c.chains[:0]
	if c.tokens != nil {
		root := c.chainRoot()
		c.keys = kvevents.AppendKeys(c.keys[:0], root, c.tokens, c.block)
		// A model whose engines differ in block size: the prompt keyed
		// once per size too, each engine looked up with its own.
		for i := 1; i < min(c.sizes.n, maxKeyedSizes); i++ {
			bs := c.sizes.size[i]
			c.altKeys[i-1] = kvevents.AppendKeys(c.altKeys[i-1][:0], root, c.tokens, bs)
			c.chains = append(c.chains, scheduler.Chain{BlockSize: bs, Keys: c.altKeys[i-1]})
		}
	}
	if c.sizes.n > 1 {
		s.check.mixedBlockSizes(c, served)
	}
	c.sreq = scheduler.Request{
		Keys: c.keys, BlockSize: c.block, Chains: c.chains, PromptTokens: c.promptTokens, OutputTokens: s.outLens.estimate(served, c.req.maxTokens) * c.seqs,
		Model: served, LoRA: adapter, SessionID: string(c.req.sessionID), Now: t,
	}
	if s.deps.Affinity != nil && len(c.req.sessionID) > 0 {
		if eng, ok := s.deps.Affinity.Engine(c.sreq.SessionID); ok {
			c.sreq.SessionEngine = eng
		}
	}
	if err := c.fitContext(); err != nil {
		return err
	}
	if err := s.deps.Scheduler.Schedule(&c.sreq, c.cands, &c.dec); err != nil {
		if errors.Is(err, scheduler.ErrNoCandidates) {
			if out := c.allOutOfRouting(); out != nil {
				return out
			}
		}
		return fmt.Errorf("%w: %w", ErrNoEngine, err)
	}
	if len(c.dec.Ranked) == 0 {
		return fmt.Errorf("%w: scheduler ranked no engine", ErrNoEngine)
	}
	c.picked = c.dec.Engine
	c.holdPick() // hold.go: an engine with room first
	if c.sreq.SessionEngine != "" {
		c.keepSession()
	}
	if c.ep == epResponses {
		c.keepResponseEngine() // responses.go
	}
	if err := c.planPD(); err != nil {
		return err
	}
	c.tSchedule = time.Since(t)
	return nil
}

// keepSession moves the session's previous engine to the front of the
// ranking unless it is overloaded: more than Config.SessionSlack requests
// (in flight + waiting) above the least-loaded candidate, or its KV cache
// nearly full. The rest of the ranking stays as the policy made it, for retries.
func (c *call) keepSession() {
	at := -1
	for i := range c.dec.Ranked {
		if c.dec.Ranked[i].Engine == c.sreq.SessionEngine {
			at = i
			break
		}
	}
	if at <= 0 {
		return // gone, or already first
	}
	load := func(id string) (int, float64) {
		for i := range c.cands {
			if c.cands[i].ID == id {
				return c.cands[i].InFlight + c.cands[i].Waiting, c.cands[i].KVUsage
			}
		}
		return 0, 0
	}
	least := -1
	for i := range c.cands {
		if l := c.cands[i].InFlight + c.cands[i].Waiting; least < 0 || l < least {
			least = l
		}
	}
	mine, kv := load(c.sreq.SessionEngine)
	if mine-least > c.s.cfg.SessionSlack || kv >= 0.98 {
		return
	}
	r := c.dec.Ranked[at]
	copy(c.dec.Ranked[1:at+1], c.dec.Ranked[:at])
	c.dec.Ranked[0] = r
	c.dec.Engine, c.dec.Reason = r.Engine, "session-affinity"
}

// waitContext is the context of a wait in the router: it ends with the
// server's life or when the client closes its connection (waitCtx). The
// caller ends its watcher with c.wctx.stop once the wait is over.
func (c *call) waitContext(ctx *fasthttp.RequestCtx) context.Context {
	c.wctx.rc = ctx
	return &c.wctx
}

// reqBody is the client's body; set by proxy before use.
func (c *call) reqBody() []byte { return c.req.body }

// fail answers with an OpenAI error (Anthropic's on the Messages API:
// writeError).
func (c *call) fail(ctx *fasthttp.RequestCtx, err error) {
	orig := toAPIError(err)
	c.errMsg = logText(orig.msg, err) // proxy.go: the log keeps the engine's address (and id)
	// An answer the ingress refused for want of its own resources names no
	// engine: none was reached, and tools that count answers by the header
	// would hold it against one.
	named := c.engine != "" && !errors.Is(err, ErrLocalResources)
	if !c.s.cfg.EngineHeader {
		if msg := c.hideEngineIDs(orig.msg); msg != orig.msg {
			cp := *orig
			cp.msg = msg
			err = &cp
		}
	}
	ae := writeError(ctx, err)
	c.setRequestIDHeader(ctx) // upstreamhdr.go
	c.status = ae.status
	if named {
		c.s.setEngineHeader(ctx, c.engine)
	}
}

// hideEngineIDs is an error's client text without the ids of the request's
// engines ("engine 10.0.3.7:8000 answered 500" reads "the engine answered
// 500"), for Config.EngineHeader off: an engine's id may be its address.
func (c *call) hideEngineIDs(msg string) string {
	for i := range c.infos {
		if id := c.infos[i].ID; id != "" && strings.Contains(msg, id) {
			msg = strings.ReplaceAll(msg, "engine "+id, "the engine")
			msg = strings.ReplaceAll(msg, id, "an engine")
		}
	}
	return msg
}

// engineHeader is the answer header naming the engine that answered
// (Config.EngineHeader).
const engineHeader = "X-Kvmesh-Engine"

// setEngineHeader names engine id in the answer's X-Kvmesh-Engine, unless
// Config.EngineHeader is off: the id may be the engine's address.
func (s *Server) setEngineHeader(ctx *fasthttp.RequestCtx, id string) {
	if s.cfg.EngineHeader {
		ctx.Response.Header.Set(engineHeader, id)
	}
}

// finish records the request once: its engine's side (endEngine, unless
// sendAnswer ended it already), then its client's (endClient); then the
// call goes back to the pool. Nothing may touch c afterwards.
func (c *call) finish() {
	first := false
	c.finishOnce.Do(func() {
		first = true
		total := time.Since(c.start)
		c.endEngine(total)
		c.endClient(total)
	})
	if first {
		// Outside Do: Once writes its done flag after f returns, and a pooled
		// call may already be reset by the next request by then.
		c.s.reqPool.Put(c)
	}
}

// endEngine ends what describes the engine's part of the request, once:
// the hold's baton, the admission slot, the policy's record, the token
// budgets, session affinity and what is learned from the answer (output
// lengths, the time at the engine, token counts, SLO and latency
// samples). A streamed answer ends it as it ends (finish); a non-streamed
// one as it is handed to fasthttp (sendAnswer), so that a client slow to
// read its answer holds only its MaxConcurrent slot (endClient), not load
// its engine no longer carries. total is the request's time so far.
func (c *call) endEngine(total time.Duration) {
	if c.engineEnded {
		return
	}
	c.engineEnded = true
	s := c.s
	if c.watch != nil {
		c.watch.stop()
		c.watch = nil
	}
	c.wctx.stop() // stopped after each wait already; a no-op then
	c.passBaton() // hold.go: a request that ends before charging an engine
	if c.release != nil {
		c.release()
		c.release = nil
	}
	c.policyDone()
	c.settleBudget() // whatever the status

	if c.took || c.status == 200 {
		// One rule for both directions (kvmesh_ingress_tokens_total): a
		// request an engine took (c.status alone: a picker's answer,
		// pick.go), whatever became of its answer after (a client gone
		// mid-stream, an engine broken mid-stream). Its
		// prompt as counted (promptCount; a refused prompt, or a guess,
		// never), and the output its client was sent, as the access log
		// says it.
		if n, ok := c.promptCount(); ok {
			s.m.tokensIn.Add(float64(n))
		}
		s.m.tokensOut.Add(float64(c.outTokens))
	}
	if c.status != 200 {
		return
	}
	if s.deps.Affinity != nil && len(c.req.sessionID) > 0 && c.engine != "" {
		s.deps.Affinity.Remember(string(c.req.sessionID), c.engine)
	}
	perPrompt := c.outTokens / max(1, c.seqs)  // one sequence's answer
	s.outLens.observe(c.sreq.Model, perPrompt) // outlen.go
	if s.outs != nil && perPrompt > 0 && !c.sentAt.IsZero() {
		// The answer's length, weighted by its time at the engine (pd.OutputDist).
		s.outs.Observe(c.sreq.Model, perPrompt, time.Since(c.sentAt).Seconds())
	}
	if c.media > 0 {
		s.media.observe(c.model, c.media, c.textToks, c.engPrompt)
	}
	s.check.observe(c) // tokencheck.go
	if s.slo != nil {
		s.slo.observeCall(c, total)
	}
	if c.req.stream && perPrompt > 1 { // observe drops a zero TTFT or TPOT
		if up := s.ups.lookup(c.engine); up != nil {
			up.lat.observe(c.ttft, (total-c.ttft)/time.Duration(perPrompt-1))
		}
	}
}

// endClient ends the request's time in service, when its answer is
// written or its client is gone: the request metrics with its final status
// (499 when the client did not take a non-streamed answer), the access
// line, and its MaxConcurrent slot, in-flight count and body bytes.
// total is the request's whole time.
func (c *call) endClient(total time.Duration) {
	s := c.s
	ep := c.ep.String()
	s.m.requests.WithLabelValues(ep, s.m.status(c.status)).Inc()
	s.m.durationBy[c.ep].Observe(total.Seconds())
	if c.ttft > 0 && c.req.stream {
		// A streamed answer's first event; a non-streamed answer's first
		// byte comes with its last token, its whole time, and is left out:
		// the histogram reads as time to first token (docs/OPERATIONS.md).
		s.m.ttftBy[c.ep].Observe(c.ttft.Seconds())
	}
	if s.alog != nil {
		c.logAccess(total)
	}
	c.releaseBody() // bodybudget.go
	s.m.inflight.Dec()
	s.inflight.Add(-1)
}

// policyDone reports the end of the request the policy picked an engine
// for to a scheduler whose policy tracks its requests (scheduler.Finisher:
// Dynamo's active sequences), with the keys it was scheduled with.
func (c *call) policyDone() {
	if c.picked == "" {
		return
	}
	if f, ok := c.s.deps.Scheduler.(scheduler.Finisher); ok {
		f.Finished(c.picked, c.keys)
	}
	c.picked = ""
}

// promptCount is the request's prompt tokens as counted (the access log's
// prompt_tokens, kvmesh_ingress_tokens_total{direction="in"}): a generation
// request's as tokenized for routing; an endpoint passed through
// (passthrough.go) only by the usage its engine's answer reported, never by
// the size estimate its limits and load charge use (ok false: not known).
func (c *call) promptCount() (n int, ok bool) {
	if c.ep == epOther {
		return c.engPrompt, c.engPrompt > 0
	}
	return c.promptTokens, true
}

// loggedBlocks is the prompt's full blocks at the chosen engine's block
// size, the unit of its match (the access log's matched_*): with the prompt
// keyed per size, the most common size's count (len(c.keys)) made a
// block-32 engine's full hit read as half a prompt (tester h-reg8 F4).
func (c *call) loggedBlocks() int {
	if keys := c.keysOf(c.engine); keys != nil || len(c.chains) == 0 {
		return len(keys)
	}
	return len(c.tokens) / max(c.blockOf(c.engine), 1) // a size not keyed
}

func (c *call) logAccess(total time.Duration) {
	prompt, promptKnown := c.promptCount()
	_, adapter := c.adapterOf()
	attrs := [...]slog.Attr{
		slog.String("ingress", c.s.cfg.ID),
		slog.String("request_id", string(c.requestID())),
		slog.String("endpoint", c.ep.String()),
		slog.String("model", clip(c.model)),   // clip.go: client-chosen strings are bounded
		slog.String("adapter", clip(adapter)), // the LoRA adapter named, "" for a base model (a route's: model is its pool)
		slog.Int("status", c.status),
		slog.String("engine", c.engine),
		slog.String("policy", c.dec.Policy),
		slog.String("reason", c.dec.Reason),
		slog.Int("attempts", c.attempts),
		slog.Int("blocks", c.loggedBlocks()), // in the engine's blocks, as matched_*
		slog.Int("matched_gpu", c.match.GPU),
		slog.Int("matched_cpu", c.match.CPU-c.match.GPU),
		slog.Int("matched_other", c.match.Other-c.match.CPU),
		slog.Int("matched_spec", c.match.Spec-c.match.Other),
		slog.Int("prompt_tokens", prompt), // dropped below when not known (promptCount)
		slog.Int("output_tokens", c.outTokens),
		slog.Bool("stream", c.req.stream),
		slog.String("key", c.keyID),
		slog.String("session", clipBytes(c.req.sessionID)),
		slog.Float64("parse_ms", ms(c.tParse)),
		slog.Float64("tokenize_ms", ms(c.tTokenize)),
		slog.Float64("schedule_ms", ms(c.tSchedule)),
		slog.Float64("ttft_ms", ms(c.ttft)),
		slog.Float64("total_ms", ms(total)),
		slog.String("pd_mode", c.servedPDMode()), // pd.go: as served (fallback: planned disaggregated, served whole)
		slog.String("pd_planned", c.pd.plan.Mode.String()),
		slog.String("prefill_engine", c.prefillEngine()),
		slog.String("prefill_result", c.pd.result),
		slog.Float64("prefill_ms", ms(c.pd.duration)),
		slog.String("prefill_planned", c.pd.planned),
		slog.String("error", c.errMsg),
		{}, // engine_request_id when the engine answered another id
	}
	n := len(attrs) - 1
	if !promptKnown {
		// An estimate is no count: the field is left out (promptAttr: its index).
		copy(attrs[promptAttr:n], attrs[promptAttr+1:n])
		n--
	}
	if len(c.engineReqID) > 0 {
		attrs[n], n = slog.String("engine_request_id", string(c.engineReqID)), n+1
	}
	c.s.alog.LogAttrs(context.Background(), slog.LevelInfo, "request", attrs[:n]...)
}

// promptAttr is prompt_tokens's index in logAccess's attributes.
const promptAttr = 15

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
