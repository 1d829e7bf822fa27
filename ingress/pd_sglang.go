package ingress

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/scheduler"
)

// SGLang's bootstrap protocol (docs/PD.md "SGLang bootstrap through the
// ingress"), for pairs whose prefill engine gossips PDProtocol "sglang":
//
//   - the same body goes to the prefill and the decode engine at once, with
//     bootstrap_host and bootstrap_port of the prefill engine's bootstrap
//     server and a random 63-bit bootstrap_room, as sgl-router's PD mode
//     does; the decode engine reads the room's KV from the prefill engine;
//   - the decode leg's answer is the client's (streamed or not, through the
//     proxy's relay, so the shapes are those of the aggregated path); the
//     prefill leg's answer is read and dropped by a goroutine that holds the
//     prefill engine's admission slot until it ends;
//   - a prefill leg that fails before its answer's head (the engine was
//     not reachable, hung until the stall watch cut it, or broke off) or
//     answers with a status other than 200 cuts the decode leg, which would
//     otherwise wait for the KV until its bootstrap timeout (a hung engine
//     keeps the bootstrap connection open);
//   - a decode leg that fails before its first byte is retried on the next
//     pair of the plan (another prefill engine), then served aggregated down
//     the ranking, prefill-role engines excluded. A decode failure caused by
//     its prefill leg does not count against the decode engine's health;
//   - a decode leg that fails because it could not read the room's KV (its
//     5xx is SGLang's "Decode transfer failed" or "Decode handshake failed"
//     abort, or the simulator's "KV transfer for bootstrap_room N failed":
//     kvTransferFailed) is the prefill side's failure (a wrong bootstrap
//     address, a dead bootstrap server), not the decode engine's: the
//     prefill engine is left out of prefill legs for noKVBackoff
//     (markLocked), unless the decode engine lately failed another prefill
//     engine's room as well (noTransfer: then the fault is the decode
//     engine's, held against its health). The prefill leg is cut if it
//     still runs (SGLang aborts a request whose client left, which frees
//     the room), and the request moves on as after any decode failure.
//
// sgl-router sends requests with n > 1 with arrays of bootstrap fields; the
// ingress serves them aggregated instead.

// maxSGLangPairs bounds the pairs one request tries before it is served
// aggregated.
const maxSGLangPairs = 2

// errNoBootstrap: the request cannot carry scalar bootstrap fields (n > 1).
var errNoBootstrap = errors.New("request needs several bootstrap rooms")

// sglangLeg links a running prefill leg to its decode leg. Lock rule: mu
// guards every field but w. The prefill goroutine cuts the decode leg only
// while open, and the handler closes it before the decode answer is
// relayed, so a cut never reaches a connection after the decode leg is
// over. Whichever of the two learns the other's outcome last settles the
// decode engine's health account (settle).
type sglangLeg struct {
	// w links the decode leg's upstream connection: the request's client
	// watcher (client true), whose attempt n the leg is, so a client that
	// leaves cuts the leg as it cuts an aggregated attempt; or, when the
	// client's connection cannot be watched, an unpooled legWatch.
	w      *watch
	n      uint64
	client bool
	// model is what both legs were sent (call.sentModel), read by the
	// prefill goroutine to tell a 404 denying it from a verdict on the
	// request (wrongmodel.go); set before the goroutine starts.
	model   string
	adapter bool
	// prefill and bootstrap name the prefill engine and its bootstrap
	// address (host:port as sent) for a room the decode leg could not read
	// (noTransfer); pw links the prefill leg's upstream connection, cut
	// then while the leg runs. Set before the goroutine starts.
	prefill, bootstrap string
	pw                 *watch

	mu       sync.Mutex
	open     bool
	cut      bool
	finished bool       // the prefill leg ended: res is its result
	res      legResult  // set before a cut, and when the leg ends
	dfail    decodeFail // the decode leg's failure, for the prefill goroutine to settle
	// answered: the prefill leg has its answer (or failed): pw is released
	// and no longer cut. dropped: the decode leg could not read the room
	// and cut the prefill leg (its failure is not the engine's health's).
	// gone: the client left, and the prefill leg was cut for it.
	answered, dropped, gone bool
}

