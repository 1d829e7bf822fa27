package sidecar

import (
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// publishErrLogEvery spaces the warnings about failed delta publishes.
const publishErrLogEvery = 10 * time.Second

// publishRecoverQuiet is how long publishes must succeed with no failure
// before an incident is over. JetStream reports a publish's failure when
// its ack times out (natsutil's 5 s), so failures of deltas sent during an
// outage still arrive for that long after new ones are acked again.
const publishRecoverQuiet = 5 * time.Second

// pubIncident follows failed delta publishes as incidents, so the log says
// when one starts, how it goes and when it ends: the first failure warns at
// once; later ones are counted and warned at most once per
// publishErrLogEvery; the first success publishRecoverQuiet after the last
// failure ends the incident with one line (its failures and how long they
// went on), and the next failure starts a new count. Intervals are measured
// with time.Time.Sub on readings from now, which keep the monotonic clock:
// a wall clock stepped back must not hold the warnings for the size of the
// step. Safe for concurrent use: failures come from the publish loop and
// NATS's ack goroutine.
type pubIncident struct {
	log *slog.Logger
	now func() time.Time // time.Now; tests step it

	// open is read on every success (every ack), without the lock.
	open atomic.Bool

	mu       sync.Mutex // guards the rest
	start    time.Time  // when the incident's first failed publish was sent
	lastFail time.Time
	lastWarn time.Time
	failed   uint64 // in the incident
	unwarned uint64 // since the last warning
}

// failed records a failed publish of engine's delta.
func (p *pubIncident) fail(engine string, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	// A publish whose ack timed out was sent PublishAckTimeout before its
	// failure is known: the incident began then, not now (a 9 s NATS
	// outage otherwise read as failing for a fraction of a second, the
	// timeouts of its publishes arriving close together).
	sent := now
	if errors.Is(err, jetstream.ErrAsyncPublishTimeout) {
		sent = now.Add(-natsutil.PublishAckTimeout)
	}
	if !p.open.Load() {
		p.open.Store(true)
		p.start, p.failed, p.unwarned, p.lastWarn = sent, 0, 0, time.Time{}
	}
	p.lastFail = now
	p.failed++
	p.unwarned++
	if !p.lastWarn.IsZero() && now.Sub(p.lastWarn) < publishErrLogEvery {
		return
	}
	p.log.Warn("delta publishes failing", "failed", p.unwarned, "failed_in_incident", p.failed,
		"failing_for", now.Sub(p.start).Round(time.Millisecond), "engine", engine, "err", err,
		"next_warning_in", publishErrLogEvery)
	p.lastWarn, p.unwarned = now, 0
}

// ok records a publish that succeeded (acked by the stream, or sent when
// the stream is disabled); it ends an open incident once failures have
// stopped for publishRecoverQuiet.
func (p *pubIncident) ok() {
	if !p.open.Load() {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.now()
	if !p.open.Load() || now.Sub(p.lastFail) < publishRecoverQuiet {
		return
	}
	p.open.Store(false)
	p.log.Info("delta publishes succeeding again", "failed_in_incident", p.failed,
		"failing_for", p.lastFail.Sub(p.start).Round(time.Millisecond), "unwarned", p.unwarned)
}
