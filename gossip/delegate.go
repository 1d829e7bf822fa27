package gossip

import (
	"github.com/hashicorp/memberlist"
)

// delegate implements memberlist.Delegate and memberlist.EventDelegate for
// one Node.
//
// Concurrency contract (memberlist's): every method may be called from
// memberlist's goroutines concurrently with each other and with Node's
// methods, and must not block — each takes Node.mu briefly and never does I/O.
// Application callbacks run after Node.mu is released, on memberlist's
// goroutine, so they must not block either.
type delegate struct{ n *Node }

var (
	_ memberlist.Delegate         = delegate{}
	_ memberlist.EventDelegate    = delegate{}
	_ memberlist.ConflictDelegate = delegate{}
)

// NodeMeta returns this node's encoded metadata (validated to fit at start).
func (d delegate) NodeMeta(limit int) []byte {
	if len(d.n.metaBytes) > limit {
		return nil
	}
	return d.n.metaBytes
}

// NotifyMsg receives one broadcast entry.
func (d delegate) NotifyMsg(b []byte) {
	e, err := decodeEntry(b)
	if err != nil {
		d.n.m.malformed.Add(1)
		return
	}
	d.n.merge([]*entry{e})
}

// GetBroadcasts hands memberlist the queued entries that fit.
func (d delegate) GetBroadcasts(overhead, limit int) [][]byte {
	return d.n.queue.GetBroadcasts(overhead, limit)
}

// LocalState is the push/pull full state: every entry of an alive origin.
func (d delegate) LocalState(join bool) []byte {
	b, err := encodeState(d.n.snapshotEntries())
	if err != nil {
		return nil
	}
	return b
}

// MergeRemoteState merges a peer's full state.
func (d delegate) MergeRemoteState(buf []byte, join bool) {
	es, bad, err := decodeState(buf)
	if err != nil {
		d.n.m.malformed.Add(1)
		return
	}
	d.n.m.malformed.Add(uint64(bad))
	d.n.merge(es)
}

// NotifyJoin records a new alive member.
func (d delegate) NotifyJoin(node *memberlist.Node) { d.n.memberUp(node) }

// NotifyUpdate records changed metadata.
func (d delegate) NotifyUpdate(node *memberlist.Node) { d.n.memberUp(node) }

// NotifyLeave drops a member that left or was declared dead, with its state.
func (d delegate) NotifyLeave(node *memberlist.Node) { d.n.memberDown(node.Name) }

// NotifyConflict learns that other claims existing's name from another
// address (memberlist keeps existing and ignores other's claims).
func (d delegate) NotifyConflict(existing, other *memberlist.Node) { d.n.nameConflict(existing, other) }

// broadcast is one queued entry; a newer entry with the same key replaces it.
type broadcast struct {
	name string
	msg  []byte
}

var _ memberlist.NamedBroadcast = (*broadcast)(nil)

func (b *broadcast) Invalidates(other memberlist.Broadcast) bool {
	o, ok := other.(*broadcast)
	return ok && o.name == b.name
}
func (b *broadcast) Name() string    { return b.name }
func (b *broadcast) Message() []byte { return b.msg }
func (b *broadcast) Finished()       {}