// legResult is how a prefill leg ended.
type legResult struct {
	result string
	status int    // the prefill engine's status; 0 without an answer
	body   []byte // a 4xx answer, relayed when the decode leg was cut for it
	ctype  []byte
	// denied: the 404 said the engine does not serve the model, which is
	// no verdict on the request: the next pair or aggregated serves it.
	denied bool
}

// decodeFail is a decode leg that failed before its first byte: its
// upstream and result for the health account (up nil: nothing to
// account), and whether the prefill leg cut it.
type decodeFail struct {
	up     *upstream
	result string
	cut    bool
	// noKV: the decode engine answered 5xx saying it could not read the
	// room's KV from the prefill engine (kvTransferFailed, noTransfer).
	// decodeAtFault: and that is the decode engine's fault, not the
	// prefill engine's: held against its health whatever its prefill leg
	// did (the leg is cut).
	noKV, decodeAtFault bool
}

// cutDecode records the prefill leg's failure and closes the decode leg's
// upstream connection (now, or as soon as it is written) while the leg is
// open.
func (l *sglangLeg) cutDecode(res legResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.res = res
	if !l.open {
		return
	}
	l.cut = true
	if l.client {
		l.w.expire(l.n) // not the client's departure: the request moves on
	} else {
		l.w.cancel()
	}
}

// dropWatch ends the decode leg's link to its connection once its answer
// is given up (not relayed: relaying releases the client watcher).
func (l *sglangLeg) dropWatch(u *upstreams) {
	if l.client {
		l.w.release()
	} else {
		u.dropLegWatch(l.w)
	}
}

// clientLeft cuts the prefill leg of a client that left, unless it has its
// answer: SGLang aborts a request whose connection closes, freeing the
// room the decode engine will not read.
func (l *sglangLeg) clientLeft() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.answered {
		l.gone = true
		l.pw.cancel()
	}
}

// close ends the link and reports whether the prefill leg cut the decode leg.
func (l *sglangLeg) close() bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.open = false
	return l.cut
}

// decodeFailed hands the decode leg's failure over. It returns the
// prefill leg's result so far (the 4xx to relay when it cut the decode
// leg). A decode engine fails too when its prefill engine dies or rejects
// the request; the failure counts against the decode engine only when the
// prefill leg ends well, so it is settled by whichever side is last.
func (l *sglangLeg) decodeFailed(s *Server, f decodeFail) legResult {
	l.mu.Lock()
	defer l.mu.Unlock()
	if f.noKV && !l.answered {
		// The room will not be read: the prefill leg, which SGLang answers
		// once the room's KV is sent (or at its bootstrap timeout), is cut,
		// and SGLang aborts the request, freeing the room.
		l.dropped = true
		l.pw.cancel()
	}
	if !l.finished {
		l.dfail = f
		return l.res
	}
	settle(s, f, l.res)
	return l.res
}

// prefillEnded records the prefill leg's result and settles a decode
// failure handed over before.
func (l *sglangLeg) prefillEnded(s *Server, res legResult) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.finished, l.res = true, res
	settle(s, l.dfail, res)
	l.dfail = decodeFail{}
}

// prefillAnswered ends the prefill leg's link to its connection: from
// here on the decode leg does not cut it. cutFor is why the leg was cut,
// if it was: failed_kv_transfer (its decode leg could not read the room)
// or client_gone; neither is the engine's health's business.
func (l *sglangLeg) prefillAnswered() (cutFor string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.answered = true
	l.pw.release()
	switch {
	case l.gone:
		return "client_gone"
	case l.dropped:
		return "failed_kv_transfer"
	}
	return ""
}

// settle counts a decode failure against the decode engine when its
// prefill leg did its part and the decode engine could read the room, or
// when its failed room was its own fault (noTransfer).
func settle(s *Server, f decodeFail, prefill legResult) {
	if f.up != nil && (f.decodeAtFault || !f.noKV && prefill.result == "ok") {
		f.up.failures.Add(1)
		s.health.observe(f.up, f.result)
	}
}

