package ingress

import (
	"bytes"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/monotime"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// Tokenizing on an engine.
//
// A model the ingress cannot tokenize itself used to be routed by load
// alone: no tokenizer configured or published for it (a sidecar that
// cannot read the engine's model files), a tokenizer.json with a component
// Native lacks, a chat template that does not parse or render here. vLLM
// serves POST /tokenize, which renders a chat request with the engine's
// own template and tokenizer (its mistral tokenizer mode too) and returns
// the prompt's token ids. So for such a request the ingress asks one of
// the model's engines (the least loaded it is allowed to send to) for the
// prompt's tokens and keys on them: the keys are the engine's by
// construction. It costs one round trip to an engine's API server per
// such request, bounded by Config.EngineTokenizeTimeout plus
// tokenizePerKiB for each KiB of the /tokenize body (the prompt's own
// tokenizing time: tokenizeTimeout); any failure leaves the request
// unkeyed, as before. An engine that does not serve
// /tokenize (404, 405, 501), or failRun answered failures in a row (an
// error status, no tokens), turn it off for the model for
// engineTokenizeOff. A call that gets no answer in time (or no
// connection) is an engine under load or hung, not a missing endpoint:
// that engine is not asked for slowEngineBackoff, and the request asks the
// next one once (so one frozen engine, which the least-loaded pick can
// still win until the stall watch ejects it, costs one request one
// timeout, not the model its keys). A call that goes unanswered is held
// against the engine only for a prompt whose own allowance is at most
// EngineTokenizeTimeout (an ordinary prompt): a larger one's time is the
// prompt's, so one huge prompt (refused afterwards as too long, at no cost
// to its sender) does not pause the model's engines for every other
// client; that request goes unkeyed without asking another engine. It
// pauses only the model's prompts past the ordinary size: they do not ask
// its engines for a backoff of their own that starts at slowBackoff and
// doubles while it recurs (up to engineTokenizeOff), and a large prompt
// tokenized resets it; so an engine whose /tokenize hangs costs large
// prompts one timeout per pause, not each of them its whole allowance
// (1 s a MiB), while ordinary prompts are still asked. Nor is
// a call that failed for the ingress's own resources (a dial refused with
// EMFILE and the like: localErrno), which every engine would fail the
// same way. Only when two distinct engines of the
// model are in that backoff at once (the engines, not one of them, are
// slow) are the model's engines not asked, for a backoff that starts at
// slowBackoff and doubles while it recurs (up to engineTokenizeOff); a
// tokenized prompt resets it. Requests with media are not sent (the engine
// expands a media item into tokens /tokenize does not show), nor chat with
// documents (vLLM's /tokenize takes none); a batch of texts sends its first
// prompt, which routing keys on.

// engineTokenizeOff is how long a model's engines are not asked again
// after one answered that it has no /tokenize, or after failRun answered
// failures in a row (an engine whose /tokenize takes no chat messages): a
// failing fallback must not cost every request a round trip. slowBackoff
// is the first pause of the model after two of its engines went
// unanswered (a burst: a few seconds without prefix-aware routing, not five
// minutes); slowEngineBackoff is how long one engine that went unanswered
// is not asked.
const (
	engineTokenizeOff = 5 * time.Minute
	slowBackoff       = 5 * time.Second
	slowEngineBackoff = 5 * time.Second
	failRun           = 3
)

// tokenizePerKiB is the time a /tokenize call is given for each KiB of its
// body on top of EngineTokenizeTimeout: 1 s a MiB, where a healthy engine
// renders and tokenizes several MB a second (the simulator 2 MB in 0.15 s;
// vLLM's fast tokenizers 1-10 MB/s), so a long prompt's own tokenizing is
// not read as a slow engine.
const tokenizePerKiB = time.Millisecond

// tokenizeTimeout is the bound of a /tokenize call with an n-byte body, and
// whether the body is ordinary: its own allowance (tokenizePerKiB) is at
// most base, so the call's time is mostly the engine's, and a call that
// goes unanswered says the engine is slow. A larger body's timeout says no
// more than that the prompt is large.
func tokenizeTimeout(base time.Duration, n int) (d time.Duration, ordinary bool) {
	own := time.Duration(n) * tokenizePerKiB / 1024
	return base + own, own <= base
}

// tokFailure is how an ask for tokens failed.
type tokFailure int

const (
	tokSlow        tokFailure = iota // no answer within the timeout, or no connection: an engine under load
	tokRefused                       // an answer with an error status or without tokens
	tokUnsupported                   // 404, 405, 501: the engine has no /tokenize
	tokOwn                           // no connection for want of the ingress's own resources: not the engine's fault
	tokLarge                         // no answer for a prompt past the ordinary size: pauses the model's large prompts only
)

// engineTok holds the fallback's state and series.
type engineTok struct {
	models            sync.Map // model → *tokModel
	ok, failed, unsup prometheus.Counter
	now               func() time.Time // time.Now; tests set it
}

// tokModel is one model's fallback state. off moves from past to future
// by CompareAndSwap only, so one failure turns the fallback off (and warns)
// however many fail at once.
type tokModel struct {
	off     atomic.Int64 // monotime reading until which the model's engines are not asked (0: never off)
	fails   atomic.Int32 // answered failures in a row
	backoff atomic.Int64 // the last pause after unanswered calls (0: none since a success)
	// The pause of prompts past the ordinary size (tokenizeTimeout) after
	// one went unanswered: such prompts do not ask the model's engines
	// until largeOff (a monotime reading; 0: never paused); largeBackoff
	// is the last such pause (0: none since a large prompt was tokenized).
	largeOff     atomic.Int64
	largeBackoff atomic.Int64

	mu   sync.Mutex
	slow map[string]time.Time // engine → until when it is not asked (it went unanswered)
}

// slowEngine reports whether engine is in its backoff at now.
func (tm *tokModel) slowEngine(engine string, now time.Time) bool {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	until, ok := tm.slow[engine]
	return ok && now.Before(until)
}

// markSlow starts engine's backoff and returns how many engines of the
// model are in theirs (expired ones are forgotten).
func (tm *tokModel) markSlow(engine string, now time.Time) int {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	if tm.slow == nil {
		tm.slow = make(map[string]time.Time)
	}
	tm.slow[engine] = now.Add(slowEngineBackoff)
	for id, until := range tm.slow {
		if !now.Before(until) {
			delete(tm.slow, id)
		}
	}
	return len(tm.slow)
}

// answered ends engine's backoff: it tokenized a prompt.
func (tm *tokModel) answered(engine string) {
	tm.mu.Lock()
	delete(tm.slow, engine)
	tm.mu.Unlock()
}

func (et *engineTok) model(name string) *tokModel {
	if v, ok := et.models.Load(name); ok {
		return v.(*tokModel)
	}
	v, _ := et.models.LoadOrStore(name, new(tokModel))
	return v.(*tokModel)
}

// asking reports whether the model's engines may be asked now.
func (et *engineTok) asking(model string) bool {
	v, ok := et.models.Load(model)
	return !ok || monotime.Of(et.now()) >= v.(*tokModel).off.Load()
}

// succeeded resets the model's runs and backoff, and engine's, after a
// tokenized prompt; a large one (past the ordinary size) also ends the
// pause of large prompts and resets its backoff.
func (et *engineTok) succeeded(model, engine string, large bool) {
	tm := et.model(model)
	tm.fails.Store(0)
	tm.backoff.Store(0)
	if large {
		tm.largeBackoff.Store(0)
		tm.largeOff.Store(0)
	}
	tm.answered(engine)
}

// askingLarge reports whether a prompt past the ordinary size may ask the
// model's engines now (they are not in the pause of large prompts).
func (tm *tokModel) askingLarge(now time.Time) bool {
	return monotime.Of(now) >= tm.largeOff.Load()
}

// fail counts a failed ask for c's model and turns the fallback off for it
// at once when unsupported, for engineTokenizeOff after failRun answered
// failures in a row, and for the next backoff once an unanswered call makes
// two engines of the model slow at once (a single slow engine is only kept
// from being asked for slowEngineBackoff); one warning per turn off. A
// tokOwn failure is only counted: it is neither the engine's nor the
// model's. A tokLarge one pauses only the model's large prompts
// (pauseLarge).
func (et *engineTok) fail(c *call, engine string, kind tokFailure, why any) {
	tm := et.model(c.model)
	var d time.Duration
	switch kind {
	case tokUnsupported:
		et.unsup.Inc()
		d = engineTokenizeOff
	case tokOwn:
		et.failed.Inc()
		c.s.log.Debug("engine /tokenize failed for the ingress's own resources; not held against the engine",
			"model", c.model, "engine", engine, "why", why)
		return
	case tokLarge:
		et.failed.Inc()
		et.pauseLarge(c, tm, engine, why)
		return
	case tokRefused:
		et.failed.Inc()
		c.s.log.Debug("engine /tokenize failed; the request keeps the ingress's own keys or none", "model", c.model, "engine", engine, "why", why)
		if tm.fails.Add(1) < failRun {
			return
		}
		d = engineTokenizeOff
	default:
		et.failed.Inc()
		c.s.log.Debug("engine /tokenize did not answer in time; the engine is not asked for a while", "model", c.model, "engine", engine, "why", why,
			"retry_in", slowEngineBackoff)
		if tm.markSlow(engine, et.now()) < 2 {
			return
		}
		d = min(max(2*time.Duration(tm.backoff.Load()), slowBackoff), engineTokenizeOff)
	}
	now := monotime.Of(et.now())
	until := now + int64(d)
	for {
		old := tm.off.Load()
		if old > now && (kind != tokUnsupported || old >= until) {
			// Off already: a call that was asked before it went off (a
			// burst's others) changes nothing. Only a missing /tokenize
			// lengthens a short pause.
			return
		}
		if tm.off.CompareAndSwap(old, until) {
			break
		}
	}
	tm.fails.Store(0)
	if kind == tokSlow {
		tm.backoff.Store(int64(d))
	}
	c.s.log.Warn("the model's engines are not asked to tokenize for a while: requests the ingress cannot tokenize are routed by load, unkeyed",
		"model", c.model, "engine", engine, "unsupported", kind == tokUnsupported, "unanswered", kind == tokSlow, "why", why, "retry_in", d)
}

// pauseLarge starts the pause of tm's prompts past the ordinary size
// after one went unanswered: slowBackoff, doubling while it recurs, up to
// engineTokenizeOff; one warning per pause. A call asked before the pause
// began (a burst's others) changes nothing.
func (et *engineTok) pauseLarge(c *call, tm *tokModel, engine string, why any) {
	now := monotime.Of(et.now())
	for {
		old := tm.largeOff.Load()
		if old > now {
			return
		}
		d := min(max(2*time.Duration(tm.largeBackoff.Load()), slowBackoff), engineTokenizeOff)
		if tm.largeOff.CompareAndSwap(old, now+int64(d)) {
			tm.largeBackoff.Store(int64(d))
			c.s.log.Warn("the model's engines are not asked to tokenize prompts past the ordinary size for a while: one went unanswered; such requests are routed by load, unkeyed, and ordinary prompts are still asked",
				"model", c.model, "engine", engine, "why", why, "retry_in", d)
			return
		}
	}
}

func newEngineTok(reg prometheus.Registerer, constLabels prometheus.Labels) *engineTok {
	v := prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_engine_tokenize_total",
		Help: "Requests the ingress could not tokenize itself whose prompt an engine's /tokenize tokenized, by result " +
			"(ok: keyed on the engine's tokens; failed and unsupported: routed unkeyed).",
		ConstLabels: constLabels}, []string{"result"})
	reg.MustRegister(v)
	return &engineTok{ok: v.WithLabelValues("ok"), failed: v.WithLabelValues("failed"), unsup: v.WithLabelValues("unsupported"), now: time.Now}
}

