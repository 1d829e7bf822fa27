package gossip

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Relay carries this member's own entries over a second transport beside
// gossip, to the members that read them for routing (kvmesh's is core NATS,
// gossip/natsrelay). Gossip stays the membership and the fallback: a
// relayed entry is merged by its receivers exactly as a broadcast is
// (Node.MergeRelayed), so whichever copy arrives first wins and the other
// is an ignored duplicate.
type Relay interface {
	// Relay is handed one own entry, encoded as a gossip broadcast, when
	// the member queues it for broadcast and its content changed since
	// it was last relayed: at most once per BroadcastInterval per key,
	// never for an entry set again unchanged nor for the periodic
	// re-broadcast, and also when the entry is too large for a broadcast
	// packet (push/pull is then gossip's only way).
	// member is this member's name (Node.Name; the entries' origin). key
	// names the entry among the member's own and is stable across
	// versions: a newer msg under a key supersedes an unsent older one.
	//
	// It is called from the Node's broadcast loop goroutine, one call at
	// a time, with no Node lock held. It must not block or do I/O there
	// (that loop also feeds gossip): hand msg to a bounded queue of its
	// own. msg is the callee's to keep; the Node never reuses it.
	Relay(member, key string, msg []byte)
}

// MaxRelayAhead bounds how far ahead of the receiver's clock a relayed
// entry's version (its origin's wall clock in ns) may be: room for clock
// skew between hosts, while a forged far-future version, which would make
// the origin's real entries look older until it left the mesh, is refused.
// Gossip itself has no such bound: what arrives by gossip was sent by a
// holder of the gossip key, a member; the relay's transport is trusted
// apart (publish rights on the NATS subject), so the bound guards what
// that trust adds. A member whose clock is that far ahead of the receiver's
// is refused on the lane only, and its entries still arrive by gossip.
const MaxRelayAhead = 5 * time.Minute

// ErrRelayAhead is wrapped by MergeRelayed's error for an entry versioned
// more than MaxRelayAhead ahead of this clock.
var ErrRelayAhead = errors.New("relayed entry versioned too far ahead of this clock")

// aheadWarnEvery spaces the warnings about one origin's clock, and
// aheadWarnMax bounds how many origins they remember. Only alive members
// get a line of their own: the origins a NATS publisher names are not
// checked against the membership before this refusal, and one forging a
// fresh name per message must not turn each into a warning (it drew up to
// aheadWarnMax lines a minute); all other origins share one line.
const (
	aheadWarnEvery = time.Minute
	aheadWarnMax   = 1024
)

// MergeRelayed merges one entry that a Relay carried from member from (the
// sender the transport names, e.g. by subject; "" when it names none)
// exactly as a gossip broadcast is merged: the same decoding and checks,
// newer versions of alive origins only, own entries never overwritten.
// Input that fails to decode, or whose origin is not from, is counted in
// kvmesh_gossip_malformed_total and returned as an error. An entry whose
// version is more than MaxRelayAhead past this clock (clock skew, or a
// forged version) is counted in kvmesh_gossip_relay_future_total, warned
// about once a minute per alive member with the measured skew (other
// origins, forged names included, share one line a minute), and returned as an
// error wrapping ErrRelayAhead. The lane never introduces or changes an
// engine's address (routing.go): an entry whose URL or bootstrap address is
// not the member's metadata's nor what gossip delivered is refused, counted
// in kvmesh_gossip_engine_url_mismatch_total and warned about once a minute
// per member (or, one gossip has not delivered yet, ignored); accepted is
// then false and err nil. accepted is false for an entry ignored as
// older, own, of a member not alive or of a generation other than the one
// its member advertises (one not advertised yet is held, and comes into
// the view when it is: generation.go). Safe for concurrent use; it never
// waits on I/O. OnAppState callbacks run on the caller's goroutine, as they
// run on memberlist's for a broadcast.
func (n *Node) MergeRelayed(from string, msg []byte) (accepted bool, err error) {
	e, err := decodeEntry(msg)
	if err == nil && from != "" && e.Origin != from {
		err = fmt.Errorf("%w: entry of %q relayed as %q's", errMalformed, e.Origin, from)
	}
	if err != nil {
		n.m.malformed.Add(1)
		return false, fmt.Errorf("gossip relay: %w", err)
	}
	now := time.Now()
	if ahead := time.Duration(e.Version - now.UnixNano()); e.Version > now.Add(MaxRelayAhead).UnixNano() {
		// Versions are the origin's clock: one far ahead would freeze the
		// member's state (every real entry older) until it leaves.
		n.m.future.Add(1)
		n.warnAhead(e.Origin, ahead, now)
		return false, fmt.Errorf("gossip relay: %w: entry of %q versioned %v ahead (at most %v)", ErrRelayAhead, e.Origin,
			ahead.Round(time.Second), MaxRelayAhead)
	}
	e.relayed = true // the lane may not introduce or change an engine's address (routing.go)
	if n.merge([]*entry{e}) == 0 {
		return false, nil
	}
	n.m.relayed.Add(1)
	return true, nil
}

