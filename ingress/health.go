package ingress

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/backoff"
)

// HealthConfig configures passive ejection: an engine that fails this
// replica's requests is taken out of routing at once, and an active probe of
// its health endpoint (never a client request) brings it back.
//
// Connect errors and timeouts eject on the first failure, so a request waits
// on a dead engine's timeout at most once per ejection (a connect timeout
// only with the stall watch off: healthKind); answers of 5xx and
// streams that break after they started (the engine's connection died
// mid-answer) and answers the ingress cannot read as HTTP (protocol errors:
// the engine is alive) eject after ConsecutiveFailures in a row or when the decaying
// error rate passes ErrorRate. A 404 saying the engine does not serve the
// gossiped model it was routed ejects at once (wrongmodel.go), and so does
// a 508 saying the "engine" is a kvmesh ingress (loop.go). 429 is the
// engine shedding load, not a failure, and never ejects; neither does a
// first-byte timeout of an engine that answers its probes
// (Config.FirstByteTimeout: slow, not dead).
type HealthConfig struct {
	// Disabled turns passive ejection off (readiness from gossip still applies).
	Disabled bool `yaml:"disabled"`
	// ConsecutiveFailures is how many 5xx answers in a row eject. Default 3.
	ConsecutiveFailures int `yaml:"consecutiveFailures"`
	// ErrorRate ejects when the failure share, decayed with ErrorHalfLife,
	// reaches it over at least MinRequests (decayed) requests. Default 0.5.
	ErrorRate float64 `yaml:"errorRate"`
	// MinRequests is the decayed request count below which the error rate
	// is not judged. Default 10.
	MinRequests float64 `yaml:"minRequests"`
	// ErrorHalfLife is how fast old outcomes lose weight. Default 10s.
	ErrorHalfLife time.Duration `yaml:"errorHalfLife"`
	// EjectionTime is how long the first ejection lasts before the first
	// probe; it doubles (with jitter) per failed probe up to MaxEjectionTime.
	// Defaults 500ms and 15s.
	EjectionTime    time.Duration `yaml:"ejectionTime"`
	MaxEjectionTime time.Duration `yaml:"maxEjectionTime"`
	// ProbePath is requested (GET) on the engine's base URL; 200 returns it
	// to routing. The probe carries the ingress's hop header, which a
	// kvmesh ingress answers with 508 (loop.go): a URL that points at an
	// ingress is never readmitted. An engine ejected for a wrong model must also list its
	// gossiped model on /v1/models, asked next (checkIdentity). Default
	// "/health" (vLLM and the simulator serve it).
	ProbePath string `yaml:"probePath"`
	// ProbeTimeout bounds one probe of an engine in routing: a stalled
	// engine whose probes both go unanswered that long leaves routing
	// (ProbeGrace says when its requests are cut). Default 1s.
	ProbeTimeout time.Duration `yaml:"probeTimeout"`
	// ProbeGrace is how long a stalled engine's probes may take before it
	// counts as hung. Probes unanswered after ProbeTimeout take it out of
	// routing, new requests go elsewhere, but its requests stay; a probe
	// that answers within ProbeGrace puts it back, and only when both
	// fail (an error, or no answer within ProbeGrace) are its requests
	// that have not committed to their clients cut. A live engine's HTTP
	// server can take over a second to answer /health under load (vLLM
	// serves it on the event loop that serves its streams), and cutting
	// its requests then ran their work again elsewhere, at the worst
	// moment. It also bounds the probes of an ejected engine: one that
	// answers within it is back. Default (0): 5 × ProbeTimeout.
	ProbeGrace time.Duration `yaml:"probeGrace"`
	// StallAfter is how long an engine may hold this replica's requests
	// without sending a byte before it is probed (the stall watch): a hung
	// engine (a frozen process, a stuck GPU, a blackholed network path)
	// accepts connections and answers nothing, so no request fails. Two
	// failed probes (overlapping) eject it and cut its requests that have
	// not committed to their clients (no answer yet, or a stream's headers
	// and no event), which are retried on another engine (streams under
	// way are left to resume or time out). A live engine answers the probe
	// and keeps its requests, however long they take: while the watch is
	// on, the wait for an answer has no bound but Config.FirstByteTimeout.
	// Default 1s; 0 turns the watch off (then Config.IdleTimeout bounds
	// that wait too, and a timeout ejects).
	StallAfter time.Duration `yaml:"stallAfter"`
}

// DefaultHealthConfig returns the defaults above.
func DefaultHealthConfig() HealthConfig {
	return HealthConfig{ConsecutiveFailures: 3, ErrorRate: 0.5, MinRequests: 10, ErrorHalfLife: 10 * time.Second,
		EjectionTime: 500 * time.Millisecond, MaxEjectionTime: 15 * time.Second, ProbePath: "/health", ProbeTimeout: time.Second,
		StallAfter: time.Second}
}