// kvTransferFailed reports whether a decode engine's 5xx body says it
// could not read its room's KV: SGLang's aborts ("Decode handshake failed
// for request rank=... bootstrap_room=...", "Decode transfer failed for
// request ... with exception KVTransferError(...)") and the simulator's
// ("KV transfer for bootstrap_room N failed: ..."). Any other 5xx is the
// decode engine's own, even when it quotes the request (whose body holds
// the bootstrap_room the ingress put there): one decode engine answering
// "CUDA out of memory while handling request {... "bootstrap_room": N}"
// had every prefill engine left out of P/D.
func kvTransferFailed(body []byte) bool {
	return bytes.Contains(body, []byte("Decode handshake failed")) ||
		bytes.Contains(body, []byte("Decode transfer failed")) ||
		bytes.Contains(body, []byte("KV transfer for bootstrap_room "))
}

// kvFail is an SGLang engine's last room that could not be read: the
// engine of the other role in its pair and when. A decode engine's also
// says until when its failed rooms are its own fault, and when the last
// warning about it was logged.
type kvFail struct {
	peer       string
	at         time.Time
	faultUntil time.Time
	warned     time.Time
}

// kvBlameWindow is how long a failed room is remembered to judge the next
// ones: longer than a first mark (noKVBackoff.Min, 30 s and its jitter),
// so a prefill engine marked for a decode engine's failure is cleared when
// that decode engine fails another prefill engine's room before the mark
// runs out.
const kvBlameWindow = time.Minute

// blameLocked records that decode could not read a room of prefill and
// says whose fault it is: the decode engine's when its failed rooms lately
// (kvBlameWindow) name another prefill engine too, or it was lately found
// at fault, unless this prefill engine's rooms lately failed on another
// decode engine as well (then the prefill engine's: every prefill engine's
// bootstrap address may be wrong at once). When a decode engine is first
// found at fault, the mark its failure put on the other prefill engine is
// undone (cleared: that engine), unless that engine's rooms failed on
// another decode engine too. Bounded: one record per engine, dropped with
// the engine (forget). Under mu.
func (p *pdState) blameLocked(decode, prefill string, now time.Time) (decodeAtFault bool, cleared string, d *kvFail) {
	if p.kvFails == nil {
		p.kvFails = make(map[string]*kvFail)
	}
	rec := func(id string) *kvFail {
		f := p.kvFails[id]
		if f == nil {
			f = &kvFail{}
			p.kvFails[id] = f
		}
		return f
	}
	// elsewhere: f's last failed room was lately with an engine other than not.
	elsewhere := func(f *kvFail, not string) bool {
		return f != nil && f.peer != "" && f.peer != not && now.Sub(f.at) < kvBlameWindow
	}
	d, pf := rec(decode), rec(prefill)
	faulted := now.Before(d.faultUntil)
	if (faulted || elsewhere(d, prefill)) && !elsewhere(pf, decode) {
		decodeAtFault = true
		if !faulted && !elsewhere(p.kvFails[d.peer], decode) {
			if m := p.noKV[d.peer]; m != nil && now.Before(m.until) {
				m.until = now
				m.n = max(0, m.n-1)
				cleared = d.peer
			}
		}
		d.faultUntil = now.Add(kvBlameWindow)
	}
	d.peer, d.at = prefill, now
	pf.peer, pf.at = decode, now
	return decodeAtFault, cleared, d
}

