package kvevents

import (
	"time"

	zmq "github.com/pebbe/zmq4"
)

// histSize is how many recent (seq, payload hash) pairs a rank remembers.
// It lets the subscriber tell a live duplicate of a batch it already
// delivered through replay (same seq, same payload) from an engine restart
// (seq went back, different payload), and verify replay overlaps.
const histSize = 1024

// rankState is the socket loop's view of one DP rank. Only the socket loop
// touches it.
type rankState struct {
	rank     int
	sub      *zmq.Socket
	dealer   *zmq.Socket // nil when the rank has no replay endpoint
	dpoller  *zmq.Poller
	replayEP string

	last    uint64 // last delivered (or written off) seq; valid when has
	has     bool
	hist    [histSize]histEntry // direct-mapped by seq % histSize
	lastMsg time.Time           // last live message or probe, for idle probes
	// started: a batch of the rank was seen (live or replayed), ever; kept
	// by forget, so that with LiveStart only the very first sight skips
	// the replay from 0, not an engine's new incarnation.
	started bool
	// replayFails counts replay exchanges failed in a row (timed out or
	// cut off): idle probes back off while the replay socket is down.
	replayFails int
	// lateNext is the seq the next late live copy would have, after
	// isLateCopy confirmed one (lateOK): a run of them costs one exchange.
	lateNext uint64
	lateOK   bool
}

type histEntry struct {
	seq, sum uint64
	ok       bool
}

func (rs *rankState) remember(seq, sum uint64) {
	rs.hist[seq%histSize] = histEntry{seq: seq, sum: sum, ok: true}
}

// sumOf returns the payload hash delivered at seq, if still remembered.
func (rs *rankState) sumOf(seq uint64) (uint64, bool) {
	e := rs.hist[seq%histSize]
	return e.sum, e.ok && e.seq == seq
}

// forget drops everything known about the rank (engine restarted).
func (rs *rankState) forget() {
	rs.last, rs.has = 0, false
	rs.lateNext, rs.lateOK = 0, false
	clear(rs.hist[:])
}