// warnAhead logs, at most once a minute per alive member, that origin's
// relayed entries are refused as too far ahead. Origins that are no alive
// member (forged, or gone) share one line a minute, which names the latest
// and how many refusals went unlogged since the last; every refusal is
// counted in kvmesh_gossip_relay_future_total all the same. Before, they
// were counted as malformed and logged at debug: a receiver whose clock was
// minutes behind refused every member's entries with no word.
func (n *Node) warnAhead(origin string, ahead time.Duration, now time.Time) {
	n.mu.Lock()
	_, member := n.alive[origin]
	n.mu.Unlock()
	key := origin
	if !member {
		key = aheadOthers
	}
	due, suppressed := n.ahead.due(key, now)
	if !due {
		return
	}
	attrs := []any{"origin", origin, "ahead", ahead.Round(time.Second), "max_ahead", MaxRelayAhead}
	if !member {
		attrs = append(attrs, "member", false)
	}
	if suppressed > 0 {
		attrs = append(attrs, "suppressed", suppressed, "per", aheadWarnEvery)
	}
	n.log.Warn("state lane: refusing a member's entries versioned too far ahead of this clock (clock skew between the hosts; gossip still carries them, seconds later); fix the clocks (NTP). After a clock is stepped back its member's versions stay ahead until real time catches up",
		attrs...)
}

// aheadOthers is the key of aheadWarnings' shared line: every origin that
// is no alive member, and members past aheadWarnMax. No member name is
// empty.
const aheadOthers = ""

// aheadWarnings holds when each origin was last warned about by warnAhead,
// and how many of its refusals were not logged since.
type aheadWarnings struct {
	mu   sync.Mutex
	last map[string]aheadWarned
}

type aheadWarned struct {
	at         time.Time
	suppressed int
}

// due reports whether a warning about key is due at now and, if so,
// records it and returns how many were suppressed since the last one. At
// most aheadWarnMax keys are remembered: when the map is full the quiet
// ones are forgotten, and while it stays full a new key shares aheadOthers.
func (a *aheadWarnings) due(key string, now time.Time) (due bool, suppressed int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.last == nil {
		a.last = map[string]aheadWarned{}
	}
	w, ok := a.last[key]
	if !ok && len(a.last) >= aheadWarnMax {
		for k, old := range a.last {
			if old.suppressed == 0 && now.Sub(old.at) >= aheadWarnEvery {
				delete(a.last, k)
			}
		}
		if len(a.last) >= aheadWarnMax {
			key = aheadOthers
			w, ok = a.last[key]
		}
	}
	if ok && now.Sub(w.at) < aheadWarnEvery && !now.Before(w.at) {
		w.suppressed++
		a.last[key] = w
		return false, 0
	}
	a.last[key] = aheadWarned{at: now}
	return true, w.suppressed
}
