package ingress

import (
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"
)

// Client-disconnect cancellation for non-streamed requests.
//
// fasthttp gives a handler no close signal, and reading the client's
// connection from the handler would steal the bytes of a pipelined next
// request. So a watcher goroutine, owned by the request, waits for the
// connection to become readable and PEEKs one byte (MSG_PEEK: nothing is
// consumed, keep-alive and pipelining keep working). Zero bytes means the
// client closed its side: the upstream request is cancelled by closing the
// upstream connection that carries it, which is how an engine (vLLM, the
// simulator) learns to abort. Bytes are a pipelined request or, over TLS, a
// record (a TLS client that closes sends its close_notify alert ahead of
// its FIN): on Linux the watcher then asks poll for POLLRDHUP, which
// reports a FIN behind unread bytes, and otherwise waits on; elsewhere it
// ends without a verdict, and TLS connections are not watched. The handler
// stops the watcher before it returns by setting a past read deadline
// (ctx.SetReadDeadline, which fasthttp resets after the handler) and waits
// for it to exit, so its lifetime is bounded by the request's.
//
// Most non-streamed answers arrive within milliseconds; the watcher only
// starts after watchDelay (a pooled timer), so those pay no goroutine, no
// deadline syscalls and no wake-up, and a client that vanishes sooner costs
// the engine at most watchDelay of work.
//
// Which upstream connection carries the request is not visible through
// fasthttp.HostClient, so a watched request is tagged with a header
// (watchHeader: call number) that the upstream connection wrapper (idleConn)
// recognises when the request is written. The watcher peeks at the socket
// under TLS (socketOf). Connections that are not TCP (or platforms without
// MSG_PEEK) are not watched; a client that half-closes
// (shutdown(SHUT_WR)) while waiting for its answer is taken as gone, as
// nginx and vLLM do.

const watchHeader = "X-Kvmesh-Call"

var watchTag = []byte("\r\n" + watchHeader + ": ")

// watchDelay is how long a non-streamed request runs before its client
// connection is watched.
const watchDelay = 10 * time.Millisecond

// watch is one watched request. Lock rule: mu guards conn, canceled,
// expired, done and attempts. attempts is kept across watchPool, so a late
// timer of a watch's earlier request finds its number stale.
type watch struct {
	ups    *upstreams
	ctx    *fasthttp.RequestCtx
	client net.Conn
	id     uint64
	idText []byte
	timer  *time.Timer // runs w.run after watchDelay
	// exited gets one value when run returns, which stop takes: the
	// channel stays empty between requests, so the pooled watch keeps it
	// (a closed one could not be reused, and a new one per request was an
	// allocation on every request's path).
	exited chan struct{}

	mu       sync.Mutex
	conn     *idleConn // the upstream connection carrying the current attempt
	canceled bool      // the client went away
	expired  bool      // the current attempt is past its deadline (expire)
	done     bool      // the upstream exchange is over: conn is not ours any more
	attempts uint64    // the current attempt's number (attempt)
}

var watchPool = sync.Pool{New: func() any { return new(watch) }}

// startWatch watches ctx's client connection for the lifetime of one
// non-streamed request; nil when the connection cannot be watched.
func (u *upstreams) startWatch(ctx *fasthttp.RequestCtx) *watch {
	conn := ctx.Conn()
	if conn == nil || !canPeek(conn) {
		return nil
	}
	w := watchPool.Get().(*watch)
	w.ups, w.ctx, w.client = u, ctx, conn
	w.id = u.nextCall.Add(1)
	w.idText = strconv.AppendUint(w.idText[:0], w.id, 10)
	w.conn, w.canceled, w.expired, w.done = nil, false, false, false
	if w.exited == nil {
		w.exited = make(chan struct{}, 1)
	}
	// The read deadline fasthttp set for reading the request (ReadTimeout)
	// would end the watch without a verdict once it passes, and a client
	// leaving later would go unseen: the answer may take longer. Cleared
	// here, before the watcher can start, so stop's past deadline always
	// comes after it.
	_ = ctx.SetReadDeadline(time.Time{})
	u.watchMu.Lock()
	u.watched[w.id] = w
	u.watchMu.Unlock()
	u.nWatched.Add(1)
	if w.timer == nil {
		w.timer = time.AfterFunc(watchDelay, w.run)
	} else {
		w.timer.Reset(watchDelay)
	}
	return w
}

// run is the watcher, on the timer's goroutine.
func (w *watch) run() {
	defer func() { w.exited <- struct{}{} }() // never blocks: stop takes each one before w is reused
	if peerClosed(w.client) {
		w.cancel()
	}
}

// cancel closes the upstream connection of the current attempt, if any.
func (w *watch) cancel() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.canceled = true
	if w.conn != nil && !w.done {
		_ = w.conn.Close()
	}
}

// expire cuts attempt n, past its deadline, without taking the client as
// gone: its upstream connection is closed now, or by claim as it is
// written when the deadline passed first (a leg admitted just before its
// deadline, a slow dial). A later attempt is left alone: the timer of an
// attempt that ended may fire late.
func (w *watch) expire(n uint64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if n != w.attempts {
		return
	}
	w.expired = true
	if w.conn != nil && !w.done {
		_ = w.conn.Close()
	}
}