// keylessPolicy names the policies that route without looking at keys:
// tokenizing on an engine would buy them nothing.
var keylessPolicy = map[string]bool{"random": true, "round-robin": true, "least-request": true}

// mediaMarks are the content-part members that carry media.
var mediaMarks = [][]byte{[]byte(`"image_url"`), []byte(`"input_image"`), []byte(`"input_audio"`), []byte(`"audio_url"`),
	[]byte(`"video_url"`), []byte(`"image_embeds"`), []byte(`"audio_embeds"`)}

// tokenizeOnEngine fills c.tokens from an engine's /tokenize for a text
// prompt or a chat request the ingress cannot tokenize; false leaves the
// request unkeyed.
func (c *call) tokenizeOnEngine() bool {
	if !c.canTokenizeOnEngine() {
		return false
	}
	ids, ok := c.engineTokens(c.tokens[:0])
	if ok {
		c.tokens = ids
		c.s.etok.ok.Inc()
	}
	return ok
}

// engineTokens appends the token ids an engine's /tokenize gives for c's
// prompt to dst; false when it is off, cannot be asked or fails.
func (c *call) engineTokens(dst []uint32) ([]uint32, bool) {
	s := c.s
	et := s.etok
	if et == nil || s.cfg.EngineTokenizeTimeout <= 0 {
		return dst, false
	}
	if !et.asking(c.model) {
		return dst, false
	}
	body := c.engineTokenizeBody()
	if body == nil {
		return dst, false
	}
	tm := et.model(c.model)
	if _, ordinary := tokenizeTimeout(s.cfg.EngineTokenizeTimeout, len(body)); !ordinary && !tm.askingLarge(et.now()) {
		return dst, false // large prompts are paused: one went unanswered
	}
	skip := -1 // an engine that went unanswered for this request
	for range 2 {
		// The least loaded engine of the model this replica may send to,
		// other than one in its backoff after an unanswered call.
		now := et.now()
		at := -1
		for i := range c.cands {
			if i == skip || !s.health.allowed(c.cands[i].ID) || tm.slowEngine(c.cands[i].ID, now) {
				continue
			}
			if at < 0 || c.cands[i].InFlight+c.cands[i].Waiting < c.cands[at].InFlight+c.cands[at].Waiting {
				at = i
			}
		}
		if at < 0 {
			return dst, false
		}
		ids, ok, slow := c.askTokenize(at, dst, body)
		if ok || !slow || !et.asking(c.model) {
			return ids, ok
		}
		skip = at // unanswered: the next engine, once
	}
	return dst, false
}