func (c *HealthConfig) problems(bad func(string, ...any)) {
	if c.Disabled {
		return
	}
	if c.ConsecutiveFailures < 1 {
		bad("health: consecutive failures must be >= 1, got %d", c.ConsecutiveFailures)
	}
	if c.ErrorRate <= 0 || c.ErrorRate > 1 {
		bad("health: error rate must be in (0,1], got %v", c.ErrorRate)
	}
	if c.MinRequests < 1 {
		bad("health: min requests must be >= 1, got %v", c.MinRequests)
	}
	if c.ErrorHalfLife <= 0 || c.EjectionTime <= 0 || c.MaxEjectionTime < c.EjectionTime || c.ProbeTimeout <= 0 {
		bad("health: half-life, ejection time and probe timeout must be > 0 and max ejection >= ejection time")
	}
	if c.ProbeGrace < 0 || (c.ProbeGrace > 0 && c.ProbeGrace < c.ProbeTimeout) {
		bad("health: probe grace must be 0 (5 × probe timeout) or >= probe timeout %v, got %v", c.ProbeTimeout, c.ProbeGrace)
	}
	if c.StallAfter < 0 {
		bad("health: stall after must be >= 0 (0: off), got %v", c.StallAfter)
	}
	if len(c.ProbePath) == 0 || c.ProbePath[0] != '/' {
		bad("health: probe path %q must start with /", c.ProbePath)
	}
}

// probeGrace is ProbeGrace in force (its default: 5 × ProbeTimeout).
func (c *HealthConfig) probeGrace() time.Duration {
	if c.ProbeGrace > 0 {
		return c.ProbeGrace
	}
	return 5 * c.ProbeTimeout
}

// Outcome kinds fed to the ejector (the attempt results of proxy.go).
const (
	healthOK = iota
	healthHardFail
	healthSoftFail
	healthNeutral
)

// healthKind is how an attempt's result counts toward ejection
// (dialsWatched: Config.watchSeesDials). A connect timeout is hard evidence
// only where the stall watch cannot see the dial. A dial that does not
// complete in time is what a dead or blackholed engine causes, and also what
// the ingress's own overload causes (thousands of dials at once on a busy
// host, all timing out in the same second: no count of failures in a row
// tells the two apart). Where the watch sees dials, the engine is asked
// instead: one that sends this replica nothing for StallAfter while requests
// (dials included) wait on it is probed and ejected if it does not answer,
// and one that answers its probes or its other requests is busy, not dead.
// The watch sees a dial only if the dial outlasts StallAfter and the watch's
// tick: with a shorter ConnectTimeout each dial gives up unseen, and a
// blackholed engine would stay in routing for good, so there a connect
// timeout ejects as before. A refused connection stays hard: the engine's
// host said nothing listens.
func healthKind(result string, dialsWatched bool) int {
	switch result {
	case "ok":
		return healthOK
	case "connect_timeout":
		if dialsWatched {
			return healthNeutral
		}
		return healthHardFail
	case "connect_error", "client_cert_refused", "timeout", "empty_response":
		return healthHardFail
	case "status_5xx", "stream_error", "protocol_error":
		return healthSoftFail
	}
	return healthNeutral
}

// engineHealth is one engine's record. Lock rule: mu guards the fields after
// it; ejected is also read without the lock on the request path.
type engineHealth struct {
	ejected atomic.Bool
	id      string

	mu          sync.Mutex
	url         string
	ejectedAt   time.Time // when the current ejection began (logged at the restore)
	ejectedMono int64     // ejectedAt on monoNow's clock (attempts sent after it: observeSent)
	reason      string    // why (logged at the restore)
	consecutive int
	fails, reqs float64 // decayed counts
	last        time.Time
	until       time.Time // ejected: next probe not before
	ejections   int       // ejections without a success in between (backoff)
	probing     bool
	stallNext   time.Time // stall watch: no new stall probe before
	stalled     bool      // ejected by the stall watch (until a probe restores it)
	// gone: the record was forgotten (forget.go); a probe still out for it
	// can no longer eject it.
	gone bool
	// wrongModel: ejected because it answered that it does not serve the
	// model its sidecar gossips (model, wrongmodel.go): its probe readmits
	// it only when /v1/models lists the gossiped model.
	wrongModel bool
	model      string
	// idWarned: a probe found another model, or a kvmesh ingress, at the
	// URL, logged once per ejection.
	idWarned bool
	// identity: ejected (or kept out by a probe) for what the URL is, not
	// for how it answered: a wrong model or a kvmesh ingress. Panic
	// routing never sends such an engine a request.
	identity bool
	// dead: the last word on it was that nothing listens at its URL (or
	// it refuses this ingress's certificate): ejected for a connect
	// error, or a probe's connection was refused. Panic routing skips it
	// (an attempt there fails for sure); a probe that fails otherwise
	// (a timeout: alive but slow) clears it.
	dead bool
	// panicSent: panic routing sent it requests during this ejection, so
	// an answer readmits it (observe); an answer to a request that left
	// before the ejection does not.
	panicSent bool
}

