package materialize

import (
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/internal/natsutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

// Index is where the materializer writes engine cache state; the scheduler's
// index implements it. Keys are kvmesh keys (global across models), engines
// are ids. The materializer calls Store only with keys not yet stored for that
// (engine, tier) and Remove only with stored keys, so the index needs no
// reference counts. Calls come from several goroutines but never concurrently
// for one engine (the materializer serializes them); they must not block for
// long and must not retain the keys slice after returning.
type Index interface {
	Store(engine string, tier kvevents.Tier, keys []uint64)
	Remove(engine string, tier kvevents.Tier, keys []uint64)
	ClearEngine(engine string)
}

// Membership is the gossip view: alive engines with their delta head and
// digest. *gossip.Node implements it. It must be safe for concurrent use and
// must not block.
type Membership interface {
	Engines() []gossip.EngineView
}

var _ Membership = (*gossip.Node)(nil)

// Config configures a Materializer. Start from DefaultConfig.
type Config struct {
	// Conn is the NATS connection (required). The materializer does not close it.
	Conn *nats.Conn
	// Subjects are the installation's subjects and stream (the
	// connection's natsutil.Conn.Subjects). Zero: natsutil.Default().
	Subjects natsutil.Subjects
	// Index receives the engines' key sets (required).
	Index Index
	// Membership, when set, is used to discover idle engines, to check digests
	// and to clear engines whose sidecar is gone. Nil: deltas and the stream only.
	Membership Membership
	// SnapshotTimeout bounds one snapshot request (all chunks). Default 5s.
	SnapshotTimeout time.Duration
	// FirstReplyTimeout bounds the wait for a snapshot's first chunk in the
	// ReconnectWindow after this replica's NATS connection came back; then
	// the request is given up and retried. A server resumed after a hang
	// hands a request to the subscriptions it had, among them a sidecar's
	// on a connection the sidecar has found dead and is redialing: nobody
	// answers, and before, the copy waited out SnapshotTimeout before its
	// retry reached the sidecar's new subscription (6–7 s after the
	// server's SIGCONT in the fault tester's runs). Default 1s; 0: off.
	FirstReplyTimeout time.Duration
	// MaxConcurrentSnapshots bounds parallel snapshot requests. Default 4.
	MaxConcurrentSnapshots int
	// MaxBuffered bounds the deltas buffered per engine while its snapshot is in
	// flight. When full, the buffer is dropped and another snapshot follows: a
	// snapshot is always correct, a buffer only saves work. Default 4096.
	MaxBuffered int
	// MaxBufferedBytes bounds the memory of every engine's buffer together
	// (estimated: 8 bytes a key plus the deltas' and ops' headers). After a
	// NATS reconnect every engine snapshots at once and buffers what arrives
	// meanwhile; past the budget the largest buffers are dropped, as a full
	// one is. Default 64 MiB.
	MaxBufferedBytes int
	// MaxUnlisted bounds, when Membership is set, the engines known from
	// deltas or stream subjects alone, not (yet) listed by gossip: a live
	// engine's sidecar is in gossip within seconds, and every id on the
	// delta subjects must not become a record (a misbehaving or
	// compromised publisher). Past it, deltas of further unlisted engines
	// are dropped and counted (kvmesh_materializer_unlisted_dropped_total);
	// gossip discovers a live one anyway. Default 4096.
	MaxUnlisted int
	// CheckInterval is the period of the housekeeping loop (connection check,
	// gossip digest compare, discovery, retries). Default 250ms.
	CheckInterval time.Duration
	// GoneAfter: an engine that gossip stops listing is cleared after this long.
	// Default 1s (gossip's own failure detection already took seconds).
	GoneAfter time.Duration
	// DigestGrace: a digest mismatch at the same head must persist this long
	// before a resync (the two sides may sample between a delta and its gossip).
	// Default 1s.
	DigestGrace time.Duration
	// EpochGrace: deltas of an engine's older sidecar epoch (a sidecar
	// restart overlapping itself, epoch.go) are ignored while the newer one
	// is live; when they keep coming this long while the newer one sends
	// nothing, or when one of them brought a change to the engine's cache
	// that the newer one has not published this long after (an engine
	// gone idle), its sidecar is taken to be gone and the older one is
	// followed again (seen by the first CheckInterval pass after). Default 2s.
	EpochGrace time.Duration
	// AheadGrace: with Membership, a copy ahead of gossip's head in the same
	// epoch (a delta applied that the sidecar never published: a forged or
	// buggy publisher on the engine's subject, or the sidecar's gossip
	// lagging) is re-snapshotted once gossip has stayed behind it this long
	// while no delta came (kvmesh_materializer_ahead_of_gossip_total), once
	// per head. A delta normally reaches NATS before its head reaches
	// gossip, by up to a gossip interval and a broadcast or two: the grace
	// outlasts that. Default 10s.
	AheadGrace time.Duration
	// OutsideGossipAfter: with Membership, an engine whose deltas keep
	// arriving on NATS while gossip does not list it, for this long, counts
	// in kvmesh_materializer_engines_outside_gossip and is warned about
	// (once a minute): a gossip partition, or a sidecar cut off from gossip,
	// whose engines this ingress follows but does not route to. An engine
	// joining (deltas before its sidecar's gossip reaches this member) or
	// leaving stays out of it; one counts until its last such delta is ten
	// times this old. Default 30s.
	OutsideGossipAfter time.Duration
	// IdleCheck: without Membership, an engine with no delta for this long is
	// re-snapshotted, so an engine whose sidecar vanished is cleared (no
	// responders) instead of being routed to forever. Default 30s; gossip
	// makes it unnecessary and it is not used with Membership.
	IdleCheck time.Duration
	// Logger; default slog.Default().
	Logger *slog.Logger
	// Registerer for kvmesh_materializer_* metrics; nil: not registered.
	Registerer prometheus.Registerer
}

// DefaultConfig returns the defaults documented on each field.
func DefaultConfig() Config {
	return Config{
		SnapshotTimeout:        5 * time.Second,
		FirstReplyTimeout:      time.Second,
		MaxConcurrentSnapshots: 4,
		MaxBuffered:            4096,
		MaxBufferedBytes:       64 << 20,
		MaxUnlisted:            4096,
		CheckInterval:          250 * time.Millisecond,
		GoneAfter:              time.Second,
		DigestGrace:            time.Second,
		EpochGrace:             2 * time.Second,
		AheadGrace:             10 * time.Second,
		OutsideGossipAfter:     30 * time.Second,
		IdleCheck:              30 * time.Second,
	}
}

// ErrConfig is wrapped by every configuration error.
var ErrConfig = errors.New("invalid materializer config")

// Validate lists every problem of c at once.
func (c *Config) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrConfig}, args...)...))
	}
	if c.Conn == nil {
		add("no NATS connection")
	}
	if c.Index == nil {
		add("no index")
	}
	if c.FirstReplyTimeout < 0 {
		add("first reply timeout %v must be >= 0 (0: off)", c.FirstReplyTimeout)
	}
	if c.SnapshotTimeout <= 0 {
		add("snapshot timeout %v must be positive", c.SnapshotTimeout)
	}
	if c.MaxConcurrentSnapshots <= 0 {
		add("max concurrent snapshots %d must be positive", c.MaxConcurrentSnapshots)
	}
	if c.MaxBuffered <= 0 {
		add("max buffered %d must be positive", c.MaxBuffered)
	}
	if c.MaxBufferedBytes <= 0 {
		add("max buffered bytes %d must be positive", c.MaxBufferedBytes)
	}
	if c.MaxUnlisted <= 0 {
		add("max unlisted %d must be positive", c.MaxUnlisted)
	}
	if c.CheckInterval <= 0 {
		add("check interval %v must be positive", c.CheckInterval)
	}
	if c.IdleCheck <= 0 {
		add("idle check %v must be positive", c.IdleCheck)
	}
	if c.AheadGrace <= 0 || c.OutsideGossipAfter <= 0 {
		add("ahead grace %v and outside-gossip-after %v must be positive", c.AheadGrace, c.OutsideGossipAfter)
	}
	if c.GoneAfter < 0 || c.DigestGrace < 0 || c.EpochGrace < 0 {
		add("gone-after %v, digest grace %v and epoch grace %v must not be negative", c.GoneAfter, c.DigestGrace, c.EpochGrace)
	}
	return errors.Join(errs...)
}
