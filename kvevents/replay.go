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
//
// A reply that skips a range after the replay has started in sequence is a
// hole in transit, not the buffer's edge: the engine's buffer is contiguous,
// but its ROUTER drops replies past its send high-water mark (ZMQ's default
// 1,000, vLLM's) without a word. The batches after the hole are not
// delivered; the engine is asked again from the first missing seq, up to
// replayHoleRetries times, and only then is the hole lost history.
func (s *Subscriber) recover(rs *rankState, from, live uint64) error {
	return s.replay(rs, from, live, replayHoleRetries)
}

// replayHoleRetries bounds the replay requests recover sends again from a
// hole in a replay's middle (see recover).
const replayHoleRetries = 3

// replay is recover's exchange, asking again from a hole in its middle at
// most retries more times.
func (s *Subscriber) replay(rs *rankState, from, live uint64, retries int) error {
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
	x := replayExchange{next: from, verify: verify, lastSum: lastSum, retryHoles: retries > 0}
	if err := s.readReplay(rs, live, &x); err != nil {
		return err
	}
	if x.hole && !x.restarted && !x.timedOut {
		s.cfg.Logger.Info("kv events replay skipped batches the engine holds: asking again", "rank", rs.rank,
			"endpoint", rs.replayEP, "from", x.next, "got", x.holeEnd)
		return s.replay(rs, x.next, live, retries-1)
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
	// retryHoles: a hole in the replay's middle ends delivery (hole, from
	// x.next to holeEnd) so recover asks again, instead of being lost history.
	// inSeq: a reply showed where the buffer starts (the overlap batch,
	// or one delivered), so a skip after it is a hole, not the edge.
	retryHoles, inSeq, hole bool
	holeEnd                 uint64
}

// readReplay reads the replies to one replay request up to the end marker
// (or a timeout), delivering the batches in [x.next, live) in order. The
// buffer's edge (the first reply past x.next) is reported as lost history;
// so is a hole after it unless x.retryHoles, which stops delivery there and
// sets x.hole instead (recover asks again).
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
		if x.restarted || x.hole {
			continue
		}
		if seq < x.next {
			x.inSeq = true // the overlap batch (verify)
			continue
		}
		if x.retryHoles && x.inSeq && seq > x.next && x.next < live {
			// The replay began in sequence, so the engine holds x.next:
			// its ROUTER dropped it in transit. Read on to the end
			// marker, then ask again from x.next.
			x.hole, x.holeEnd = true, min(seq, live)
			continue
		}
		if seq >= live {
			continue
		}
		if seq > x.next { // the buffer no longer reaches back (or, asked again enough, has a hole)
			if err := s.lostHistory(rs, x.next, seq); err != nil {
				return err
			}
		}
		if err := s.deliver(rs, seq, payload, true); err != nil {
			return err
		}
		x.next, x.inSeq = seq+1, true
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