// noTransfer handles a decode leg that could not read its room's KV from
// the prefill engine. The failure is mostly the prefill side's (its
// bootstrap address wrong or refusing, its bootstrap server or transfer
// engine down), so the prefill engine is left out of prefill legs for the
// next step of noKVBackoff (markLocked, as a NIXL engine without a KV
// connector is; a decode leg that reads a room of it clears the mark) and
// a warning names it and the bootstrap address, once per noKVWarnEvery.
// Without it the decode engines were ejected for the prefill engine's
// fault, and the prefill engine, answering its legs fast, took every
// request's leg. But a decode engine that fails the rooms of two prefill
// engines (blameLocked) is the one at fault: its failure is held against
// its health (decodeAtFault) and no prefill engine is marked for it; one
// bad decode engine used to take every prefill engine out of P/D. It
// returns decodeAtFault.
func (s *Server) noTransfer(p *pdState, l *sglangLeg, decode string, body []byte) bool {
	p.legs.WithLabelValues("decode", "failed_kv_transfer").Inc()
	now := time.Now()
	p.mu.Lock()
	atFault, cleared, df := p.blameLocked(decode, l.prefill, now)
	if atFault {
		warn := df.warned.IsZero() || now.Sub(df.warned) >= noKVWarnEvery
		if warn {
			df.warned = now
		}
		p.mu.Unlock()
		if warn {
			s.log.Warn("SGLang decode engine could not read the bootstrap rooms of two prefill engines: the fault is taken to be its own "+
				"(its transfer engine or network), held against its health; the prefill engines keep their prefill legs",
				"decode_engine", decode, "engine", l.prefill, "cleared_mark", cleared, "answer", string(body[:min(len(body), 300)]))
		}
		return true
	}
	m, d := p.markLocked(l.prefill, now)
	warn := d > 0 && (m.warned.IsZero() || now.Sub(m.warned) >= noKVWarnEvery)
	if warn {
		m.warned = now
	}
	p.mu.Unlock()
	if warn {
		s.log.Warn("SGLang decode engine could not read a bootstrap room's KV from the prefill engine: is its bootstrap address right "+
			"(the prefill engine's --disaggregation-bootstrap-port, the sidecar's --bootstrap-port) and reachable from the decode engines? "+
			"It gets no prefill legs for a while", "engine", l.prefill, "bootstrap", l.bootstrap, "decode_engine", decode,
			"for", d.Round(time.Second).String(), "answer", string(body[:min(len(body), 300)]))
	}
	return false
}

// transferred clears the prefill engine's mark: a decode leg read a room
// of it (noTransfer).
func (l *sglangLeg) transferred(p *pdState) {
	p.noKVOK(l.prefill)
}

// legWatch registers an unpooled watch that links the upstream connection
// carrying a request tagged with its id (clientwatch.go's tagging), without
// watching any client.
func (u *upstreams) legWatch() *watch {
	w := &watch{ups: u, id: u.nextCall.Add(1)}
	w.idText = strconv.AppendUint(nil, w.id, 10)
	u.watchMu.Lock()
	u.watched[w.id] = w
	u.watchMu.Unlock()
	u.nWatched.Add(1)
	return w
}

// dropLegWatch unregisters a legWatch.
func (u *upstreams) dropLegWatch(w *watch) {
	w.release()
	u.watchMu.Lock()
	delete(u.watched, w.id)
	u.watchMu.Unlock()
	u.nWatched.Add(-1)
}

// infoOf returns the membership entry of engine id (nil when unknown).
func (c *call) infoOf(id string) *EngineInfo {
	for i := range c.infos {
		if c.infos[i].ID == id {
			return &c.infos[i]
		}
	}
	return nil
}

// sglangLegs serves a disaggregated request on SGLang engines. It returns
// false when the client has its answer (or an error), true when the
// request falls back to the ordinary proxy, aggregated.
func (c *call) sglangLegs(ctx *fasthttp.RequestCtx) bool {
	p := c.s.pdInit()
	// The plan's reservation (pd.go) holds its engines while the legs wait
	// for admission; sglangPair drops it once a pair is admitted, just
	// before both legs charge their engines, and any other way out here
	// drops it too (unreserve is idempotent).
	defer c.unreserve(p, true)
	if c.s.draining.Load() {
		// A prefill leg runs on a goroutine the server waits for
		// (s.legTasks); none starts once Close is under way.
		// Served aggregated instead, counted as every other fallback is:
		// a leg result and a second decision by the served mode.
		c.pd.result = "fallback_draining"
		c.servedWhole()
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
		p.decisions.WithLabelValues("aggregated", "sglang_fallback").Inc()
		return true
	}
	start := time.Now()
	// The access log's prefill_result: "concurrent" while a pair's legs
	// run (per-leg results: kvmesh_ingress_pd_legs_total), and for a
	// request served aggregated instead the fallback_<why> of the last
	// pair given up, as the NIXL path logs it (sglangPair).
	c.pd.result = ""
	tried := map[string]bool{}
	pairs, full := 0, 0
	// refused: the last pair tried found its prefill queue full. It is
	// counted as NIXL counts a full queue (runPrefill): next_queue_full
	// when the request moves on to another pair, else as the request
	// ends, fallback_queue_full (aggregated) or rejected (429).
	refused := false
	for _, o := range c.pd.plan.Options {
		if pairs == maxSGLangPairs {
			break
		}
		pi := c.infoOf(o.Prefill)
		if o.Prefill == "" || tried[o.Prefill] || pi == nil || pi.PDProtocol != gossip.PDProtocolSGLang {
			continue
		}
		if refused {
			p.legs.WithLabelValues("prefill", "next_queue_full").Inc()
			refused = false
		}
		tried[o.Prefill] = true
		pairs++
		// The pair's own prefill engine's match: its load is charged
		// with the prompt tokens it does not cache.
		c.pd.prefill, c.pd.pmatch = o.Prefill, o.PrefillMatch
		answered, ok, isFull := c.sglangPair(ctx, p, pi, o.Decode, start)
		if answered {
			return false // c may be finished: touch nothing
		}
		if isFull {
			full++
			refused = true
		}
		if !ok {
			break
		}
	}
	c.pd.duration = time.Since(start)
	c.servedWhole() // aggregated or 429: no pair's prefill engine did it
	if fb := c.fallbackEngine(); full > 0 && full == pairs && c.queueing(fb) {
		// Every prefill queue tried is full and the engine the request
		// would fall back to (the ranking's head, not necessarily a
		// pair's decode engine) is queueing: no engine is left for it.
		c.pd.result = "rejected"
		p.legs.WithLabelValues("prefill", "rejected").Inc()
		c.fail(ctx, c.s.hideEngines(fmt.Errorf("%w: every prefill engine tried, and %s is queueing", ErrPrefillFull, fb),
			"every prefill engine tried, and the engine it would fall back to is queueing"))
		c.finish()
		return false
	}
	if refused {
		c.pd.result = "fallback_queue_full"
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
	}
	p.decisions.WithLabelValues("aggregated", "sglang_fallback").Inc()
	return true
}

