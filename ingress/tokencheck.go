package ingress

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/scheduler/pd"
)

// Checking the ingress's tokens against the engine's answers.
//
// In chat mode "chat" (the default), and for the Messages and Responses
// APIs, the engine renders and tokenizes each chat request itself. The
// ingress's block keys match the engine's cache only if both produced the
// same tokens: the same tokenizer revision, the same chat template, the
// same template defaults. When they do not, nothing fails: routing goes on
// with keys no engine ever holds, by load alone, and hit rates quietly
// fall. So for every answered text-only chat request the engine tokenized,
// the ingress compares its own prompt token count with the one the
// engine's usage reports (streams too: the ingress asks for the usage
// chunk), counts the answers that agree and those that differ, and warns
// at most once a minute per model with both counts. Equal counts are
// evidence, not proof (different tokens can add up the same); a different
// count is proof. Several in a row switch the model's chat to the
// engines' /tokenize for a while (enginetok.go).
//
// Where answers report cached prompt tokens (vLLM with
// --enable-prompt-tokens-details, SGLang, the simulator, the Messages
// API's cache_read_input_tokens), it also sums the tokens the router
// expected the chosen engine to hold for the request (its matched blocks,
// confirmed or speculative) and the tokens the engine reported: their
// ratio is how well routing's picture of the caches matches them.

// tokenCheckWarnEvery spaces the warnings about one model.
const tokenCheckWarnEvery = time.Minute

// After differStreak different counts in a row for a model, its chat is
// keyed on the engines' /tokenize (enginetok.go) for engineSpell, then the
// ingress tries its own tokens again. A chat template the engine was
// started with (vLLM's --chat-template, e.g. a tool-calling template) and
// the sidecars do not publish is the common cause; the engine's own
// rendering keys it right.
const (
	differStreak = 3
	engineSpell  = 10 * time.Minute
)

// Where the ingress sends its own tokens (a text prompt it tokenized goes
// to the engine as token ids; chat in chatMode completions), a tokenizer
// that differs from the engine's would change what the model reads, and no
// count in the answer shows it. So once per verifyEvery per model a
// request's own ids are compared, id for id, with the engine's /tokenize
// (one extra round trip for that request): if they differ, the model's
// requests are keyed on the engine's tokens and sent as the client wrote
// them for engineSpell, with a warning naming the first differing token.
// Chat completions are verified too: equal counts can hide different ids.
const verifyEvery = 10 * time.Minute

// tokenCheck holds the comparison's series and each model's state.
type tokenCheck struct {
	equal, differ            prometheus.Counter
	predicted, cached        prometheus.Counter
	vEqual, vDiffer, vFailed prometheus.Counter
	models                   sync.Map // model → *modelCheck
	// mixedBlocks counts routing decisions among engines of one model
	// that report different block sizes (handler.go, blockSizes).
	mixedBlocks prometheus.Counter
}

// modelCheck is one model's recent comparisons.
type modelCheck struct {
	streak      atomic.Int32 // different counts in a row
	engineUntil atomic.Int64 // monotime reading until which chat is keyed on the engines' /tokenize (0: never)
	warned      atomic.Int64 // monotime reading of the last warning
	verified    atomic.Int64 // monotime reading of the last comparison with an engine's /tokenize
	// mixedSizes is the set of block sizes (blockSizes.set) its engines'
	// last mixed-size warning named, at mixedWarned (monotime; 0: never).
	mixedSizes  atomic.Uint64
	mixedWarned atomic.Int64
}

func (tc *tokenCheck) model(name string) *modelCheck {
	if v, ok := tc.models.Load(name); ok {
		return v.(*modelCheck)
	}
	v, _ := tc.models.LoadOrStore(name, new(modelCheck))
	return v.(*modelCheck)
}

// engineFirst reports whether model's chat is keyed on the engines'
// /tokenize now, its own tokens having disagreed with theirs.
func (tc *tokenCheck) engineFirst(model string) bool {
	v, ok := tc.models.Load(model)
	return ok && monotime.Now() < v.(*modelCheck).engineUntil.Load()
}