// ejector tracks engine health for one replica. Its probe loop is owned by
// the Server (started in Start, stopped by quit).
type ejector struct {
	cfg      HealthConfig
	mu       sync.RWMutex // guards m
	m        map[string]*engineHealth
	nEjected atomic.Int64 // fast path: 0 means nothing is ejected
	client   *http.Client
	bo       backoff.Backoff
	ups      *upstreams // the stall watch's view of requests in flight (set by the Server)
	// dialsWatched: the stall watch sees a dial before it times out
	// (Config.watchSeesDials; set by the Server), so a connect timeout
	// alone does not eject (healthKind).
	dialsWatched bool
	stallBuf     []*upstream
	// identity returns engine id's gossiped model ("" when unknown) and the
	// Authorization value the engine wants (nil: none), for a probe's
	// check of /v1/models (set by the Server; nil: no check).
	identity func(id string) (model string, auth []byte)
	// hop is the ingress's id, which probes carry in hopHeader (loop.go).
	hop string
	// log gets one line per transition: an engine ejected (WARN, with
	// why) and restored (INFO, with how long it was out). Failed probes
	// of an ejected engine are not logged again (the ejection said it).
	log *slog.Logger

	// panicMu guards panicModels, the models whose engines are all
	// ejected and routed to anyway (panicRoute); panicking says it is not
	// empty (the fast path when nothing is ejected).
	panicMu     sync.Mutex
	panicModels map[string]bool
	panicking   atomic.Bool
	panics      prometheus.Counter

	// Per engine (label engine; the series of an engine go when it is
	// forgotten: forget).
	ejections *prometheus.CounterVec
	restores  *prometheus.CounterVec
	stalls    *prometheus.CounterVec
}

func newEjector(cfg HealthConfig, reg prometheus.Registerer, id string) *ejector {
	e := &ejector{cfg: cfg, m: map[string]*engineHealth{}, log: slog.New(slog.DiscardHandler), hop: id,
		client: &http.Client{Timeout: cfg.probeGrace(), Transport: &http.Transport{DisableKeepAlives: true}},
		bo:     backoff.Backoff{Min: cfg.EjectionTime, Max: cfg.MaxEjectionTime, Jitter: 0.2}}
	cl := prometheus.Labels{"ingress": id}
	e.ejections = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_engine_ejections_total",
		Help: "Ejections of the engine from routing after failed requests or failed probes.", ConstLabels: cl}, []string{"engine"})
	e.restores = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_engine_restores_total",
		Help: "Returns of the ejected engine to routing after a successful probe (or a request it served during panic routing).", ConstLabels: cl}, []string{"engine"})
	e.stalls = prometheus.NewCounterVec(prometheus.CounterOpts{Name: "kvmesh_ingress_engine_stalls_total",
		Help: "Ejections of the engine by the stall watch: requests in flight, no byte for health.stallAfter, and its probes failed or went unanswered for health.probeTimeout.", ConstLabels: cl}, []string{"engine"})
	ejected := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_engines_ejected",
		Help: "Engines in membership ejected from routing now.", ConstLabels: cl}, e.ejectedMembers)
	e.panicModels = map[string]bool{}
	e.panics = prometheus.NewCounter(prometheus.CounterOpts{Name: "kvmesh_ingress_health_panics_total",
		Help: "Times every engine of a model was ejected for its answers and the replica routed to them anyway (panic routing) rather than refuse the model's requests.", ConstLabels: cl})
	panicNow := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_ingress_health_panic_models",
		Help: "Models whose engines are all ejected and routed to anyway now (panic routing).", ConstLabels: cl}, func() float64 {
		e.panicMu.Lock()
		defer e.panicMu.Unlock()
		return float64(len(e.panicModels))
	})
	for _, c := range []prometheus.Collector{e.ejections, e.restores, e.stalls, ejected, e.panics, panicNow} {
		_ = reg.Register(c) // a second replica in one process keeps the first's series
	}
	return e
}

// useTLS makes probes of https engines use tc (nil: the defaults), the
// requests' TLS config: they trust the engines' CA and present the
// ingress's client certificate in force, so an engine that refused it is
// readmitted once it is renewed (upstreamtls.go), and only then.
func (e *ejector) useTLS(tc *tls.Config) {
	if e == nil || tc == nil {
		return
	}
	e.client.Transport = &http.Transport{DisableKeepAlives: true, TLSClientConfig: tc.Clone()}
}

// record returns engine id's health record (nil: none yet).
func (e *ejector) record(id string) *engineHealth {
	e.mu.RLock()
	defer e.mu.RUnlock()
	return e.m[id]
}

// allowed reports whether engine id may receive requests.
func (e *ejector) allowed(id string) bool {
	if e == nil || e.nEjected.Load() == 0 {
		return true
	}
	h := e.record(id)
	return h == nil || !h.ejected.Load()
}

