package ingress

import (
	"cmp"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/valyala/fasthttp"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// maxUpstreamHead is an upstream connection's read buffer, and so the
// longest answer head the ingress reads: 16 KiB, as the heads it accepts
// from clients (fasthttp's default, 4 KiB, is passed by an engine behind a
// proxy that adds headers of its own). It costs that much per connection
// in use, for as long as a stream lasts (10,000 streams: 160 MiB), so it
// is not larger: the request id an engine echoes is bounded apart
// (maxRequestID).
const maxUpstreamHead = 16 << 10

// maxConnAge bounds how long an upstream connection is reused. A pool is
// per engine URL and its host name is resolved only when a connection is
// dialled, so without a bound a name (a Service, a headless Service's
// record) that moves to another address while the old one still accepts
// would keep every request on the old address for as long as traffic keeps
// the connections busy. A connection past its age carries one more request,
// sent with "Connection: close", and is closed when that answer ends
// (fasthttp's MaxConnDuration): a connection in use, a stream above all, is
// never cut. A minute costs one dial per connection per minute.
const maxConnAge = 60 * time.Second

// upstream is one engine's connection pool and this replica's in-flight
// count for it, keyed by engine id (and URL: an engine that moves gets a new
// one). An engine that leaves membership keeps its upstream until it has
// been gone for a grace period with nothing in flight (forget.go).
type upstream struct {
	id       string
	url      string
	hc       *fasthttp.HostClient
	inflight atomic.Int64 // requests this replica has on the engine now
	// prefill is the uncached prompt tokens of this replica's requests on
	// the engine that have not had their first byte yet; active is prompt
	// plus expected output tokens of every request in flight. The
	// scheduler's cost model reads both (scheduler.Engine.Local*Tokens).
	prefill atomic.Int64
	// streamPrefill is the part of prefill charged by streamed requests:
	// the router-side hold's room (hold.go). A non-streamed answer's first
	// byte comes only with the whole answer, so its charge outlives its
	// prefill by the whole decode; counted as queued prefill, it would cap
	// each engine's batch at the hold's seconds of prompts.
	streamPrefill atomic.Int64
	// bufDone is when this replica's non-streamed requests sent to the
	// engine are estimated to have had their prefill (ns on Server.holdNow,
	// a monotonic clock): their uncached tokens queued one after another at
	// the learned prefill rate (hold.go, queueBuffered), so the hold counts
	// them without waiting for a first byte that comes only with the whole
	// answer.
	bufDone atomic.Int64
	active  atomic.Int64
	// kv is the KV, in tokens, this replica's requests in flight hold on
	// the engine: the distinct blocks of their prompts (kvRefs), a prefix
	// they share counted once as the engine holds it once, plus each one's
	// prompt tail (its last, partial block) and expected output
	// (scheduler.Engine.LocalKVTokens).
	kv atomic.Int64
	// kvRefs counts, per prompt block key, the requests in flight here
	// that hold it (kvAdd, kvDrop); under kvMu.
	kvMu     sync.Mutex
	kvRefs   map[uint64]int32
	total    atomic.Uint64
	failures atomic.Uint64
	lw       learnLoad     // the cost learner's counts (learn.go)
	lat      recentLatency // recent TTFT and TPOT (latency.go)
	// progress is when the engine last sent this replica a byte, or when
	// its first request in flight started (monoNow): the stall watch
	// (health.go) suspects an engine with requests in flight and no
	// progress for HealthConfig.StallAfter.
	progress atomic.Int64
	// wrong: the LoRA adapters the engine answered it does not serve,
	// kept from it for a while (wrongmodel.go).
	wrong wrongAdapters
}

// monoBase anchors monoNow.
var monoBase = time.Now()

// monoNow is the monotonic clock in ns since monoBase: a wall-clock step
// neither makes every engine look stalled nor hides a stall.
func monoNow() int64 { return int64(time.Since(monoBase)) }

// stallCutoff is the progress (monoNow's clock) before which an engine with
// requests in flight has been silent for after at now; monotonic when now
// is a time.Now() reading.
func stallCutoff(now time.Time, after time.Duration) int64 { return int64(now.Sub(monoBase) - after) }

// upstreams is the set of engines this replica has talked to (and not yet
// forgotten: forget.go).
// Lock rule: mu guards m only; lookups of a known engine take the read lock.
type upstreams struct {
	cfg *Config
	tls *tls.Config // for https engines; nil: the defaults
	mu  sync.RWMutex
	m   map[string]*upstream // key: engine id

	connMu sync.Mutex // guards conns
	conns  map[*idleConn]struct{}

	// departed tracks engines gone from membership, whose state here is
	// dropped after a grace period (forget.go; the load loop's).
	departed departures

	// Watched non-streamed requests (clientwatch.go), by call number.
	nextCall atomic.Uint64
	nWatched atomic.Int64 // len(watched), read without the lock on every write
	watchMu  sync.Mutex   // guards watched
	watched  map[uint64]*watch

	// tlsErrs and log count and warn of TLS failures with engines
	// (upstreamtls.go); tlsLastLog is when the last warning was (monotime;
	// 0: none yet).
	tlsErrs    *prometheus.CounterVec // cause
	log        *slog.Logger
	tlsLastLog atomic.Int64
	// authLastLog is when the last warning of an engine refusing the
	// ingress's engine credential was (monotime, 0: none yet;
	// upstreamauth.go).
	authLastLog atomic.Int64

	// dialFault replaces the engines' dial in tests (a fake local error
	// such as EMFILE); nil in production. Set before the first request.
	dialFault func(addr string) (net.Conn, error)
	// connAge replaces maxConnAge in tests (0: maxConnAge). Set before
	// the first request.
	connAge time.Duration
}

func newUpstreams(cfg *Config) *upstreams {
	return &upstreams{cfg: cfg, m: map[string]*upstream{}, conns: map[*idleConn]struct{}{}, watched: map[uint64]*watch{}}
}

// closeEngine closes the connections to engine id whose request has not
// committed to its client (connState awaiting or held): those requests fail
// at once and, having sent nothing to their clients, are retried on another
// engine. A streamed request that got its response headers but no first
// event is among them. Streams already relaying are left to go on if the
// engine comes back (or to the idle timeout): their clients have bytes and
// their own timeouts. Used when the stall watch ejects the engine.
func (u *upstreams) closeEngine(id string) int {
	u.connMu.Lock()
	defer u.connMu.Unlock()
	n := 0
	for c := range u.conns {
		if c.up.id == id && c.state.Load() != connIdle {
			c.stallCut.Store(true)
			_ = c.Conn.Close()
			n++
		}
	}
	return n
}

// stalled appends the engines with requests in flight and no progress
// since before cutoff (monoNow's clock).
func (u *upstreams) stalled(dst []*upstream, cutoff int64) []*upstream {
	u.mu.RLock()
	defer u.mu.RUnlock()
	for _, up := range u.m {
		if up.inflight.Load() > 0 && up.progress.Load() < cutoff {
			dst = append(dst, up)
		}
	}
	return dst
}

// closeAll closes every upstream connection: requests still running fail
// (streams end with an error event). Used when the drain times out.
func (u *upstreams) closeAll() int {
	u.connMu.Lock()
	defer u.connMu.Unlock()
	n := len(u.conns)
	for c := range u.conns {
		_ = c.Conn.Close()
	}
	return n
}

// get returns the upstream for engine id at baseURL, creating it on first use
// or when the engine moved to another URL.
func (u *upstreams) get(id, baseURL string) (*upstream, error) {
	up := u.lookup(id)
	if up != nil && up.url == baseURL {
		return up, nil
	}
	pu, err := url.Parse(baseURL)
	if err != nil || pu.Host == "" {
		return nil, fmt.Errorf("engine %s: bad url %q: %w", id, baseURL, ErrNoEngine)
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	if up = u.m[id]; up != nil && up.url == baseURL {
		return up, nil
	}
	cfg := u.cfg
	idle, first := cfg.IdleTimeout, cfg.firstByteWait()
	dialer := &net.Dialer{Timeout: cfg.ConnectTimeout}
	nu := &upstream{id: id, url: baseURL}
	var tc *tls.Config // https: the handshake is the dial's (upstreamtls.go)
	if pu.Scheme == "https" {
		tc = &tls.Config{}
		if u.tls != nil {
			tc = u.tls.Clone()
		}
		if tc.ServerName == "" {
			tc.ServerName = pu.Hostname()
		}
	}
	nu.hc = &fasthttp.HostClient{
		Addr:                          pu.Host,
		IsTLS:                         pu.Scheme == "https",
		TLSConfig:                     tc,
		Name:                          "kvmesh-ingress",
		MaxConns:                      cfg.MaxConnsPerEngine,
		MaxIdleConnDuration:           upstreamIdle, // also how long a closed client's cleaner lingers
		MaxConnDuration:               cmp.Or(u.connAge, maxConnAge),
		StreamResponseBody:            true,
		DisableHeaderNamesNormalizing: false,
		// An answer's head may be long (an engine or a proxy in front of
		// it adding headers); one over the buffer fails as a protocol
		// error (classifyErr), never quoted: the error names no content.
		ReadBufferSize:            maxUpstreamHead,
		SecureErrorLogMessage:     true,
		MaxIdemponentCallAttempts: 1, // retries are ours: on the next engine
		RetryIfErr:                func(*fasthttp.Request, int, error) (bool, bool) { return false, false },
		Dial: func(addr string) (net.Conn, error) {
			dial := func(addr string) (net.Conn, error) { return dialer.Dial("tcp", addr) }
			if u.dialFault != nil {
				dial = u.dialFault
			}
			c, err := dial(addr)
			if err != nil {
				return nil, err
			}
			ic := &idleConn{Conn: c, idle: idle, first: first, set: u, up: nu}
			ic.laddr = &connAddr{Addr: c.LocalAddr(), c: ic}
			u.connMu.Lock()
			u.conns[ic] = struct{}{}
			u.connMu.Unlock()
			if tc != nil {
				return u.dialTLS(ic, tc, cfg.ConnectTimeout)
			}
			return ic, nil
		},
	}
	if up != nil { // moved: keep counting on the old one until its requests end
		nu.inflight.Store(0)
	}
	u.m[id] = nu
	return nu, nil
}

// forget drops engine id's upstream unless this replica has requests on
// it (false then), and closes its idle connections. An engine absent from
// membership gets no new request; one that races the check in (membership
// read before the engine left) counts on the dropped upstream and ends
// there, as on an upstream replaced when its engine moved.
func (u *upstreams) forget(id string) bool {
	u.mu.Lock()
	up := u.m[id]
	if up != nil && up.busy() {
		u.mu.Unlock()
		return false
	}
	delete(u.m, id)
	u.mu.Unlock()
	if up != nil {
		up.hc.CloseIdleConnections()
	}
	return true
}

// busy reports whether engine id has requests of this replica in flight.
func (u *upstreams) busy(id string) bool {
	up := u.lookup(id)
	return up != nil && up.busy()
}

func (up *upstream) busy() bool {
	return up.inflight.Load() != 0 || up.prefill.Load() != 0 || up.active.Load() != 0
}

// ids appends the engine ids with an upstream.
func (u *upstreams) ids(dst []string) []string {
	u.mu.RLock()
	defer u.mu.RUnlock()
	for id := range u.m {
		dst = append(dst, id)
	}
	return dst
}

// snapshot appends every engine's in-flight count.
func (u *upstreams) snapshot(dst []EngineLoad) []EngineLoad {
	u.mu.RLock()
	defer u.mu.RUnlock()
	for id, up := range u.m {
		dst = append(dst, EngineLoad{Engine: id, InFlight: int(up.inflight.Load())})
	}
	return dst
}

// inflight returns this replica's in-flight count for engine id.
func (u *upstreams) inflight(id string) int {
	n, _, _ := u.local(id)
	return n
}

// local returns this replica's in-flight requests, pending prefill tokens
// and active tokens on engine id.
func (u *upstreams) local(id string) (inflight, prefill, active int) {
	up := u.lookup(id)
	if up == nil {
		return 0, 0, 0
	}
	return up.load()
}

// load is this replica's in-flight requests, pending prefill tokens and
// active tokens on the engine.
func (up *upstream) load() (inflight, prefill, active int) {
	return int(up.inflight.Load()), int(up.prefill.Load()), int(up.active.Load())
}

// kvTokens is the KV this replica's requests in flight hold on the engine
// (upstream.kv).
func (up *upstream) kvTokens() int { return int(up.kv.Load()) }

// kvAdd registers the prompt block keys of a request sent to the engine and
// returns how many of them no other request in flight here held: the
// blocks it adds to the engine's KV.
func (up *upstream) kvAdd(keys []uint64) int {
	if len(keys) == 0 {
		return 0
	}
	up.kvMu.Lock()
	defer up.kvMu.Unlock()
	if up.kvRefs == nil {
		up.kvRefs = make(map[uint64]int32, len(keys))
	}
	added := 0
	for _, k := range keys {
		if up.kvRefs[k] == 0 {
			added++
		}
		up.kvRefs[k]++
	}
	return added
}

// kvDrop unregisters keys, which kvAdd registered, and returns how many no
// request in flight here holds any more.
func (up *upstream) kvDrop(keys []uint64) int {
	if len(keys) == 0 {
		return 0
	}
	up.kvMu.Lock()
	defer up.kvMu.Unlock()
	freed := 0
	for _, k := range keys {
		if n := up.kvRefs[k]; n > 1 {
			up.kvRefs[k] = n - 1
		} else {
			delete(up.kvRefs, k)
			freed++
		}
	}
	return freed
}

// kvHeld returns how many of keys requests in flight here hold.
func (up *upstream) kvHeld(keys []uint64) int {
	up.kvMu.Lock()
	defer up.kvMu.Unlock()
	held := 0
	for _, k := range keys {
		if up.kvRefs[k] > 0 {
			held++
		}
	}
	return held
}

// lookup returns engine id's upstream, nil when this replica has none.
func (u *upstreams) lookup(id string) *upstream {
	u.mu.RLock()
	defer u.mu.RUnlock()
	return u.m[id]
}

// EngineLoad is this replica's in-flight request count on one engine, the
// value shared through gossip.
type EngineLoad struct {
	Engine   string
	InFlight int
	// PrefillLegs and PrefillQueued are this replica's P/D prefill legs on
	// the engine: in flight, and waiting at its admission (pd.go).
	PrefillLegs, PrefillQueued int
}

// upstreamIdle is how long an idle connection to an engine is kept for
// reuse: under the 5 s after which vLLM's and SGLang's uvicorn close an idle
// keep-alive connection (vLLM's TIMEOUT_KEEP_ALIVE). At 5 s as well, a
// connection the engine had just closed could be reused, and the request
// written to it would fail before its first byte ("the server closed
// connection before returning the first response byte") and be retried
// elsewhere, losing its cache affinity. A client lets go first.
const upstreamIdle = 4 * time.Second

// idleConn gives every Read its own deadline, so a hung engine is detected
// between streamed chunks while a long healthy stream is never cut
// (fasthttp's own timeouts bound the whole exchange instead). Until the
// request commits to its client the wait is the first-byte wait instead
// (Config.FirstByteTimeout): none while the stall watch judges liveness, as
// a healthy engine sends a non-streamed answer only when the whole
// generation is done. A call made with a timeout (the engine's /tokenize)
// is bounded by it as well (SetReadDeadline).
type idleConn struct {
	net.Conn
	idle  time.Duration
	first time.Duration // the wait before the commit; 0: none (Config.firstByteWait)
	set   *upstreams
	up    *upstream // whose progress a read marks, and whose closeEngine closes it
	laddr *connAddr
	once  sync.Once
	// state is where the request on the connection is (connIdle,
	// connAwaiting, connHeld): closeEngine cuts all but idle ones, and
	// the read deadline follows it.
	state atomic.Int32
	// firstExpired: a read under the first-byte wait timed out (reset per
	// request), which the proxy tells apart from a dial timeout.
	firstExpired atomic.Bool
	// tlsErr is an engine's alert refusing this ingress's certificate,
	// read on the connection (upstreamtls.go).
	tlsErr atomic.Pointer[engineTLSError]
	// stallCut: closeEngine cut the request on it (the stall watch's
	// verdict on a hung engine), which its error then says rather than
	// "the engine closed the connection".
	stallCut atomic.Bool
	// deadline is the exchange's own read deadline (a monotime reading,
	// so that a wall-clock step between setting it and a read moves it
	// not; 0: none), which fasthttp sets for a call with a timeout
	// (DoTimeout: the engine's /tokenize) and clears for the next call on
	// the connection.
	deadline atomic.Int64
}

// Connection states. A request written is awaiting until its first answer
// byte; the proxy holds it past the response head until its answer commits
// to the client (the first event relayed, or the whole buffered answer read),
// so a stream with headers and no event is still cut by the stall watch.
// Exchanges the proxy does not hold (P/D legs, /tokenize) are idle again
// from their first byte.
const (
	connIdle int32 = iota
	connAwaiting
	connHeld
)

// connAddr is the local address an idleConn reports. fasthttp.HostClient
// does not say which connection carries a request; Response.LocalAddr, taken
// from the connection before the request is written, is the one trace of it
// a response keeps, so connOf finds the connection with no lookup.
type connAddr struct {
	net.Addr
	c *idleConn
}

func (c *idleConn) LocalAddr() net.Addr { return c.laddr }

// connOf returns the connection that carried resp's exchange, or nil (the
// dial failed, or resp did not come through an upstreams pool).
func connOf(resp *fasthttp.Response) *idleConn {
	if a, ok := resp.LocalAddr().(*connAddr); ok {
		return a.c
	}
	return nil
}

// hold keeps c's request uncommitted after its response head (nil-safe).
func (c *idleConn) hold() {
	if c != nil {
		c.state.Store(connHeld)
	}
}

// release marks c's exchange committed to the client or over (nil-safe).
// Called before the connection can go back to the pool.
func (c *idleConn) release() {
	if c != nil {
		c.state.Store(connIdle)
	}
}

// firstByteExpired reports whether c's current request timed out waiting
// for its commit (nil-safe).
func (c *idleConn) firstByteExpired() bool {
	return c != nil && c.firstExpired.Load()
}

// wasStallCut reports whether the stall watch cut c's request (nil-safe).
func (c *idleConn) wasStallCut() bool {
	return c != nil && c.stallCut.Load()
}

func (c *idleConn) Close() error {
	c.once.Do(func() {
		c.set.connMu.Lock()
		delete(c.set.conns, c)
		c.set.connMu.Unlock()
	})
	return c.Conn.Close()
}

func (c *idleConn) Read(p []byte) (int, error) {
	st := c.state.Load()
	d := c.idle
	if st != connIdle {
		d = c.first
	}
	var deadline time.Time // zero: none
	if d > 0 {
		deadline = time.Now().Add(d)
	}
	own := false // the exchange's own deadline comes first
	if dl := c.deadline.Load(); dl != 0 && (deadline.IsZero() || dl < monotime.Of(deadline)) {
		deadline, own = monotime.Time(dl), true
	}
	if err := c.Conn.SetReadDeadline(deadline); err != nil {
		return 0, err
	}
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.up.progress.Store(monoNow()) // the engine is answering (stall watch, health.go)
		if st == connAwaiting {
			c.state.CompareAndSwap(connAwaiting, connIdle)
		}
	}
	if err != nil && st != connIdle && !own && errors.Is(err, os.ErrDeadlineExceeded) {
		c.firstExpired.Store(true)
	}
	return n, err
}

// Write links a watched request to this connection as it is written.
func (c *idleConn) Write(p []byte) (int, error) {
	if c.set.nWatched.Load() > 0 {
		c.set.claim(c, p)
	}
	if c.state.Load() != connAwaiting {
		c.state.Store(connAwaiting)
		c.firstExpired.Store(false)
	}
	return c.Conn.Write(p)
}

// SetReadDeadline sets the exchange's own deadline; each read waits until
// the earlier of it and the per-read deadline above. Only a call with a
// timeout sets one (fasthttp clears it for the next call on the
// connection), so streams, which have none, keep the per-read deadline.
func (c *idleConn) SetReadDeadline(t time.Time) error {
	var ns int64
	if !t.IsZero() {
		ns = monotime.Of(t)
	}
	c.deadline.Store(ns)
	return nil
}