func newTokenCheck(reg prometheus.Registerer, constLabels prometheus.Labels) *tokenCheck {
	checks := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_prompt_token_checks_total",
		Help: "Text-only chat requests the engine tokenized itself whose answer reported its prompt tokens, by whether " +
			"that count equals the ingress's (differ: the ingress's keys cannot match the engine's cache).",
		ConstLabels: constLabels}, []string{"result"})
	cached := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_cached_prompt_tokens_total",
		Help: "Over answers that report cached prompt tokens: the tokens the router expected the chosen engine to " +
			"hold (predicted) and the tokens the engine reported cached (engine).",
		ConstLabels: constLabels}, []string{"source"})
	verify := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_tokenizer_verifications_total",
		Help: "Comparisons of the ingress's own token ids for a prompt with an engine's /tokenize (one per model every " +
			"10 minutes), by result (differ: the model's requests use the engine's tokens for a while).",
		ConstLabels: constLabels}, []string{"result"})
	mixed := prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_mixed_block_size_decisions_total",
		Help: "Routing decisions among engines of one model that report different KV block sizes: the prompt was keyed " +
			"once per size (at most 4, the most common; an engine of another size gets no prefix match).",
		ConstLabels: constLabels})
	reg.MustRegister(checks, cached, verify, mixed)
	return &tokenCheck{mixedBlocks: mixed, equal: checks.WithLabelValues("equal"), differ: checks.WithLabelValues("differ"),
		predicted: cached.WithLabelValues("predicted"), cached: cached.WithLabelValues("engine"),
		vEqual: verify.WithLabelValues("equal"), vDiffer: verify.WithLabelValues("differ"), vFailed: verify.WithLabelValues("failed")}
}

// verifyTokens compares c's own token ids with an engine's /tokenize when
// the model is due (verifyEvery); false when they differ: c.tokens then
// holds the engine's ids, and the model uses the engine's tokens for
// engineSpell.
func (c *call) verifyTokens() bool {
	tc := c.s.check
	mc := tc.model(c.model)
	now := time.Now()
	last := mc.verified.Load()
	if last != 0 && monotime.Of(now)-last < int64(verifyEvery) || !mc.verified.CompareAndSwap(last, monotime.Of(now)) {
		return true
	}
	ids, ok := c.engineTokens(c.scratch[:0])
	c.scratch = ids
	if !ok {
		tc.vFailed.Inc() // asked again after verifyEvery: a failing engine must not slow every request
		return true
	}
	if slices.Equal(ids, c.tokens) {
		tc.vEqual.Inc()
		return true
	}
	tc.vDiffer.Inc()
	at := 0
	for at < len(ids) && at < len(c.tokens) && ids[at] == c.tokens[at] {
		at++
	}
	mc.engineUntil.Store(monotime.Of(now) + int64(engineSpell))
	c.s.log.Warn("this ingress's tokenizer gives other token ids than the engine's for the same prompt: the model's requests use the "+
		"engine's /tokenize and go as the client wrote them for a while; check the tokenizer the ingress loads (docs/TOKENIZER.md)",
		"model", c.model, "ingress_tokens", len(c.tokens), "engine_tokens", len(ids), "first_difference_at", at, "for", engineSpell)
	c.tokens = append(c.tokens[:0], ids...)
	return false
}

// Usage members that count cached prompt tokens: OpenAI's
// prompt_tokens_details / the Responses API's input_tokens_details, and
// the Messages API's.
var cachedTokensKey = []byte(`"cached_tokens":`)

// usageCachedTokens finds the cached prompt tokens in an answer or in
// stream events for endpoint ep; ok is false when b reports none.
func usageCachedTokens(ep endpoint, b []byte) (n int, ok bool) {
	key := cachedTokensKey
	if ep == epMessages {
		key = cacheReadKey
	}
	i := bytes.LastIndex(b, key)
	if i < 0 {
		return 0, false
	}
	return uintAt(b, i+len(key)), true
}

