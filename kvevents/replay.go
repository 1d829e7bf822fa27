package kvevents

import (
	"encoding/binary"
	"math"
	"time"

	zmq "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"
)

// noLive is recover's live bound for replays not triggered by a live
// message (on start, idle probes): every replayed batch is delivered, and
// live duplicates that follow are recognised by their payload hash.
const noLive = math.MaxUint64

// endSeq is the seq of vLLM's replay end marker (ff×8, i.e. -1): it never
// numbers a batch, live or replayed.
const endSeq = math.MaxUint64

// recover fills rank rs's hole [from, live) through its replay socket and
// delivers what it gets, in order. Batches at or after live are ignored
// here: they arrive (or arrived) on the live socket. Whatever cannot be
// replayed (the engine's buffer no longer reaches back, the engine has no
// replay socket, or it does not answer in time) is reported as lost history.
//
// When the rank's last delivered batch is remembered (from == last+1), the
// request starts one batch earlier, at last, and compares that batch with
// what was delivered: a different payload means the engine restarted and
// its new sequence has already passed the old one, which a sequence check
// alone cannot see. For a probe (live == noLive) an empty reply means the
// same: the engine no longer has seq last nor anything newer. Then the rank
// is reset and replayed from 0.
func (s *Subscriber) recover(rs *rankState, from, live uint64) error {
	probe := live == noLive
	if rs.dealer == nil {
		if probe {
			return nil
		}
		return s.lostHistory(rs, from, live)
	}
	lastSum, verify := uint64(0), false
	if rs.has && from > 0 && from == rs.last+1 {
		lastSum, verify = rs.sumOf(rs.last)
	}
	start := from
	if verify {
		start = from - 1
	}
	s.st.replays.Add(1)
	var startb [8]byte
	binary.BigEndian.PutUint64(startb[:], start)
	if _, err := rs.dealer.SendMessage("", startb[:]); err != nil {
		s.cfg.Logger.Warn("kv events replay request", "rank", rs.rank, "err", err)
		if probe {
			return nil
		}
		return s.lostHistory(rs, from, live)
	}
	x := replayExchange{next: from, verify: verify, lastSum: lastSum}
	if err := s.readReplay(rs, live, &x); err != nil {
		return err
	}
	if probe && verify && x.replies == 0 && !x.timedOut {
		x.restarted = true
	}
	if x.restarted {
		if err := s.reset(rs, 0, "replay shows a different history"); err != nil {
			return err
		}
		return s.recover(rs, 0, live)
	}
	if !probe && x.next < live {
		return s.lostHistory(rs, x.next, live)
	}
	return nil
}

// replayExchange is the state of one replay request's replies.
type replayExchange struct {
	next                uint64 // the next sequence to deliver
	verify              bool   // the first reply is the last delivered batch, to compare
	lastSum             uint64 // its checksum
	replies             int
	prev                uint64 // the last reply's seq: replies must increase
	restarted, timedOut bool
}

// readReplay reads the replies to one replay request up to the end marker
// (or a timeout), delivering the batches in [x.next, live) in order and
// reporting a hole as lost history.
func (s *Subscriber) readReplay(rs *rankState, live uint64, x *replayExchange) error {
	from := x.next
	deadline := time.Now().Add(s.cfg.ReplayTimeout)
	for {
		frames, ok, err := s.recvReplay(rs, deadline)
		if err != nil {
			return err
		}
		if !ok {
			// Timed out: replies that arrive later would be mistaken for the
			// next exchange's, so start over with a fresh socket.
			s.st.replayFailures.Add(1)
			s.cfg.Logger.Warn("kv events replay timed out", "rank", rs.rank, "endpoint", rs.replayEP)
			s.resetDealer(rs)
			x.timedOut = true
			rs.replayFails++
			return nil
		}
		seq, payload, end, valid := parseReplay(frames)
		if valid && !end && x.replies > 0 && seq <= x.prev {
			valid = false // an engine replays its buffer in order, once
		}
		if !valid {
			// Not progress: a server repeating garbage or old batches
			// forever must not hold the socket loop past the timeout.
			s.st.malformed.Add(1)
			continue
		}
		if end {
			// The end test is an empty last frame, so a batch with an empty
			// payload ends the exchange early, and the rest of the engine's
			// replies would wait in this socket's queue to be read as the
			// next exchange's (after an engine restart: the dead engine's
			// blocks, restored). Each exchange gets a fresh socket: replies
			// to an old one are dropped with it.
			s.resetDealer(rs)
			rs.replayFails = 0
			return nil
		}
		if x.replies >= s.cfg.MaxReplayBatches {
			// More batches than any engine buffers: end the exchange as if
			// it had timed out (a fresh socket drops what else comes).
			s.st.replayFailures.Add(1)
			s.cfg.Logger.Warn("kv events replay too long", "rank", rs.rank, "endpoint", rs.replayEP, "batches", x.replies)
			s.resetDealer(rs)
			x.timedOut = true
			rs.replayFails++
			return nil
		}
		// The timeout bounds silence, not the whole exchange: a long replay
		// to a slow consumer is progress.
		deadline = time.Now().Add(s.cfg.ReplayTimeout)
		x.replies++
		x.prev = seq
		if x.verify && x.replies == 1 && seq == from-1 && xxh3.Hash(payload) != x.lastSum {
			x.restarted = true // read on to the end marker, then start over
		}
		if x.restarted || seq < x.next || seq >= live {
			continue
		}
		if seq > x.next { // the buffer no longer reaches back (or has a hole)
			if err := s.lostHistory(rs, x.next, seq); err != nil {
				return err
			}
		}
		if err := s.deliver(rs, seq, payload, true); err != nil {
			return err
		}
		x.next = seq + 1
	}
}

// recvReplay waits for one replay reply until deadline, checking for Close
// every PollInterval. ok is false on timeout.
func (s *Subscriber) recvReplay(rs *rankState, deadline time.Time) (frames [][]byte, ok bool, err error) {
	for {
		select {
		case <-s.quit:
			return nil, false, errStopped
		default:
		}
		wait := time.Until(deadline)
		if wait <= 0 {
			return nil, false, nil
		}
		polled, err := rs.dpoller.Poll(min(wait, s.cfg.PollInterval))
		if err != nil {
			return nil, false, nil
		}
		if len(polled) == 0 {
			continue
		}
		frames, err := rs.dealer.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		return frames, true, nil
	}
}

// parseReplay reads one reply in either layout: ["", seq, payload] (old
// vLLM, SGLang) or ["", topic, seq, payload] (vLLM after PR #45177). The
// end marker is recognised by its empty last frame.
func parseReplay(frames [][]byte) (seq uint64, payload []byte, end, valid bool) {
	if len(frames) < 3 || len(frames[0]) != 0 {
		return 0, nil, false, false
	}
	last := frames[len(frames)-1]
	seqFrame := frames[len(frames)-2]
	if len(last) == 0 {
		// The robust end test (spec §1); the ff×8 seq is not required.
		return 0, nil, true, true
	}
	if len(frames) > 4 || len(seqFrame) != 8 {
		return 0, nil, false, false
	}
	seq = binary.BigEndian.Uint64(seqFrame)
	if seq == endSeq {
		return 0, nil, false, false // the end marker's seq never numbers a batch
	}
	return seq, last, false, true
}

func (s *Subscriber) resetDealer(rs *rankState) {
	_ = rs.dealer.Close()
	rs.dealer, rs.dpoller = nil, nil
	if err := s.openDealer(rs); err != nil {
		s.cfg.Logger.Error("kv events replay socket", "rank", rs.rank, "err", err)
	}
}