// sglangPair runs one (prefill, decode) pair. answered: the client has its
// answer; ok false: do not try another pair; full: the prefill engine's
// queue was full, and sglangLegs counts the refusal once it knows where
// the request goes instead.
func (c *call) sglangPair(ctx *fasthttp.RequestCtx, p *pdState, pi *EngineInfo, decode string, start time.Time) (answered, ok, full bool) {
	s := c.s
	host, port := bootstrapOf(pi)
	body, err := withBootstrap(c.upstreamBody(), host, port, rand.Uint64()&(1<<63-1))
	if err != nil {
		c.pd.result = "fallback_body"
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
		return false, false, false
	}
	g := p.gate(pi.ID)
	if err := g.acquire(p.cfg.PrefillQueue, start.Add(p.cfg.PrefillTimeout)); err != nil {
		if errors.Is(err, ErrPrefillFull) {
			return false, true, true
		}
		c.pd.result = "fallback_admission_timeout"
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
		return false, true, false
	}
	c.unreserve(p, true) // admitted: the legs charge their engines from here (pd.go's reservation)
	pup, err := s.ups.get(pi.ID, pi.URL)
	if err != nil {
		g.release()
		c.pd.result = "fallback_no_engine"
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
		return false, true, false
	}
	if !s.legTasks.add() { // the server stopped while this handler outlived the drain
		g.release()
		c.pd.result = "fallback_draining"
		p.legs.WithLabelValues("prefill", c.pd.result).Inc()
		return false, false, false
	}
	leg := &sglangLeg{open: true, pw: s.ups.legWatch(), prefill: pi.ID, bootstrap: net.JoinHostPort(host, strconv.Itoa(port))}
	// The client watcher (clientwatch.go) carries the decode leg, as it
	// carries an aggregated attempt: a client that leaves closes the
	// decode engine's connection, which is how SGLang learns to abort
	// (the answer used to be generated to its end and counted 200). Linked
	// before the prefill leg starts, which may cut the decode leg at once.
	if c.watch == nil {
		c.watch = s.ups.startWatch(ctx)
	}
	if c.watch != nil {
		leg.w, leg.n, leg.client = c.watch, c.watch.attempt(), true
	} else {
		leg.w = s.ups.legWatch()
	}
	leg.model, leg.adapter = c.sentModel()
	charge := c.prefillLegTokens()
	c.pd.result = "concurrent"
	go s.sglangPrefill(p, leg, pup, g, pi.URL+c.path, body, c.forwardCopy(), charge, start)
	answered, fail := c.sglangDecode(ctx, p, leg, decode, body)
	if answered {
		return true, false, false
	}
	res := leg.decodeFailed(s, fail)
	if fail.cut && !res.denied && res.status >= 400 && res.status < 500 && res.status != fasthttp.StatusTooManyRequests && res.status != fasthttp.StatusUnauthorized {
		// The prefill engine judged the request (4xx): relay its answer.
		c.engine = pi.ID
		c.status = res.status
		c.errMsg = fmt.Sprintf("prefill engine answered %d", res.status)
		ctx.SetStatusCode(res.status)
		ctx.SetContentTypeBytes(res.ctype)
		c.s.setEngineHeader(ctx, pi.ID)
		ctx.SetBody(res.body)
		c.finish()
		return true, false, false
	}
	// Given up: why, for the access log (the next pair or the fallback
	// overwrites it).
	switch {
	case fail.noKV:
		c.pd.result = "fallback_kv_transfer"
	case fail.cut && res.result != "":
		c.pd.result = "fallback_" + strings.TrimPrefix(res.result, "failed_")
	default:
		c.pd.result = "fallback_decode_failed"
	}
	// A decode engine that denied the model, or is a kvmesh ingress, is out
	// of the ranking: the request is served aggregated on the next engine,
	// not by another pair.
	return false, fail.result != "wrong_model" && fail.result != loopResult, false
}