// stalledOut reports whether the stall watch has ejected engine id (it
// closes the connections of the requests waiting there, which then fail).
func (e *ejector) stalledOut(id string) bool {
	if e == nil || e.nEjected.Load() == 0 {
		return false
	}
	h := e.record(id)
	if h == nil {
		return false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ejected.Load() && h.stalled
}

func (e *ejector) get(id, url string) *engineHealth {
	h := e.record(id)
	if h == nil {
		e.mu.Lock()
		if h = e.m[id]; h == nil {
			h = &engineHealth{id: id, url: url}
			e.m[id] = h
			// Each engine's series exist from its first request, at 0,
			// so rate() and dashboards see them before its first
			// ejection (forget deletes them).
			e.ejections.WithLabelValues(id)
			e.restores.WithLabelValues(id)
			e.stalls.WithLabelValues(id)
		}
		e.mu.Unlock()
	}
	return h
}

// observe records one attempt's outcome (proxy.go calls it per attempt).
func (e *ejector) observe(up *upstream, result string) { e.observeSent(up, result, 0) }

// observeSent is observe of an attempt sent at sent (monoNow's clock; 0:
// not known): only a success of an attempt sent after the engine's
// ejection can readmit it by panic routing.
func (e *ejector) observeSent(up *upstream, result string, sent int64) {
	if e == nil || e.cfg.Disabled {
		return
	}
	kind := healthKind(result, e.dialsWatched)
	if kind == healthNeutral {
		return
	}
	h := e.get(up.id, up.url)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.url = up.url
	if h.ejected.Load() {
		if kind == healthOK && h.panicSent && sent > h.ejectedMono && !h.identity && !h.dead && !h.gone {
			// Panic routing sent it a request (panicRoute) and it
			// answered: it serves, whatever its probe said. An answer to
			// an attempt sent before the ejection (a busy engine has many
			// in flight) says nothing new.
			h.ejections = 0
			e.restoreLocked(h, now, "a request sent to it while every engine of its model was ejected succeeded")
		}
		return // else in-flight attempts that started before the ejection
	}
	w := math.Exp2(-float64(now.Sub(h.last)) / float64(e.cfg.ErrorHalfLife))
	if h.last.IsZero() {
		w = 0
	}
	h.last = now
	h.reqs = h.reqs*w + 1
	h.fails *= w
	if kind == healthOK {
		h.consecutive, h.ejections = 0, 0
		return
	}
	h.fails++
	h.consecutive++
	switch {
	case kind == healthHardFail:
		e.ejectLocked(h, now, result)
	case h.consecutive >= e.cfg.ConsecutiveFailures:
		e.ejectLocked(h, now, fmt.Sprintf("%s, %d failures in a row", result, h.consecutive))
	case h.reqs >= e.cfg.MinRequests && h.fails/h.reqs >= e.cfg.ErrorRate:
		e.ejectLocked(h, now, fmt.Sprintf("%s, error rate %.2f over %.1f recent requests", result, h.fails/h.reqs, h.reqs))
	}
}

// wrongModel ejects the engine of up: it answered that it does not serve
// model, which its sidecar gossips it does (wrongmodel.go). Its probe
// readmits it only when /v1/models lists the model.
func (e *ejector) wrongModel(up *upstream, model string) {
	if e == nil || e.cfg.Disabled {
		return
	}
	h := e.get(up.id, up.url)
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.url, h.model, h.wrongModel = up.url, model, true
	if h.ejected.Load() {
		return
	}
	h.consecutive++
	e.ejectLocked(h, now, fmt.Sprintf("wrong_model: it answered 404, that it does not serve the model %q its sidecar gossips (its model changed, or another engine took its address)", clip(model)))
}

// routingLoop ejects the engine of up: ingress answered its request with
// 508, its URL is a kvmesh ingress (loop.go). Its probe, which carries the
// hop header, gets the 508 too and keeps it out until the URL is an
// engine's. It reports false when passive ejection is off.
func (e *ejector) routingLoop(up *upstream) bool {
	if e == nil || e.cfg.Disabled {
		return false
	}
	h := e.get(up.id, up.url)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.url = up.url
	if h.ejected.Load() {
		return true
	}
	h.consecutive++
	e.ejectLocked(h, time.Now(), fmt.Sprintf("%s: its URL %s is a kvmesh ingress (it answered 508 Loop Detected), not an engine: check its sidecar's --engine-url",
		loopResult, up.url))
	return true
}

// ok records a successful attempt sent at sent (monoNow's clock; 0: not
// known).
func (e *ejector) ok(up *upstream, sent int64) { e.observeSent(up, "ok", sent) }

// ejectLocked ejects h for reason (logged once per ejection).
func (e *ejector) ejectLocked(h *engineHealth, now time.Time, reason string) {
	if h.gone {
		return // nEjected counts the records in m only
	}
	delay := e.bo.Delay(h.ejections)
	h.until = now.Add(delay)
	h.ejections++
	if !h.ejected.Swap(true) {
		e.nEjected.Add(1)
		e.ejections.WithLabelValues(h.id).Inc()
		h.ejectedAt, h.ejectedMono, h.reason, h.idWarned = now, int64(now.Sub(monoBase)), reason, false
		if !strings.HasPrefix(reason, "wrong_model") {
			h.wrongModel = false
		}
		h.identity, h.panicSent = h.wrongModel || strings.HasPrefix(reason, loopResult), false
		h.dead = strings.HasPrefix(reason, "connect_error") || strings.HasPrefix(reason, "client_cert_refused")
		e.log.Warn("engine ejected from routing", "engine", h.id, "reason", reason, "first_probe_in", delay.Round(time.Millisecond).String())
	}
}

// probeLoop probes ejected engines whose ejection time passed, until quit.
// It ticks at least every millisecond apart (tick is ejectionTime ÷ 4,
// which a valid ejectionTime of under 4 ns makes 0: NewTicker would panic).
func (e *ejector) probeLoop(quit <-chan struct{}, tick time.Duration) {
	t := time.NewTicker(max(tick, time.Millisecond))
	defer t.Stop()
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel() // before wg.Wait (deferred last in, first out): probes in flight end at once
	for {
		select {
		case <-quit:
			return
		case now := <-t.C:
			e.watchStalls(ctx, &wg, now)
			if e.nEjected.Load() == 0 {
				continue
			}
			e.mu.RLock()
			for _, h := range e.m {
				h.mu.Lock()
				due := h.ejected.Load() && !h.probing && now.After(h.until)
				if due {
					h.probing = true
				}
				url := h.url
				h.mu.Unlock()
				if due {
					wg.Add(1)
					go func() { // one per ejected engine at most (probing)
						defer wg.Done()
						e.probe(ctx, h, url)
					}()
				}
			}
			e.mu.RUnlock()
		}
	}
}

// watchStalls probes every engine that holds requests of this replica and
// has sent nothing for StallAfter (at most one probe per StallAfter each).
// An engine it has already ejected gets its waiting requests cut again: one
// whose connection was still being dialled or written at the first cut
// would otherwise wait out the idle timeout.
func (e *ejector) watchStalls(ctx context.Context, wg *sync.WaitGroup, now time.Time) {
	if e.cfg.StallAfter <= 0 || e.ups == nil {
		return
	}
	e.stallBuf = e.ups.stalled(e.stallBuf[:0], stallCutoff(now, e.cfg.StallAfter))
	for _, up := range e.stallBuf {
		h := e.get(up.id, up.url)
		h.mu.Lock()
		cut := h.ejected.Load() && h.stalled
		due := !h.ejected.Load() && !h.probing && !now.Before(h.stallNext)
		if due {
			h.probing, h.stallNext = true, now.Add(e.cfg.StallAfter)
		}
		h.mu.Unlock()
		if cut {
			e.ups.closeEngine(up.id)
		}
		if due {
			wg.Add(1)
			go func() { // one per engine at most (probing)
				defer wg.Done()
				e.stallProbe(ctx, h, up)
			}()
		}
	}
	clear(e.stallBuf)
}

// stallProbe probes a stalled engine twice, the second probe a quarter of
// ProbeTimeout after the first and overlapping it (one could meet a busy
// moment of the engine's HTTP server). One answer within ProbeTimeout:
// nothing happens. Neither answered by then (ProbeTimeout×1.25 after the
// stall was seen, where two probes in a row took twice ProbeTimeout): the
// engine leaves routing but keeps its requests, and the probes go on until
// ProbeGrace. One answering then puts it back: slow, not hung. Both failed
// (an error, or no answer within ProbeGrace): its requests still waiting
// for a first byte are cut and move on now. A probe that failed for want
// of the ingress's own resources (no socket: EMFILE and the like,
// localErrno) was never sent and says nothing of the engine: then nothing
// is cut and the engine is not ejected for it (the watch probes again
// after StallAfter).
func (e *ejector) stallProbe(ctx context.Context, h *engineHealth, up *upstream) {
	pctx, cancel := context.WithTimeout(ctx, e.cfg.probeGrace())
	defer cancel()
	results, answered := make(chan error, 2), make(chan struct{})
	// Both probes' goroutines are owned here: their results are drained below.
	go func() { results <- e.get1(pctx, up.url+e.cfg.ProbePath) }()
	go func() {
		gap := time.NewTimer(e.cfg.ProbeTimeout / 4)
		defer gap.Stop()
		select {
		case <-gap.C:
			results <- e.get1(pctx, up.url+e.cfg.ProbePath)
		case <-answered:
			results <- nil // the first answered: no second probe
		case <-pctx.Done():
			results <- pctx.Err()
		}
	}()
	start := time.Now()
	slow := time.NewTimer(e.cfg.ProbeTimeout * 5 / 4)
	defer slow.Stop()
	var err, local error
	pending, ok, out := 2, false, false
	for pending > 0 && !ok {
		select {
		case r := <-results:
			pending--
			if ok = r == nil; ok {
				close(answered)
			} else if err = r; localErrno(r) != 0 {
				local = r
			}
		case <-slow.C:
			out = e.stallOut(ctx, h)
		}
	}
	cancel() // a probe still out has lost its point
	for ; pending > 0; pending-- {
		if r := <-results; r != nil && localErrno(r) != 0 {
			local = r
		}
	}
	now := time.Now()
	h.mu.Lock()
	h.probing = false
	// Cut: both failed, for the engine (not the ingress's own resources),
	// and the engine is out by this probe's doing (out and still out), or
	// not out at all (it failed fast: eject it now).
	cut := !ok && local == nil && !h.gone && ctx.Err() == nil && out == h.ejected.Load()
	switch {
	case !ok && local != nil:
		e.log.Warn("stall probe of an engine failed for want of the ingress's own resources; not held against the engine",
			"engine", h.id, "err", local)
	case ok && out && h.ejected.Load() && !h.stalled && !h.identity:
		e.restoreLocked(h, now, fmt.Sprintf("its stall probe answered after %v (slow, not hung)", now.Sub(start).Round(time.Millisecond)))
	case cut && out:
		h.stalled = true
		e.log.Warn("stalled engine's waiting requests cut: its probes failed", "engine", h.id, "err", err,
			"probe_grace", e.cfg.probeGrace().String())
	case cut:
		e.ejectLocked(h, now, fmt.Sprintf("stalled: requests in flight, no byte for %v, two probes failed: %v", e.cfg.StallAfter, err))
		h.stalled = true
		e.stalls.WithLabelValues(h.id).Inc()
	}
	h.mu.Unlock()
	if cut {
		e.ups.closeEngine(up.id)
	}
}

// stallOut takes a stalled engine whose probes are both unanswered after
// ProbeTimeout out of routing, leaving its requests (stallProbe); true
// when it did (not when the engine was already out, or is forgotten).
func (e *ejector) stallOut(ctx context.Context, h *engineHealth) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ejected.Load() || h.gone || ctx.Err() != nil {
		return false
	}
	e.ejectLocked(h, time.Now(), fmt.Sprintf("stalled: requests in flight, no byte for %v, probes unanswered for %v (its requests stay until they fail or %v pass)",
		e.cfg.StallAfter, e.cfg.ProbeTimeout, e.cfg.probeGrace()))
	e.stalls.WithLabelValues(h.id).Inc()
	return true
}