// askTokenize asks candidate at's /tokenize for body's tokens, appended to
// dst; slow reports a call that went unanswered (a timeout, no connection)
// for an ordinary prompt (tokenizeTimeout), not for the ingress's own
// resources (localErrno): the engine was slow, another may answer. One
// unanswered for a larger prompt pauses the model's large prompts
// (tokLarge).
func (c *call) askTokenize(at int, dst []uint32, body []byte) (ids []uint32, ok, slow bool) {
	s := c.s
	et := s.etok
	up, err := s.ups.get(c.cands[at].ID, c.urls[at])
	if err != nil {
		et.fail(c, c.cands[at].ID, tokRefused, err)
		return dst, false, false
	}
	req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
	defer func() { fasthttp.ReleaseRequest(req); fasthttp.ReleaseResponse(resp) }()
	req.Header.SetMethod(fasthttp.MethodPost)
	req.SetRequestURI(c.urls[at] + "/tokenize")
	req.SetHost(up.hc.Addr)
	req.Header.SetContentType("application/json")
	c.setUpstreamHeaders(&req.Header)
	req.SetBodyRaw(body)
	timeout, ordinary := tokenizeTimeout(s.cfg.EngineTokenizeTimeout, len(body))
	if err := up.hc.DoTimeout(req, resp, timeout); err != nil {
		if errno := localErrno(err); errno != 0 {
			et.fail(c, up.id, tokOwn, fmt.Errorf("no connection to engine %s for want of the ingress's own resources: %w", up.id, errno))
			return dst, false, false
		}
		if !ordinary {
			et.fail(c, up.id, tokLarge, fmt.Errorf("a %d-byte prompt (past the ordinary size) unanswered, timeout %v: %w", len(body), timeout, err))
			return dst, false, false
		}
		et.fail(c, up.id, tokSlow, err)
		return dst, false, true
	}
	switch st := resp.StatusCode(); {
	case st == fasthttp.StatusNotFound || st == fasthttp.StatusMethodNotAllowed || st == fasthttp.StatusNotImplemented:
		et.fail(c, up.id, tokUnsupported, fmt.Sprintf("status %d", st))
		return dst, false, false
	case st != fasthttp.StatusOK:
		et.fail(c, up.id, tokRefused, fmt.Sprintf("status %d", st))
		return dst, false, false
	}
	ids, ok = tokenizeAnswerIDs(dst, resp.Body())
	if !ok || len(ids) == len(dst) {
		et.fail(c, up.id, tokRefused, "no token ids in the answer")
		return dst, false, false
	}
	et.succeeded(c.model, up.id, !ordinary)
	return ids, true, false
}