// sglangDecode sends the decode leg and, once the decode engine answers
// 200, relays it through the proxy. answered: the client has its answer
// (c may be finished); otherwise fail says how the leg failed.
func (c *call) sglangDecode(ctx *fasthttp.RequestCtx, p *pdState, leg *sglangLeg, decode string, body []byte) (answered bool, fail decodeFail) {
	s := c.s
	rk := scheduler.EngineScore{Engine: decode}
	for i := range c.dec.Ranked {
		if c.dec.Ranked[i].Engine == decode {
			rk = c.dec.Ranked[i]
		}
	}
	url := c.urlOf(decode)
	up, err := s.ups.get(decode, url)
	if err != nil {
		leg.close()
		leg.dropWatch(s.ups)
		return false, decodeFail{}
	}
	ureq := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(ureq)
	ureq.Header.SetMethod(fasthttp.MethodPost)
	ureq.Header.SetContentType("application/json")
	c.setUpstreamHeaders(&ureq.Header)
	ureq.Header.SetBytesV(watchHeader, leg.w.idText)
	ureq.SetRequestURI(url + c.path)
	ureq.SetHost(up.hc.Addr)
	ureq.SetBodyRaw(body)
	c.attempts++
	c.engine, c.match = rk.Engine, rk.Match
	if keys := c.keysOf(rk.Engine); s.deps.Index != nil && len(keys) > 0 {
		s.deps.Index.AddSpeculative(rk.Engine, keys, time.Now()) // at the engine's block size
	}
	resp := fasthttp.AcquireResponse()
	c.startAttempt(up, rk.Match.Spec)
	up.total.Add(1)
	err = up.hc.Do(ureq, resp)
	cut := leg.close() // from here on the prefill leg cannot touch the connection
	if !leg.client {
		s.ups.dropLegWatch(leg.w)
	}
	st := resp.StatusCode()
	switch {
	case c.watch.isCanceled():
		// The client left, and its watcher cut the leg (or the answer,
		// whichever came, goes nowhere): 499, as on the aggregated path,
		// not a failure of the decode engine.
		leg.clientLeft()
		c.watch.release()
		s.m.attempts.WithLabelValues("client_gone").Inc()
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		c.endAttempt(up)
		c.clientGone(ctx)
		return true, decodeFail{}
	case err == nil && st == fasthttp.StatusOK:
		leg.transferred(p)
		var done bool
		if c.req.stream {
			done, _ = c.startStream(ctx, up, resp)
		} else {
			done, _ = c.relayBufferedOK(ctx, up, resp)
		}
		if !done && c.watch.isCanceled() {
			// The client left while the answer was read (its watcher cut
			// the leg): counted client_gone by attemptFailed.
			leg.clientLeft()
			c.clientGone(ctx)
			return true, decodeFail{}
		}
		return done, decodeFail{}
	case err == nil && !cut && st < 500 && st != fasthttp.StatusTooManyRequests && st != fasthttp.StatusUnauthorized:
		buf, rerr := readAll(resp)
		if st != fasthttp.StatusNotFound || rerr != nil || !deniesModel(buf.Bytes(), leg.model) {
			s.m.attempts.WithLabelValues("status_4xx").Inc()
			c.relayRead(ctx, up, resp, st, buf, rerr)
			return true, decodeFail{}
		}
		// The decode engine does not serve the model (wrongmodel.go): it
		// leaves the model's requests and the ranking, and the request is
		// served aggregated (sglangPair). Not counted as a failure besides.
		bufPool.Put(buf)
		s.m.attempts.WithLabelValues("wrong_model").Inc()
		if leg.client {
			c.watch.release()
		}
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		c.endAttempt(up)
		s.deniedModel(up, leg.model, leg.adapter)
		c.dropRanked(decode)
		return false, decodeFail{result: "wrong_model"}
	}
	result := "status_5xx"
	if looped := loopAnswer(resp); err == nil && !cut && looped != "" {
		// loop.go: the decode "engine" is a kvmesh ingress: out of the
		// ranking, and served aggregated on the next engine.
		s.m.attempts.WithLabelValues(loopResult).Inc()
		if leg.client {
			c.watch.release()
		}
		_ = resp.CloseBodyStream()
		fasthttp.ReleaseResponse(resp)
		c.endAttempt(up)
		s.loopedEngine(up)
		c.dropRanked(decode)
		return false, decodeFail{result: loopResult}
	}
	var noKV []byte // the 5xx's body when it says the room could not be read (noTransfer)
	if err == nil && !cut && st >= 500 {
		if buf, rerr := readAll(resp); rerr == nil {
			if kvTransferFailed(buf.Bytes()) {
				noKV = bytes.Clone(buf.Bytes())
			}
			bufPool.Put(buf)
		}
	}
	switch {
	case cut:
		result = "pd_prefill_failed" // neutral for health: not the decode engine's fault
	case err != nil:
		result = classifyErr(err)
	case st == fasthttp.StatusTooManyRequests:
		result = "status_429"
	case st == fasthttp.StatusUnauthorized:
		result = "credential_refused" // upstreamauth.go: the ingress's engine key
		_ = s.credentialError(up, resp)
	}
	fail = decodeFail{up: up, result: result, cut: cut, noKV: noKV != nil}
	if cut {
		fail.up = nil
	}
	if noKV != nil {
		fail.decodeAtFault = s.noTransfer(p, leg, decode, noKV)
	}
	s.m.attempts.WithLabelValues(result).Inc()
	if leg.client {
		c.watch.release()
	}
	_ = resp.CloseBodyStream()
	fasthttp.ReleaseResponse(resp)
	c.endAttempt(up)
	if s.debugEnabled() {
		s.log.Debug("sglang decode leg failed", "engine", decode, "result", result, "err", err)
	}
	return false, fail
}

