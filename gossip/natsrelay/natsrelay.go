// Package natsrelay is the state lane: gossip members' own changed entries
// over core NATS (no JetStream), beside gossip. A member publishes on
// Subjects.StateSubject(its gossip name) through a Publisher, set as its
// gossip.Config.Relay; ingresses subscribe to Subjects.StateWildcard() and
// merge what arrives with gossip.Node.MergeRelayed, under gossip's rules
// (newer versions of alive members only). Gossip stays the membership and
// the fallback: without NATS, or when a message is lost, push/pull and the
// periodic re-broadcast still converge.
//
// Every engine's entry reaches every ingress directly, once per change and
// at most once per broadcast interval: N sidecars cost each ingress N
// small messages per interval, where gossip's all-to-all spreading cost
// every member O(N) and never kept up past a few dozen members.
package natsrelay

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
)

// Publisher implements gossip.Relay over core NATS. Relay only records the
// newest message per key; Run publishes. Its queue is bounded by the
// member's own keys (its engines, its in-flight entry, a few app names):
// when a key's message is still unsent, the newer one replaces it.
//
// It also keeps the newest message of every key, sent or not: the lane
// carries an entry only when it changes, so one dropped while NATS was
// unreachable would otherwise stay missing from the lane until the entry
// next changed (an idle engine's, for good). After a failed publish, and
// after every reconnect, once NATS is connected again, Run publishes every
// key's newest once more; receivers ignore the ones they already hold
// (same version). A reconnect alone is reason enough: a publish into a
// connection nats.go does not know dead yet (a hung or partitioned server,
// up to its stale-connection limit) returns no error, and what was in the
// socket when it broke is gone.
type Publisher struct {
	// mu guards pending, last and subject; held only to put a message or
	// swap the map, never across a publish.
	mu      sync.Mutex
	pending map[string]outMsg
	last    map[string]outMsg // newest per key, sent or not
	member  string            // whose subject is subject
	subject string
	subj    natsutil.Subjects // the installation's (its NATS prefix)
	wake    chan struct{}     // capacity 1: pending has something
	refused chan error        // capacity 1: the server refused a publish on the lane (PermissionViolation)

	log        *slog.Logger
	published  atomic.Uint64
	failed     atomic.Uint64
	oversize   atomic.Uint64
	resent     atomic.Uint64
	publishing atomic.Bool // Run runs and the lane was not refused
}

// resendCheck is how often Run looks whether NATS reconnected, or is back
// after a failed publish.
var resendCheck = time.Second

var _ gossip.Relay = (*Publisher)(nil)

type outMsg struct {
	subject string
	data    []byte
}

// NewPublisher returns a publisher for gossip.Config.Relay; it publishes
// once Run runs. log (nil: slog.Default) gets the one error of a NATS user
// not allowed to publish on the lane. subj are the installation's subjects
// (natsutil.Conn.Subjects; zero: the default prefix).
func NewPublisher(subj natsutil.Subjects, log *slog.Logger) *Publisher {
	if log == nil {
		log = slog.Default()
	}
	return &Publisher{pending: map[string]outMsg{}, last: map[string]outMsg{}, wake: make(chan struct{}, 1), refused: make(chan error, 1), log: log, subj: subj}
}

// PermissionViolation tells the publisher of a permission violation the
// server reported on its connection (natsutil.Conn's
// OnPermissionViolation): when err is a refused publish on the lane, Run
// logs it and stops. It never blocks.
func (p *Publisher) PermissionViolation(err error) {
	if err == nil || !strings.Contains(err.Error(), "Publish to \""+p.subj.StatePrefix()) {
		return
	}
	select {
	case p.refused <- err:
	default: // one is pending already
	}
}

// Relay records msg as key's newest, to be published on
// the installation's StateSubject(member); it never blocks (gossip.Relay).
func (p *Publisher) Relay(member, key string, msg []byte) {
	p.mu.Lock()
	if member != p.member || p.subject == "" { // one member in practice: escaped once
		p.member, p.subject = member, p.subj.StateSubject(member)
	}
	p.pending[key] = outMsg{p.subject, msg}
	p.last[key] = outMsg{p.subject, msg}
	p.mu.Unlock()
	select {
	case p.wake <- struct{}{}:
	default: // a wake-up is pending already
	}
}

