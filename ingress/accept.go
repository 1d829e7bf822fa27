package ingress

import (
	"errors"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/backoff"
	"github.com/kvmesh/kvmesh/internal/monotime"
)

// fasthttp's Serve retries only accept errors whose Timeout() is true: any
// other, EMFILE included, is "permanent" and Serve returns, leaving the
// process up with a listener nobody accepts on. acceptListener wraps every
// listener the ingress serves (client and admin) so that an error the
// process recovers from by waiting (out of file descriptors, of kernel
// memory, a connection aborted before accept) is retried with net/http's
// backoff instead, counted and logged at most once per acceptLogEvery.
// What is still returned to Serve ends it, and Start's serve goroutine then
// reports the Server failed (Server.Failed, which Run exits on).

// acceptBackoff is net/http's accept retry wait, 5 ms doubling to 1 s; no
// jitter: one process's own loop, nothing to keep out of lock step.
var acceptBackoff = backoff.Backoff{Min: 5 * time.Millisecond, Max: time.Second}

const acceptLogEvery = 10 * time.Second

// acceptListener is a net.Listener whose Accept retries retryable errors.
// Accept is called from one goroutine at a time (Serve's loop); Close from
// any.
type acceptListener struct {
	net.Listener
	name    string                 // "client" or "admin": the metric's and log's listener
	errs    *prometheus.CounterVec // listener, errno
	log     *slog.Logger
	lastLog atomic.Int64 // monotime reading of the last warning (0: none yet)
	closed  chan struct{}
	once    sync.Once
}

func newAcceptListener(ln net.Listener, name string, errs *prometheus.CounterVec, log *slog.Logger) *acceptListener {
	// Every label exists from the start, at 0, so an alert on
	// rate(...{errno=~"EMFILE|ENFILE"}) fires on the first episode.
	for _, r := range retryableErrnos {
		errs.WithLabelValues(name, r.name)
	}
	errs.WithLabelValues(name, "timeout")
	return &acceptListener{Listener: ln, name: name, errs: errs, log: log, closed: make(chan struct{})}
}

// Accept returns the next connection, waiting out retryable errors (5 ms
// doubling to 1 s while they last); Close ends the wait with net.ErrClosed.
func (l *acceptListener) Accept() (net.Conn, error) {
	for n := 0; ; n++ {
		c, err := l.Listener.Accept()
		if err == nil {
			return c, nil
		}
		errno, ok := retryableAccept(err)
		if !ok {
			return nil, err
		}
		delay := acceptBackoff.Delay(n)
		l.errs.WithLabelValues(l.name, errno).Inc()
		if now, last := monotime.Now(), l.lastLog.Load(); last == 0 || now-last >= int64(acceptLogEvery) {
			l.lastLog.Store(now)
			l.log.Warn("accept failed; retrying (later failures within 10s are only counted: kvmesh_ingress_accept_errors_total)",
				"listener", l.name, "err", err, "retry_in", delay)
		}
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-l.closed:
			t.Stop()
			return nil, net.ErrClosed
		}
	}
}

// Close closes the listener and ends a wait in Accept; safe to call twice.
func (l *acceptListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return l.Listener.Close()
}

// retryableErrnos are the accept errors waited out, by their label.
var retryableErrnos = [...]struct {
	errno syscall.Errno
	name  string
}{
	{syscall.EMFILE, "EMFILE"}, {syscall.ENFILE, "ENFILE"}, {syscall.ENOBUFS, "ENOBUFS"}, {syscall.ENOMEM, "ENOMEM"},
	{syscall.ECONNABORTED, "ECONNABORTED"}, {syscall.ECONNRESET, "ECONNRESET"}, {syscall.EINTR, "EINTR"},
}

// retryableAccept reports whether an accept error is one the process
// recovers from by waiting, and its errno label (a fixed set: the metric's
// cardinality is bounded).
func retryableAccept(err error) (string, bool) {
	if errors.Is(err, net.ErrClosed) {
		return "", false
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		for _, r := range retryableErrnos {
			if r.errno == errno {
				return r.name, true
			}
		}
	}
	if ne, ok := errors.AsType[net.Error](err); ok && ne.Timeout() {
		return "timeout", true
	}
	return "", false
}