// sglangPrefill runs one prefill leg to its end, on its own goroutine
// (owned by the server: s.legTasks, which shutdown waits for; bounded by
// the upstream connection's idle timeout). It holds g's slot and charges
// the prefill engine's load until the answer is read.
func (s *Server) sglangPrefill(p *pdState, leg *sglangLeg, up *upstream, g *prefillGate, uri string, body []byte, fwd [len(forwardHeaders)][]byte, charge int64, start time.Time) {
	defer s.legTasks.done()
	defer g.release()
	var res legResult
	defer func() {
		leg.prefillEnded(s, res)
		p.legs.WithLabelValues("prefill", res.result).Inc()
		p.prefillS.Observe(time.Since(start).Seconds())
	}()
	req := fasthttp.AcquireRequest()
	defer fasthttp.ReleaseRequest(req)
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	s.putUpstreamHeaders(&req.Header, func(i int) []byte { return fwd[i] })
	req.Header.SetBytesV(watchHeader, leg.pw.idText)
	req.SetRequestURI(uri)
	req.SetHost(up.hc.Addr)
	req.SetBodyRaw(body)
	resp := fasthttp.AcquireResponse()
	defer fasthttp.ReleaseResponse(resp)
	up.inflight.Add(1)
	up.prefill.Add(charge)
	up.total.Add(1)
	defer func() { up.inflight.Add(-1); up.prefill.Add(-charge) }()
	defer s.ups.dropLegWatch(leg.pw)
	if err := up.hc.Do(req, resp); err != nil {
		if cutFor := leg.prefillAnswered(); cutFor != "" {
			// The decode leg could not read the room and cut this leg
			// (noTransfer), or the client left: not the engine's
			// health's business.
			res.result = cutFor
			return
		}
		res.result = "failed_" + s.legFailure(up, err)
		// No answer head: the engine never saw the request (dial), hangs
		// (the stall watch's cut), or broke off. The room may never be
		// filled, and the decode leg would wait for it until its bootstrap
		// timeout (a hung prefill engine keeps the bootstrap connection
		// open): it moves on now, to the next pair or aggregated.
		leg.cutDecode(res)
		return
	}
	res.status = resp.StatusCode()
	if res.status != fasthttp.StatusOK {
		leg.prefillAnswered()
		res.result = "failed_status_" + strconv.Itoa(res.status)
		if looped := loopAnswer(resp); looped != "" { // loop.go: the "engine" is a kvmesh ingress
			res.result = "failed_" + loopResult
			s.loopedEngine(up) // its connection's next use is closed: the answer's is released below
		} else if res.status >= 500 || res.status == fasthttp.StatusTooManyRequests {
			up.failures.Add(1)
			s.health.observe(up, statusResult(res.status))
		} else if res.status == fasthttp.StatusUnauthorized {
			// upstreamauth.go: the ingress's engine key, not the client's.
			res.result = "failed_credential_refused"
			_ = s.credentialError(up, resp)
			s.leaveOutRefusing(p, up.id)
		} else if buf, err := readAll(resp); err == nil {
			if res.status == fasthttp.StatusNotFound && deniesModel(buf.Bytes(), leg.model) {
				res.result, res.denied = "failed_wrong_model", true
			} else {
				res.body, res.ctype = bytes.Clone(buf.Bytes()), bytes.Clone(resp.Header.ContentType())
			}
			bufPool.Put(buf)
		}
		_ = resp.CloseBodyStream()
		if res.denied {
			s.deniedModel(up, leg.model, leg.adapter) // the answer's connection is back in the pool
		}
		leg.cutDecode(res) // the engine rejected the request: no KV will come
		return
	}
	// The answer (one token, SGLang's prefill result) is not the client's:
	// drain it so the connection can be reused.
	var err error
	if r := resp.BodyStream(); r != nil {
		_, err = io.Copy(io.Discard, io.LimitReader(r, maxUpstreamBody))
	}
	cutFor := leg.prefillAnswered() // before the connection goes back to the pool
	_ = resp.CloseBodyStream()
	if err != nil {
		res.result = "failed_read_error"
		if cutFor != "" {
			res.result = cutFor
		}
		return
	}
	s.health.ok(up, int64(start.Sub(monoBase)))
	res.result = "ok"
}