// Run publishes recorded messages on nc until ctx ends. Its owner is the
// caller, who runs it on one goroutine and stops it with ctx. While nc is
// not connected messages are dropped and counted, not buffered: the next
// change supersedes them, gossip carries the state meanwhile, and once nc
// is connected again (after a failed publish or any reconnect: nc's
// Reconnects, read here on each check) every key's newest message is
// published anew. A message larger than the server's max_payload is not
// handed to NATS (nats.go would refuse it with ErrMaxPayload, naming
// neither the entry nor the limit, and only count it as failed): it is
// counted as oversize and logged at error once per key until one of the
// key's messages fits again; gossip's push/pull still carries the entry.
// When the server refuses the lane's subject (a NATS user whose permissions
// predate it; NATS says so asynchronously, and the owner passes it on to
// PermissionViolation), Run logs that once and returns: each refused
// publish would log a NATS error, several a second.
func (p *Publisher) Run(ctx context.Context, nc *nats.Conn) {
	p.publishing.Store(true)
	defer p.publishing.Store(false)
	tick := time.NewTicker(resendCheck)
	defer tick.Stop()
	batch := map[string]outMsg{}
	lost := false // a publish failed, or nc reconnected, since every key was last sent
	// tooBig: keys logged as over max_payload (bounded by the member's own keys).
	tooBig := map[string]bool{}
	reconnects := nc.Stats().Reconnects
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
			if r := nc.Stats().Reconnects; r != reconnects {
				// What was published into the connection that broke
				// may be lost although no publish failed.
				reconnects, lost = r, true
			}
			if !lost || !nc.IsConnected() {
				continue
			}
			p.mu.Lock()
			maps.Copy(p.pending, p.last)
			p.mu.Unlock()
			p.resent.Add(1)
			lost = false
		case <-p.wake:
		case err := <-p.refused:
			p.log.Error("state lane off: the NATS user may not publish on "+p.subj.StateWildcard()+"; allow it (manifests/base/nats.yaml) and restart, or turn the lane off; gossip alone carries the state meanwhile", "err", err)
			return
		}
		p.mu.Lock()
		batch, p.pending = p.pending, batch
		p.mu.Unlock()
		maxPayload := nc.MaxPayload() // the server's, once connected: 0 before
		for k, msg := range batch {
			switch {
			case !nc.IsConnected():
				p.failed.Add(1)
				lost = true
			case maxPayload > 0 && int64(len(msg.data)) > maxPayload:
				p.tooLarge(tooBig, k, len(msg.data), maxPayload)
			default:
				if err := nc.Publish(msg.subject, msg.data); err != nil {
					p.failed.Add(1)
					lost = lost || !errors.Is(err, nats.ErrMaxPayload) // sent again, it would fail again
				} else {
					p.published.Add(1)
					delete(tooBig, k)
				}
			}
			delete(batch, k)
		}
	}
}

// tooLarge counts key's message of size bytes, over the server's
// maxPayload, and logs it once per key (logged, owned by Run's goroutine,
// holds the keys logged until one of their messages is published). The
// message stays the key's newest: a resend after a reconnect, to a server
// with a larger max_payload, publishes it.
func (p *Publisher) tooLarge(logged map[string]bool, key string, size int, maxPayload int64) {
	p.oversize.Add(1)
	if logged[key] {
		return
	}
	logged[key] = true
	p.log.Error("state lane: gossip entry larger than the NATS max_payload, not published on the lane; gossip's push/pull still carries it (seconds later); raise max_payload or make the entry smaller (fewer adapters); further ones of this key are counted in kvmesh_gossip_nats_oversize_total",
		"key", key, "bytes", size, "nats_max_payload", maxPayload)
}

// Register registers the publisher's counters on reg and returns a func
// that unregisters them.
func (p *Publisher) Register(reg prometheus.Registerer) (unregister func(), err error) {
	return register(reg,
		counter("kvmesh_gossip_nats_published_total", "Own gossip entries published on the NATS state lane (kvmesh.state.<member>).", p.published.Load),
		counter("kvmesh_gossip_nats_publish_failed_total", "Own gossip entries not published on the NATS state lane: NATS not connected or the publish failed (gossip still carries them; they are published again once NATS is back).", p.failed.Load),
		counter("kvmesh_gossip_nats_oversize_total", "Own gossip entries not published on the NATS state lane because they are larger than the server's max_payload (logged once per key; gossip's push/pull still carries them).", p.oversize.Load),
		counter("kvmesh_gossip_nats_republished_total", "Times every own entry was published on the NATS state lane again: after a reconnect to NATS, or once NATS was back after a failed publish.", p.resent.Load),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvmesh_gossip_nats_publishing", Help: "1 while this member publishes its entries on the NATS state lane; 0 before it starts, after it stops, or when the NATS user may not publish on kvmesh.state.> (logged once; gossip alone carries the state)."}, func() float64 {
			if p.publishing.Load() {
				return 1
			}
			return 0
		}),
	)
}