// canTokenizeOnEngine reports whether asking an engine for tokens is on
// and could help c's routing.
func (c *call) canTokenizeOnEngine() bool {
	return c.s.etok != nil && c.s.cfg.EngineTokenizeTimeout > 0 && !keylessPolicy[c.s.cfg.Scheduler.Policy]
}

// engineTokenizeBody is the /tokenize body for c's prompt (vLLM's
// TokenizeCompletionRequest or TokenizeChatRequest), nil when the request
// cannot be tokenized there.
func (c *call) engineTokenizeBody() []byte {
	r := &c.req
	served, _ := c.adapterOf() // an adapter tokenizes as its base model, which every engine serving it knows
	b := append(c.scratchText[:0], `{"model":`...)
	b = openai.AppendString(b, served)
	switch r.kind {
	case promptText:
		b = append(b, `,"prompt":`...)
		if len(r.batch) > 1 {
			b = append(b, r.batch[0]...) // a batch: its first prompt, which routing keys on
		} else {
			b = append(b, c.reqBody()[r.promptStart:r.promptEnd]...)
		}
		if r.noSpecial {
			b = append(b, `,"add_special_tokens":false`...)
		}
	case promptChat:
		if len(r.documents) > 0 && string(r.documents) != "null" {
			return nil // vLLM's TokenizeChatRequest has no documents: its rendering would differ
		}
		for _, m := range mediaMarks {
			if bytes.Contains(r.messages, m) {
				return nil
			}
		}
		b = append(b, `,"messages":`...)
		b = append(b, r.messages...)
		for _, m := range [...]struct {
			key string
			val []byte
		}{{"tools", r.tools}, {"chat_template_kwargs", r.templateKwargs}} {
			if len(m.val) > 0 && string(m.val) != "null" {
				b = append(b, `,"`...)
				b = append(b, m.key...)
				b = append(b, `":`...)
				b = append(b, m.val...)
			}
		}
		if !r.addGenPrompt {
			b = append(b, `,"add_generation_prompt":false`...)
		}
		if r.continueFinal {
			b = append(b, `,"continue_final_message":true`...)
		}
	default:
		return nil
	}
	c.scratchText = append(b, '}')
	return c.scratchText
}

// tokenizeAnswerIDs appends the top-level "tokens" array of a /tokenize
// answer to dst; ok is false unless the answer is a JSON object with one.
func tokenizeAnswerIDs(dst []uint32, b []byte) (ids []uint32, ok bool) {
	ids = dst
	err := jsonscan.ScanMembers(b, func(key, b []byte, at int) (int, bool, error) {
		if ok || string(key) != "tokens" || b[at] != '[' {
			return 0, false, nil
		}
		var end int
		var err error
		ids, end, err = scanTokenIDs(dst, b, at)
		ok = err == nil
		return end, true, err
	}, func(key, val []byte, keyOff, valOff int) error { return nil })
	if err != nil {
		return dst, false
	}
	return ids, ok
}