// bootstrapOf is the bootstrap host and port of an SGLang prefill engine:
// its gossiped address, or its URL's host and SGLang's default port.
func bootstrapOf(e *EngineInfo) (string, int) {
	if h, ps, err := net.SplitHostPort(e.Bootstrap); err == nil {
		if port, err := strconv.Atoi(ps); err == nil {
			return h, port
		}
	}
	host := ""
	if u, err := url.Parse(e.URL); err == nil {
		host = u.Hostname()
	}
	return host, 8998
}

// withBootstrap is body with SGLang's bootstrap fields set: the same bytes
// go to both legs. Requests with n > 1 would need arrays (errNoBootstrap).
func withBootstrap(body []byte, host string, port int, room uint64) ([]byte, error) {
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		return nil, fmt.Errorf("bootstrap body: %w", err)
	}
	if m == nil {
		return nil, fmt.Errorf("bootstrap body: %w: not an object", ErrBadRequest)
	}
	if n, ok := m["n"]; ok {
		var v float64
		if json.Unmarshal(n, &v) == nil && v > 1 {
			return nil, errNoBootstrap
		}
	}
	h, err := json.Marshal(host)
	if err != nil {
		return nil, fmt.Errorf("bootstrap body: %w", err)
	}
	m["bootstrap_host"] = h
	m["bootstrap_port"] = json.RawMessage(strconv.Itoa(port))
	m["bootstrap_room"] = json.RawMessage(strconv.FormatUint(room, 10))
	return json.Marshal(m)
}