// probe asks an ejected engine's health endpoint and, when it was ejected
// for a wrong model, whether it serves its model again (checkIdentity):
// something answering /health at the URL is another engine, or the same
// engine with another model. Other ejections are judged by the health
// probe alone: many working engines do not list the name the ingress
// routes by (SGLang without --served-model-name lists its model path,
// llama.cpp, a static engine's friendly name), and another engine that
// took the address answers its first request with the wrong-model 404,
// which fails over and ejects it for a wrong model. A probe that failed
// for want of the ingress's own resources (localErrno) is no verdict: the
// engine is probed again after EjectionTime, its backoff not grown.
func (e *ejector) probe(ctx context.Context, h *engineHealth, url string) {
	err := e.get1(ctx, url+e.cfg.ProbePath)
	var other []string
	if err == nil {
		h.mu.Lock()
		model, wrong := h.model, h.wrongModel
		h.mu.Unlock()
		if wrong {
			other, err = e.checkIdentity(ctx, h.id, url, model)
		}
	}
	now := time.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probing = false
	if err != nil && localErrno(err) != 0 {
		// Never sent (the ingress is out of descriptors, ports, buffers):
		// not a failed probe, so the backoff does not grow and the engine
		// is not marked dead; it is probed again after EjectionTime.
		h.until = now.Add(e.cfg.EjectionTime)
		return
	}
	if err != nil {
		h.until = now.Add(e.bo.Delay(h.ejections))
		h.ejections++
		switch {
		case other != nil || errors.Is(err, ErrRoutingLoop):
			h.identity = true
		default:
			h.dead = errors.Is(err, syscall.ECONNREFUSED) || refusedOurCert(err)
		}
		switch {
		case h.idWarned || h.gone:
		case other != nil:
			h.idWarned = true
			e.log.Warn("engine kept out of routing: its URL serves other models than its sidecar gossips (another engine took its address, or its model changed)",
				"engine", h.id, "err", err, "serves", other)
		case errors.Is(err, ErrRoutingLoop) && !strings.HasPrefix(h.reason, loopResult): // else its ejection said it
			h.idWarned = true
			e.log.Warn("engine kept out of routing: its URL is a kvmesh ingress, not an engine (check its sidecar's --engine-url)",
				"engine", h.id, "url", url, "err", err)
		}
		return
	}
	e.restoreLocked(h, now, "its probe answered")
}