// readUsage takes the prompt and cached token counts from an answer, or
// from stream events, when c needs them (a media request's learning, the
// check above).
func (c *call) readUsage(b []byte) {
	if c.tokens == nil && c.media == 0 || len(c.req.batch) > 1 || !hasUsage(b) {
		return // a media request keyed on nothing (its first item comes first) still learns its items' tokens
	}
	if n := usagePromptTokens(c.ep, b); n > 0 {
		c.engPrompt = n
	}
	if n, ok := usageCachedTokens(c.ep, b); ok {
		c.engCached, c.engCachedOK = n, true
	}
}

var usageKey = []byte(`"usage":`)

// hasUsage reports whether b holds a usage object (not "usage":null, which
// every other chunk of a chat stream carries): one scan per streamed chunk
// instead of one per member read.
func hasUsage(b []byte) bool { return memberStarts(b, usageKey, '{') }

// memberStarts reports whether b holds key (a quoted member name and its
// colon) followed by a value whose first byte is c: a scan of raw event
// bytes, no JSON decoded.
func memberStarts(b, key []byte, c byte) bool {
	for i := 0; ; {
		j := bytes.Index(b[i:], key)
		if j < 0 {
			return false
		}
		i += j + len(key)
		if k := jsonscan.SkipWS(b, i); k < len(b) && b[k] == c {
			return true
		}
	}
}

// observe compares a finished call's counts with the engine's.
func (tc *tokenCheck) observe(c *call) {
	if c.media > 0 || c.tokens == nil || c.engPrompt == 0 {
		return
	}
	if c.req.kind == promptChat && !c.wrap {
		n := len(c.tokens)
		mc := tc.model(c.model)
		if c.engPrompt == n {
			tc.equal.Inc()
			if c.ep == epChat {
				mc.streak.Store(0)
			}
		} else {
			tc.differ.Inc()
			tc.warn(c, mc, n)
			// Only chat counts toward the switch: on the Messages and
			// Responses APIs a difference may be the ingress's conversion to
			// chat, which the engine's /tokenize would repeat.
			if c.ep == epChat && mc.streak.Add(1) >= differStreak && c.canTokenizeOnEngine() {
				now := monotime.Now()
				if until := mc.engineUntil.Load(); until < now && mc.engineUntil.CompareAndSwap(until, now+int64(engineSpell)) {
					c.s.log.Warn("this model's chat is keyed on its engines' /tokenize for a while: the ingress's own tokens differed from the engine's "+
						"several times in a row", "model", c.model, "for", engineSpell, "in_a_row", mc.streak.Load())
				}
			}
		}
	}
	if bs := c.blockOf(c.engine); c.engCachedOK && bs > 0 && c.pd.plan.Mode != pd.Disaggregated {
		// The engine computes at least the prompt's last token, in whole
		// blocks (vLLM, the simulator) of its own size.
		limit := (c.engPrompt - 1) / bs
		tc.predicted.Add(float64(min(c.match.Spec, limit) * bs))
		tc.cached.Add(float64(c.engCached))
	}
}

// mixedBlockSizes counts a decision among engines of model that report
// different block sizes, and warns about the model when the set of sizes
// differs from the one it last warned of, at most once per
// tokenCheckWarnEvery: sidecars learn their engines' sizes from the first
// KV events, so the first mixed decision may see only some of them, and a
// size learned later (a fifth, which gets no prefix match) was never
// warned of (tester h-reg8 F3). A change within the interval is warned of
// once it has passed.
func (tc *tokenCheck) mixedBlockSizes(c *call, model string) {
	tc.mixedBlocks.Inc()
	mc := tc.model(model)
	b := &c.sizes
	set := b.set()
	if mc.mixedSizes.Load() == set {
		return
	}
	now := monotime.Now()
	prev := mc.mixedWarned.Load()
	if prev != 0 && now-prev < int64(tokenCheckWarnEvery) || !mc.mixedWarned.CompareAndSwap(prev, now) {
		return
	}
	mc.mixedSizes.Store(set)
	sizes := make([]string, b.n)
	for i := range b.n {
		sizes[i] = fmt.Sprintf("%d (%d engines)", b.size[i], b.count[i])
	}
	msg := "this model's engines report different KV block sizes: the ingress keys each prompt once per size and " +
		"looks each engine up with its own (docs/OPERATIONS.md, Block size)"
	if b.n > maxKeyedSizes || b.over {
		msg = "this model's engines report more than 4 KV block sizes: the ingress keys each prompt at the 4 most common " +
			"and engines of the other sizes get no prefix match, routed by load alone (docs/OPERATIONS.md, Block size)"
	}
	c.s.log.Warn(msg, "model", model, "block_sizes", strings.Join(sizes, ", "))
}