// Pending limits of the ingress's subscription: about a minute of 256
// sidecars at 4 Hz; beyond, NATS drops messages (counted) and gossip fills
// the gap.
const (
	pendingMsgs  = 64 << 10
	pendingBytes = 64 << 20
)

// Subscription feeds every member's relayed entries into a gossip node.
type Subscription struct {
	sub      *nats.Subscription
	dropped  atomic.Uint64 // last count NATS reported
	rejected atomic.Uint64 // subjects that name no member
}

// Subscribe subscribes node to subj.StateWildcard() on nc. Messages are
// handled on the subscription's NATS goroutine (owned by nc; ended by
// Unsubscribe or nc.Close), each merged by node.MergeRelayed; when more
// than the pending limits wait, NATS drops the newest and Dropped counts
// them. Malformed messages are counted by node (kvmesh_gossip_malformed_total)
// and logged at debug; entries versioned too far ahead of this clock are
// counted (kvmesh_gossip_relay_future_total) and warned about by node, once
// a minute per member (gossip.MaxRelayAhead).
func Subscribe(nc *nats.Conn, subj natsutil.Subjects, node *gossip.Node, log *slog.Logger) (*Subscription, error) {
	if log == nil {
		log = slog.Default()
	}
	s := &Subscription{}
	sub, err := nc.Subscribe(subj.StateWildcard(), func(m *nats.Msg) {
		member, ok := subj.ParseStateSubject(m.Subject)
		if !ok {
			s.rejected.Add(1)
			return
		}
		if _, err := node.MergeRelayed(member, m.Data); err != nil {
			log.Debug("state lane: message rejected", "subject", m.Subject, "err", err)
		}
	})
	if err != nil {
		return nil, fmt.Errorf("state lane subscribe: %w", err)
	}
	if err := sub.SetPendingLimits(pendingMsgs, pendingBytes); err != nil {
		_ = sub.Unsubscribe()
		return nil, fmt.Errorf("state lane pending limits: %w", err)
	}
	s.sub = sub
	return s, nil
}

// Dropped is how many messages NATS dropped for the subscription's
// pending limits (a slow consumer) so far.
func (s *Subscription) Dropped() uint64 {
	if d, err := s.sub.Dropped(); err == nil && d >= 0 {
		s.dropped.Store(uint64(d)) // kept: Dropped errors once unsubscribed
	}
	return s.dropped.Load()
}

// Rejected is how many messages arrived on a subject that names no member.
func (s *Subscription) Rejected() uint64 { return s.rejected.Load() }

// Unsubscribe ends the subscription. Safe to call twice.
func (s *Subscription) Unsubscribe() error {
	if err := s.sub.Unsubscribe(); err != nil && !errors.Is(err, nats.ErrBadSubscription) && !errors.Is(err, nats.ErrConnectionClosed) {
		return err
	}
	return nil
}

// Register registers the subscription's counters on reg and returns a
// func that unregisters them.
func (s *Subscription) Register(reg prometheus.Registerer) (unregister func(), err error) {
	return register(reg,
		counter("kvmesh_gossip_nats_dropped_total", "State lane messages NATS dropped because the ingress's subscription had too many pending (gossip fills the gap).", s.Dropped),
		counter("kvmesh_gossip_nats_rejected_total", "State lane messages on a subject naming no gossip member.", s.rejected.Load),
	)
}

func counter(name, help string, f func() uint64) prometheus.Collector {
	return prometheus.NewCounterFunc(prometheus.CounterOpts{Name: name, Help: help}, func() float64 { return float64(f()) })
}

func register(reg prometheus.Registerer, cs ...prometheus.Collector) (unregister func(), err error) {
	var done []prometheus.Collector
	unregister = func() {
		for _, c := range done {
			reg.Unregister(c)
		}
	}
	if reg == nil {
		return func() {}, nil
	}
	for _, c := range cs {
		if err := reg.Register(c); err != nil {
			unregister()
			return func() {}, err
		}
		done = append(done, c)
	}
	return unregister, nil
}