// restoreLocked returns h to routing (how: for the log).
func (e *ejector) restoreLocked(h *engineHealth, now time.Time, how string) {
	h.consecutive, h.fails, h.reqs, h.stalled, h.wrongModel, h.identity, h.dead, h.panicSent = 0, 0, 0, false, false, false, false, false
	if h.ejected.Swap(false) {
		e.nEjected.Add(-1)
		e.restores.WithLabelValues(h.id).Inc()
		e.log.Info("engine restored to routing: "+how, "engine", h.id,
			"ejected_for", now.Sub(h.ejectedAt).Round(time.Millisecond).String(), "reason", h.reason)
	}
}

// maxModelsBody bounds the /v1/models answer a probe reads.
const maxModelsBody = 1 << 20

// checkIdentity asks the engine's /v1/models (one more GET, only once the
// health probe of an engine ejected for a wrong model answered) whether it
// lists the model its sidecar gossips (else fallback, the model it was
// ejected for): only a list with the model readmits it. other is the
// listed models when the model is not among them (clipped, for the log).
func (e *ejector) checkIdentity(ctx context.Context, id, url, fallback string) (other []string, err error) {
	model, auth := fallback, []byte(nil)
	if e.identity != nil {
		var gossiped string
		if gossiped, auth = e.identity(id); gossiped != "" {
			model = gossiped
		}
	}
	if model == "" {
		return nil, nil
	}
	ids, err := e.listModels(ctx, url+"/v1/models", auth)
	switch {
	case err != nil:
		return nil, fmt.Errorf("identity probe: %w", err)
	case slices.Contains(ids, model):
		return nil, nil
	}
	if len(ids) > 4 {
		ids = ids[:4]
	}
	other = make([]string, 0, len(ids))
	for _, m := range ids {
		other = append(other, clip(m))
	}
	return other, fmt.Errorf("identity probe: /v1/models does not list the model %q", clip(model))
}