// set is a fingerprint of the distinct sizes counted and whether any was
// left out, whatever their order and counts (never 0).
func (b *blockSizes) set() uint64 {
	h := uint64(1)
	if b.over {
		h = 2
	}
	for i := range b.n {
		x := uint64(b.size[i]) * 0x9e3779b97f4a7c15 // splitmix64's finalizer
		x = (x ^ x>>30) * 0xbf58476d1ce4e5b9
		x = (x ^ x>>27) * 0x94d049bb133111eb
		h ^= x ^ x>>31
	}
	return h | 1<<63
}

func (tc *tokenCheck) warn(c *call, mc *modelCheck, n int) {
	last := &mc.warned
	now := monotime.Now()
	prev := last.Load()
	if prev != 0 && now-prev < int64(tokenCheckWarnEvery) || !last.CompareAndSwap(prev, now) {
		return
	}
	c.s.log.Warn("the engine tokenized a chat request differently from this ingress, so its block keys cannot match the engine's cache; "+
		"check that the ingress loads the tokenizer and chat template the engine serves (docs/TOKENIZER.md), or set chatMode: completions; "+
		"after a few in a row this model's chat is keyed on the engines' /tokenize for a while",
		"model", c.model, "engine", c.engine, "endpoint", c.ep.String(), "ingress_tokens", n, "engine_tokens", c.engPrompt)
}

// handleDebugTokenizers is the admin listener's /debug/tokenizers: for each
// model this replica has compared with its engines, when its ids were last
// compared with an engine's /tokenize, how many different counts came in a
// row, and until when its requests use the engines' tokens (or the engines'
// /tokenize is not asked, having none).
func (s *Server) handleDebugTokenizers(ctx *fasthttp.RequestCtx) {
	type modelState struct {
		Verified          *time.Time `json:"last_verified,omitempty"`
		DifferInARow      int32      `json:"different_counts_in_a_row"`
		EngineTokensUntil *time.Time `json:"engine_tokens_until,omitempty"`
		NoTokenizeUntil   *time.Time `json:"engine_tokenize_off_until,omitempty"`
	}
	now := monotime.Now()
	at := func(ns int64, future bool) *time.Time {
		if ns == 0 || future && ns <= now {
			return nil
		}
		t := monotime.Time(ns).UTC()
		return &t
	}
	out := map[string]*modelState{}
	s.check.models.Range(func(k, v any) bool {
		mc := v.(*modelCheck)
		var verified *time.Time
		if ns := mc.verified.Load(); ns != 0 {
			t := monotime.Time(ns).UTC()
			verified = &t
		}
		out[k.(string)] = &modelState{Verified: verified, DifferInARow: mc.streak.Load(), EngineTokensUntil: at(mc.engineUntil.Load(), true)}
		return true
	})
	s.etok.models.Range(func(k, v any) bool {
		if until := at(v.(*tokModel).off.Load(), true); until != nil {
			ms := out[k.(string)]
			if ms == nil {
				ms = &modelState{}
				out[k.(string)] = ms
			}
			ms.NoTokenizeUntil = until
		}
		return true
	})
	writeJSON(ctx, map[string]any{"models": out, "engine_tokenize_timeout": s.cfg.EngineTokenizeTimeout.String()})
}