// isCanceled reports whether the client went away.
func (w *watch) isCanceled() bool {
	if w == nil {
		return false
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.canceled
}

// attempt resets the link before a new upstream attempt and returns its
// number, for expire.
func (w *watch) attempt() uint64 {
	if w == nil {
		return 0
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.attempts++
	w.conn, w.done, w.expired = nil, false, false
	return w.attempts
}

// release marks the upstream exchange over before its connection goes back
// to the pool, where another request may use it.
func (w *watch) release() {
	if w == nil {
		return
	}
	w.mu.Lock()
	w.conn, w.done = nil, true
	w.mu.Unlock()
}

// stop ends the watcher and waits for it; called from the handler.
func (w *watch) stop() {
	w.release()
	if !w.timer.Stop() {
		// The watcher started (or is starting): a past deadline ends its
		// wait, or its first one; fasthttp clears the handler's read
		// deadline only after the handler returns, so it cannot be missed.
		// Stop is false exactly when the timer fired, once per Reset, so
		// run sends once and this takes it: exited is empty again.
		_ = w.ctx.SetReadDeadline(time.Unix(1, 0))
		<-w.exited
	}
	u := w.ups
	u.watchMu.Lock()
	delete(u.watched, w.id)
	u.watchMu.Unlock()
	u.nWatched.Add(-1)
	w.ctx, w.ups, w.client = nil, nil, nil
	watchPool.Put(w)
}

// claim links the watched request whose tag is in p (the start of a request
// being written on c) to c.
func (u *upstreams) claim(c *idleConn, p []byte) {
	head := p[:min(len(p), 4096)]
	i := bytes.Index(head, watchTag)
	if i < 0 {
		return
	}
	var id uint64
	for _, b := range head[i+len(watchTag):] {
		if b < '0' || b > '9' {
			break
		}
		id = id*10 + uint64(b-'0')
	}
	u.watchMu.Lock()
	w := u.watched[id]
	u.watchMu.Unlock()
	if w == nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.done {
		return
	}
	w.conn = c
	if w.canceled || w.expired {
		_ = c.Close()
	}
}

// canPeek reports whether conn is a socket the watcher can peek at: TCP,
// or TLS over TCP where the platform can tell a FIN behind unread bytes.
func canPeek(conn net.Conn) bool {
	if _, ok := conn.(*tls.Conn); ok && !finBehindBytes {
		return false
	}
	_, ok := socketOf(conn).(*net.TCPConn)
	return ok && peekSupported
}

// socketOf is the socket under conn's TLS, if any, and under the send
// timeout's wrapper (sendtimeout.go): the watcher peeks at the socket,
// below the records.
func socketOf(conn net.Conn) net.Conn {
	if tc, ok := conn.(*tls.Conn); ok {
		conn = tc.NetConn()
	}
	return netConnOf(conn)
}

// ErrClientGone: the client closed its connection while its request waited
// in the router (the admission queue or the hold); it is never sent (499 in
// the access log, as clientGone).
var ErrClientGone = fmt.Errorf("%w: client closed the connection while waiting", context.Canceled)

// waitCtx is the context a request waits in the router with (the admission
// queue, the router-side hold): done when the server closes (the request's
// fasthttp context) or when the client closes its connection, found as the
// watcher above finds it (a MSG_PEEK on the idle client socket). Waiting is
// the slow path: the watcher goroutine starts at the first Done, so a
// request admitted at once (Err only) pays nothing, and stop ends it before
// the request goes on. It lives in the pooled call; the waits and stop run
// on the handler's goroutine, the watcher only sets gone and cancels.
type waitCtx struct {
	rc     *fasthttp.RequestCtx
	inner  context.Context // the server's life, canceled by the watcher; nil until Done
	cancel context.CancelFunc
	exited chan struct{} // closed when the watcher returns; nil: nothing watched
	gone   atomic.Bool
}

func (w *waitCtx) Deadline() (time.Time, bool) { return w.rc.Deadline() }
func (w *waitCtx) Value(key any) any           { return w.rc.Value(key) }

// Done starts the watcher (once until stop) and returns its channel.
func (w *waitCtx) Done() <-chan struct{} {
	if w.inner == nil {
		w.start()
	}
	return w.inner.Done()
}

// Err is ErrClientGone once the client left, else the server's verdict.
func (w *waitCtx) Err() error {
	if w.gone.Load() {
		return ErrClientGone
	}
	if w.inner == nil {
		return w.rc.Err()
	}
	return w.inner.Err()
}

func (w *waitCtx) start() {
	w.inner, w.cancel = context.WithCancel(w.rc)
	conn := w.rc.Conn()
	if conn == nil || !canPeek(conn) {
		return
	}
	// The read deadline fasthttp set for reading the request (ReadTimeout)
	// would end the watch early: a wait may be longer.
	_ = w.rc.SetReadDeadline(time.Time{})
	w.exited = make(chan struct{})
	go func(exited chan struct{}, cancel context.CancelFunc) { // owner: the waiting request; stop ends it
		defer close(exited)
		if peerClosed(conn) {
			w.gone.Store(true)
			cancel()
		}
	}(w.exited, w.cancel)
}

// stop ends the watcher, if any, and waits for it (as watch.stop does); Err
// keeps its verdict. A later Done starts a new one.
func (w *waitCtx) stop() {
	if w.inner == nil {
		return
	}
	if w.exited != nil {
		_ = w.rc.SetReadDeadline(time.Unix(1, 0))
		<-w.exited
		_ = w.rc.SetReadDeadline(time.Time{})
	}
	w.cancel()
	w.inner, w.cancel, w.exited = nil, nil, nil
}