// listModels returns the model ids of an OpenAI /v1/models answer.
func (e *ejector) listModels(ctx context.Context, url string, auth []byte) ([]string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	if auth != nil {
		req.Header.Set("Authorization", string(auth))
	}
	req.Header.Set(hopHeader, e.hop)
	resp, err := e.client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if err := loopProbed(resp); err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("GET /v1/models: status %d", resp.StatusCode)
	}
	var list struct {
		Data []struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, maxModelsBody)).Decode(&list); err != nil {
		return nil, fmt.Errorf("GET /v1/models: %w", err)
	}
	ids := make([]string, len(list.Data))
	for i, d := range list.Data {
		ids[i] = d.ID
	}
	return ids, nil
}

func (e *ejector) get1(ctx context.Context, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	req.Header.Set(hopHeader, e.hop)
	resp, err := e.client.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if err := loopProbed(resp); err != nil {
		return fmt.Errorf("probe %s: %w", url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("probe %s: status %d", url, resp.StatusCode)
	}
	return nil
}

// loopProbed is ErrRoutingLoop when a probe's answer is a kvmesh
// ingress's 508 refusing a routing loop (loop.go), else nil.
func loopProbed(resp *http.Response) error {
	if resp.StatusCode != http.StatusLoopDetected || resp.Header.Get(ingressHeader) == "" {
		return nil
	}
	return fmt.Errorf("%w: a kvmesh ingress answered 508 Loop Detected", ErrRoutingLoop)
}

// forget drops engine id's record (it left membership: forget.go), and
// with it its ejection and its series: engine ids come and go with pods,
// and a departed engine's counters would stay forever. The series are
// deleted under h.mu after gone is set, so no ejection, stall or restore
// of the record (each counted under h.mu, none once gone) brings them back.
func (e *ejector) forget(id string) {
	if e == nil {
		return
	}
	e.mu.Lock()
	h := e.m[id]
	delete(e.m, id)
	e.mu.Unlock()
	if h == nil {
		return
	}
	h.mu.Lock()
	h.gone = true
	if h.ejected.Swap(false) {
		e.nEjected.Add(-1)
	}
	e.ejections.DeleteLabelValues(id)
	e.restores.DeleteLabelValues(id)
	e.stalls.DeleteLabelValues(id)
	h.mu.Unlock()
}

// ejectedMembers is the kvmesh_ingress_engines_ejected gauge: the ejected
// engines still in membership. A record outlives its engine's membership
// by the forget grace (forget.go: ten minutes, so that an engine back
// within it keeps its ejection), and a dead engine's record stays ejected
// all that time; counted, it would read as engines out of routing when
// every engine there is healthy. Membership is as the departures sweep
// last saw it (forget.go, every engineForgetEvery): an engine it has not
// seen yet counts as a member. The ids are copied before the sweep's lock
// is taken: the sweep holds it while it forgets records (e.mu).
func (e *ejector) ejectedMembers() float64 {
	if e.nEjected.Load() == 0 {
		return 0
	}
	out := e.ejected()
	if e.ups == nil {
		return float64(len(out))
	}
	d := &e.ups.departed
	d.mu.Lock()
	defer d.mu.Unlock()
	n := 0
	for _, id := range out {
		if at, ok := d.seen[id]; !ok || !at.Before(d.last) {
			n++
		}
	}
	return float64(n)
}

// ids appends the engine ids with a record.
func (e *ejector) ids(dst []string) []string {
	if e == nil {
		return dst
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	for id := range e.m {
		dst = append(dst, id)
	}
	return dst
}

// ejected lists the ejected engine ids (debugging, tests).
func (e *ejector) ejected() []string {
	if e == nil {
		return nil
	}
	e.mu.RLock()
	defer e.mu.RUnlock()
	var out []string
	for id, h := range e.m {
		if h.ejected.Load() {
			out = append(out, id)
		}
	}
	return out
}

// state reports whether engine id is ejected and, if so, whether for
// its answers (errors, stalls, failed probes: panic routing may still use
// it) rather than for what its URL is.
func (e *ejector) state(id string) (ejected, byAnswers bool) {
	if e == nil || e.nEjected.Load() == 0 {
		return false, false
	}
	h := e.record(id)
	if h == nil || !h.ejected.Load() {
		return false, false
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	return true, !h.identity && !h.dead
}

// healthMembership marks ejected engines unhealthy in what membership
// reports, so the scheduler's health filter drops them per request, and
// marks those panic routing may set back (panicOK). Reading membership
// has no side effect: only a request's own list is panic-routed
// (panicRoute, from call.candidates).
type healthMembership struct {
	Membership
	ej *ejector
}

func (m healthMembership) Engines(dst []EngineInfo) []EngineInfo {
	n := len(dst)
	dst = m.Membership.Engines(dst)
	if m.ej.nEjected.Load() == 0 {
		return dst
	}
	for i := n; i < len(dst); i++ {
		out, byAnswers := m.ej.state(dst[i].ID)
		if !out {
			continue
		}
		// Only an engine its sidecar calls ready may be routed to in a
		// panic: one gossip calls not ready is out for a reason this
		// replica's view cannot overrule.
		dst[i].panicOK = byAnswers && dst[i].Healthy
		dst[i].Healthy = false
	}
	return dst
}

// panicRoute restores, in list, the engines ejected for their answers of
// every model left with no ready engine that serves whole requests, as
// Envoy's panic threshold does: when passive health has ejected all of a
// model's engines (a host so loaded that every engine's answers and probes
// time out, a shared dependency's blip), a request sent to one may still
// succeed (and readmits it: observe), where refusing them all is a sure
// outage until a probe answers (up to health.maxEjectionTime). A model's
// panic starts and ends with a log line and is counted.
func (e *ejector) panicRoute(list []EngineInfo) {
	if e == nil || (e.nEjected.Load() == 0 && !e.panicking.Load()) {
		return
	}
	routed := false
	for i := range list {
		if !list[i].panicOK || list[i].Healthy {
			continue // not ejected for its answers, or already set back
		}
		model := list[i].Model
		if servable(list, model) {
			continue
		}
		routed = true
		for j := i; j < len(list); j++ {
			if list[j].panicOK && list[j].Model == model {
				list[j].Healthy = true
				e.panicSend(list[j].ID)
			}
		}
		e.panicMu.Lock()
		if !e.panicModels[model] {
			e.panicModels[model] = true
			e.panicking.Store(true)
			e.panics.Inc()
			e.log.Warn("every engine of the model is ejected: routing to them anyway (panic routing) until one answers", "model", model)
		}
		e.panicMu.Unlock()
	}
	if routed || e.panicking.Load() {
		e.panicOver(list)
	}
}

// panicSend marks engine id as panic-routed: its next answer readmits it
// (observe), and the stall watch does not cut the requests sent to it,
// if it ejected it: they are the model's only chance (a frozen engine's
// wait for a first byte is then bounded by Config.FirstByteTimeout).
func (e *ejector) panicSend(id string) {
	h := e.record(id)
	if h == nil {
		return
	}
	h.mu.Lock()
	h.stalled, h.panicSent = false, h.ejected.Load()
	h.mu.Unlock()
}

// panicOver ends the panic of each model that now has a ready engine not
// ejected, or no ejected one left (restored, or gone from membership).
func (e *ejector) panicOver(list []EngineInfo) {
	e.panicMu.Lock()
	defer e.panicMu.Unlock()
	for model := range e.panicModels {
		ejected, ready := false, false
		for i := range list {
			if list[i].Model != model {
				continue
			}
			ejected = ejected || list[i].panicOK
			ready = ready || (list[i].Healthy && !list[i].panicOK && !list[i].prefillOnly())
		}
		switch {
		case ready:
			delete(e.panicModels, model)
			e.log.Info("an engine of the model is back in routing: panic routing over", "model", model)
		case !ejected:
			// Restored engines count as ready above: these left panic
			// routing otherwise (their sidecar calls them not ready, or
			// they left membership), and no engine of the model serves.
			delete(e.panicModels, model)
			e.log.Warn("no engine of the model is ejected for its answers any more, and none is ready (not ready by its sidecar, or gone): panic routing over", "model", model)
		}
	}
	e.panicking.Store(len(e.panicModels) > 0)
}

// servable reports whether list has a ready engine of model that serves
// whole requests (not ejected, not an SGLang prefill-only server).
func servable(list []EngineInfo, model string) bool {
	for i := range list {
		if list[i].Model == model && list[i].Healthy && !list[i].prefillOnly() {
			return true
		}
	}
	return false
}
