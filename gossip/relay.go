package gossip

import (
	"fmt"
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
const MaxRelayAhead = 5 * time.Minute

// MergeRelayed merges one entry that a Relay carried from member from (the
// sender the transport names, e.g. by subject; "" when it names none)
// exactly as a gossip broadcast is merged: the same decoding and checks,
// newer versions of alive origins only, own entries never overwritten.
// Input that fails to decode, whose origin is not from, or whose version is
// more than MaxRelayAhead past this clock, is counted in
// kvmesh_gossip_malformed_total and returned as an error; accepted is false
// for an entry ignored as older, own or of a member not alive. Safe for
// concurrent use; it never waits on I/O. OnAppState callbacks run on the
// caller's goroutine, as they run on memberlist's for a broadcast.
func (n *Node) MergeRelayed(from string, msg []byte) (accepted bool, err error) {
	e, err := decodeEntry(msg)
	if err == nil && from != "" && e.Origin != from {
		err = fmt.Errorf("%w: entry of %q relayed as %q's", errMalformed, e.Origin, from)
	}
	if err == nil && e.Version > time.Now().Add(MaxRelayAhead).UnixNano() {
		// Versions are the origin's clock: one far ahead would freeze the
		// member's state (every real entry older) until it leaves.
		err = fmt.Errorf("%w: entry of %q versioned %v ahead of this clock", errMalformed, e.Origin,
			time.Until(time.Unix(0, e.Version)).Round(time.Second))
	}
	if err != nil {
		n.m.malformed.Add(1)
		return false, fmt.Errorf("gossip relay: %w", err)
	}
	if n.merge([]*entry{e}) == 0 {
		return false, nil
	}
	n.m.relayed.Add(1)
	return true, nil
}
