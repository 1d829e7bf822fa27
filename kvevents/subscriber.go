package kvevents

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"

	zmq "github.com/pebbe/zmq4"
	"github.com/zeebo/xxh3"
)

// CheckBindEndpoint says whether a socket can bind endpoint. libzmq binds
// a tcp:// host that is an IP address, "*" or a network interface's name;
// a host name it takes for an interface it does not find and fails, on
// every retry, with "no such device". The error says so at start instead.
// (A connect endpoint may name a host: libzmq then dials the first address
// the name resolves to, and only that one, until the socket is remade.)
func CheckBindEndpoint(endpoint string) error {
	host, _, ok := zmqep.SplitTCP(endpoint)
	if !ok {
		return nil // ipc://, inproc://: OffsetEndpoint checks the form
	}
	bare := strings.TrimSuffix(strings.TrimPrefix(host, "["), "]")
	if bare == "*" || net.ParseIP(bare) != nil {
		return nil
	}
	if _, err := net.InterfaceByName(bare); err == nil {
		return nil
	}
	return fmt.Errorf("%w: bind %q: %q is not an IP address, * or a network interface here; ZMQ binds addresses, not host names", ErrConfig, endpoint, host)
}

// MessageKind says what a subscriber Message carries.
type MessageKind uint8

const (
	// MsgBatch: a decoded batch, next in this rank's sequence.
	MsgBatch MessageKind = iota + 1
	// MsgReset: the rank's engine restarted (its sequence went backwards).
	// Drop everything known about this rank; batches of the new incarnation
	// follow, starting at Seq.
	MsgReset
	// MsgLostHistory: batches From..To-1 of this rank are gone for good (not
	// replayable, or undecodable), so the rank's state is no longer exact.
	// Drop this rank's state and rebuild from the batches that follow
	// (starting at To); blocks stored in the hole stay unknown until the
	// engine stores them again.
	MsgLostHistory
)

// String names the kind.
func (k MessageKind) String() string {
	switch k {
	case MsgBatch:
		return "batch"
	case MsgReset:
		return "reset"
	case MsgLostHistory:
		return "lost-history"
	}
	return "unknown"
}

// Message is one item of a rank's ordered stream, as returned by Next.
type Message struct {
	Kind MessageKind
	Rank int    // DP rank: index of the endpoint
	Seq  uint64 // MsgBatch: the batch's seq; MsgReset: first seq of the new incarnation; MsgLostHistory: first seq after the hole
	From uint64 // MsgLostHistory: first lost seq
	// Batch (MsgBatch only) is owned by the Subscriber and valid until the
	// next call to Next: copy what must outlive it.
	Batch    *Batch
	Replayed bool // MsgBatch arrived through replay, not live
	// Undecodable (MsgLostHistory only): the hole is one batch the decoder
	// could not read, not a transport loss. Asking the engine to resend or
	// reset does not help: its next batch may be just as unreadable.
	Undecodable bool
}

// SubscriberStats are the subscriber's counters, read atomically.
type SubscriberStats struct {
	Received       uint64 // live messages received
	Delivered      uint64 // batches handed to the consumer (live and replayed)
	Gaps           uint64 // live seq jumped ahead (or first sight after seq 0)
	Replays        uint64 // replay requests sent
	Replayed       uint64 // batches delivered from replay
	ReplayFailures uint64 // replay exchanges that timed out or ran past MaxReplayBatches
	Resets         uint64 // seq went backwards: engine restarted
	LostHistory    uint64 // holes that could not be filled
	DecodeErrors   uint64 // payloads that did not decode (counted, skipped, reported as lost history)
	Malformed      uint64 // messages with the wrong frame layout or seq ff×8, replay replies out of order (skipped)
	Duplicates     uint64 // live batches already delivered through replay (skipped)
	Probes         uint64 // idle probes (replay requests not caused by a gap)
	UnknownEvents  uint64 // events of unknown types skipped inside delivered batches
}

// Subscriber receives one engine's KV events from every DP rank over ZMQ:
// a SUB socket per rank, per-rank sequence tracking, replay through a DEALER
// per rank when a gap appears, and restart detection. One goroutine owned by
// the Subscriber runs the sockets; the consumer reads an ordered stream per
// rank with Next. Close stops the goroutine and is idempotent.
//
// Ordering guarantee, per rank: batches arrive in sequence without
// duplicates; a MsgReset or MsgLostHistory comes exactly where the stream
// broke, before the batches that follow the break. On first sight of a rank
// whose sequence is past 0, the subscriber replays from 0; if the engine's
// buffer no longer reaches back that far, the stream starts with
// MsgLostHistory{From: 0}. With LiveStart, the rank's first live batch
// starts its stream instead (a tool watching live events).
//
// ReplayOnStart replays every rank from 0 at start (a sidecar restarted
// next to an idle engine); IdleProbe replays quiet ranks periodically (a
// rank with live messages waiting is not quiet, however long the loop was
// held). Live copies of batches already delivered by a replay are
// recognised by payload hash and skipped, never mistaken for a restart;
// past the last 1,024 batches, where the hash is no longer remembered, the
// engine's replay of the last delivered batch decides (the same batch: a
// late copy; another or none: a restart).
//
// Limits (inherent in the wire protocol): without IdleProbe, batches lost at
// the end of a burst are noticed only when the engine publishes again; a
// restart whose new sequence has already passed the old one is caught only
// while the engine's replay buffer still holds the batch at the old last
// sequence (the replay's overlap batch is compared with what was
// delivered); without replay such a restart looks like a gap.
type Subscriber struct {
	cfg  SubscriberConfig
	zctx *zmq.Context
	// ownCtx: zctx is this subscriber's (it binds): Close terminates it.
	ownCtx bool
	ranks  []*rankState
	eps    []string

	out  chan Message
	ring []Batch // decode slots: QueueSize+2 so a slot is never reused while queued or held
	// kept[i] is the decoded capacity ring[i] holds (Batch.retainedBytes),
	// keptSum their sum, bounded by ringKeepBytes (see deliver).
	kept    []int
	keptSum int
	pos     int

	quit chan struct{}
	done chan struct{}
	once sync.Once
	err  error // why the loop stopped; written before done is closed

	// probeReq carries Probe's requests to the socket loop, each with the
	// channel (cap 1) that gets the stream position after the probe.
	probeReq chan chan uint64
	// wakeRecv (the socket loop's) and wakeSend (any goroutine's, under
	// wakeMu) are an inproc PAIR: Close and Probe wake the loop out of its
	// poll, which can then wait long when nothing arrives (an idle engine
	// cost a sidecar 20 polls a second, each a cgo call the Go runtime's
	// monitor thread watched: about half an idle sidecar's CPU).
	wakeRecv *zmq.Socket
	wakeMu   sync.Mutex
	wakeSend *zmq.Socket
	// emitted counts the messages queued for Next (socket loop only).
	emitted uint64

	st subscriberCounters
}

// errStopped unwinds the socket loop when Close is called mid-operation.
var errStopped = errors.New("subscriber stopped")

// NewSubscriber opens and connects (or binds) the sockets and starts the
// socket loop.
func NewSubscriber(cfg SubscriberConfig) (*Subscriber, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new subscriber: %w", err)
	}
	s := &Subscriber{
		cfg:  cfg,
		out:  make(chan Message, cfg.QueueSize),
		ring: make([]Batch, cfg.QueueSize+2),
		kept: make([]int, cfg.QueueSize+2),
		quit: make(chan struct{}),
		done: make(chan struct{}),
		// One queued: Probe leaves its request, then wakes the loop.
		probeReq: make(chan chan uint64, 1),
	}
	if err := s.open(); err != nil {
		s.closeSockets()
		return nil, fmt.Errorf("new subscriber: %w", err)
	}
	go s.loop()
	return s, nil
}

func (s *Subscriber) open() error {
	eps, replays := s.cfg.rankEndpoints()
	var err error
	if s.cfg.Bind {
		s.zctx, s.ownCtx, err = zmqep.BindContext(eps...)
	} else {
		s.zctx, err = zmqep.SharedContext()
	}
	if err != nil {
		return err
	}
	for r, ep := range eps {
		rs := &rankState{rank: r, replayEP: replays[r]}
		s.ranks = append(s.ranks, rs)
		if rs.sub, err = s.zctx.NewSocket(zmq.SUB); err != nil {
			return err
		}
		_ = rs.sub.SetLinger(0)
		if err = rs.sub.SetIpv6(true); err != nil { // [v6] endpoints; IPv4 ones still work
			return err
		}
		if err = rs.sub.SetRcvhwm(s.cfg.RcvHWM); err != nil {
			return err
		}
		if err = rs.sub.SetSubscribe(s.cfg.Topic); err != nil {
			return err
		}
		if s.cfg.Bind {
			if err = rs.sub.Bind(ep); err != nil {
				return fmt.Errorf("bind %s: %w", ep, err)
			}
			last, err := rs.sub.GetLastEndpoint()
			if err != nil {
				return err
			}
			s.eps = append(s.eps, zmqep.Connectable(last))
		} else {
			if err = rs.sub.Connect(ep); err != nil {
				return fmt.Errorf("connect %s: %w", ep, err)
			}
			s.eps = append(s.eps, ep)
		}
		if rs.replayEP != "" {
			if err = s.openDealer(rs); err != nil {
				return err
			}
		}
	}
	return s.openWake()
}

// wakeSeq names each subscriber's wake endpoint (one ZMQ context may be
// shared by many subscribers).
var wakeSeq atomic.Uint64

func (s *Subscriber) openWake() error {
	ep := fmt.Sprintf("inproc://kvevents-wake-%d", wakeSeq.Add(1))
	var err error
	if s.wakeRecv, err = s.zctx.NewSocket(zmq.PAIR); err != nil {
		return err
	}
	_ = s.wakeRecv.SetLinger(0)
	if err := s.wakeRecv.Bind(ep); err != nil {
		return err
	}
	w, err := s.zctx.NewSocket(zmq.PAIR)
	if err != nil {
		return err
	}
	_ = w.SetLinger(0)
	if err := w.Connect(ep); err != nil {
		_ = w.Close()
		return err
	}
	s.wakeMu.Lock()
	s.wakeSend = w
	s.wakeMu.Unlock()
	return nil
}

// wake interrupts the socket loop's poll (Close, Probe). A wake-up
// already queued is enough: a full pipe drops this one.
func (s *Subscriber) wake() {
	s.wakeMu.Lock()
	if s.wakeSend != nil {
		_, _ = s.wakeSend.SendBytes(nil, zmq.DONTWAIT)
	}
	s.wakeMu.Unlock()
}

func (s *Subscriber) openDealer(rs *rankState) error {
	d, err := s.zctx.NewSocket(zmq.DEALER)
	if err != nil {
		return err
	}
	_ = d.SetLinger(0)
	if err := d.SetIpv6(true); err != nil {
		_ = d.Close()
		return err
	}
	// Unlimited receive queue: a full one would make the engine's ROUTER
	// drop replies (holes in the replay) while the consumer is busy. It is
	// bounded by the engine's replay buffer (TestReplayQueuedWhileConsumerBusy).
	_ = d.SetRcvhwm(0)
	if err := d.Connect(rs.replayEP); err != nil {
		_ = d.Close()
		return fmt.Errorf("connect replay %s: %w", rs.replayEP, err)
	}
	rs.dealer = d
	rs.dpoller = zmq.NewPoller()
	rs.dpoller.Add(d, zmq.POLLIN)
	return nil
}

// Endpoints are the SUB endpoints per rank; with Bind they are the real
// bound addresses (useful with "tcp://127.0.0.1:*") for engines to connect to.
func (s *Subscriber) Endpoints() []string { return append([]string(nil), s.eps...) }

// Next returns the next message in order. It blocks until one is ready, ctx
// ends, or the subscriber stops (then it returns ErrClosed, or the socket
// error that stopped it). Only one goroutine may call Next: the previous
// message's Batch is reused after it returns.
func (s *Subscriber) Next(ctx context.Context) (Message, error) {
	select {
	case m := <-s.out:
		return m, nil
	case <-ctx.Done():
		return Message{}, ctx.Err()
	case <-s.done:
		select {
		case m := <-s.out:
			return m, nil
		default:
		}
		if s.err != nil {
			return Message{}, s.err
		}
		return Message{}, fmt.Errorf("next: %w", ErrClosed)
	}
}

// Stats returns the counters.
func (s *Subscriber) Stats() SubscriberStats { return s.st.snapshot() }

// Replays says whether any rank has a replay endpoint: without one, Probe
// probes nothing and an engine's restart shows only in its next events.
func (s *Subscriber) Replays() bool {
	for _, r := range s.ranks {
		if r.replayEP != "" {
			return true
		}
	}
	return false
}

// Probe replays every rank with a replay socket from its next seq now, as
// an idle probe does, with the longer probe interval of failed replays
// forgotten: for an engine that answers again after an outage, whose
// restart only the replay shows when it came back idle. A rank with live
// messages waiting is left to them. It returns once the probe's messages
// (a reset, the new incarnation's batches) are queued for Next, with the
// number of messages queued since the start: the consumer has applied what
// the probe found once it has taken that many. Without replay sockets it
// probes nothing and returns the position at once. It fails when ctx ends
// first or the subscriber is closed.
func (s *Subscriber) Probe(ctx context.Context) (uint64, error) {
	r := make(chan uint64, 1)
	select {
	case s.probeReq <- r:
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-s.done:
		return 0, fmt.Errorf("probe: %w", ErrClosed)
	}
	s.wake()
	select {
	case pos := <-r:
		return pos, nil
	case <-ctx.Done():
		return 0, ctx.Err()
	case <-s.done:
		return 0, fmt.Errorf("probe: %w", ErrClosed)
	}
}

// Close stops the socket loop and closes every socket. Messages still
// queued are discarded. It is idempotent.
func (s *Subscriber) Close() error {
	s.once.Do(func() {
		close(s.quit)
		s.wake()
		<-s.done
		s.closeSockets()
	})
	return nil
}

func (s *Subscriber) closeSockets() {
	s.wakeMu.Lock()
	if s.wakeSend != nil {
		_ = s.wakeSend.Close()
		s.wakeSend = nil
	}
	s.wakeMu.Unlock()
	if s.wakeRecv != nil {
		_ = s.wakeRecv.Close()
	}
	for _, rs := range s.ranks {
		if rs.sub != nil {
			_ = rs.sub.Close()
		}
		if rs.dealer != nil {
			_ = rs.dealer.Close()
		}
	}
	if s.ownCtx {
		_ = s.zctx.Term() // returns once every socket is closed (linger 0)
	}
}

// ringKeepBytes bounds the decoded capacity (events and their hashes,
// tokens and extra keys) the decode slots keep between batches, summed over
// the ring. Reusing a slot's slices makes decoding allocation-free; past
// this, a slot about to be reused lets them go. Each slot keeps the biggest
// batch it ever decoded (every event position its biggest slices), so a
// per-slot rule let a sidecar's ring (1,026 slots) hold hundreds of MB
// under long prompts; with the sum bounded, small batches still decode
// without allocating and big ones cost an allocation each.
const ringKeepBytes = 8 << 20

// maxDrain bounds the messages read from one rank per poll, so one busy
// rank cannot starve the others.
const maxDrain = 256

// loop is the socket loop: it owns every socket until it returns.
func (s *Subscriber) loop() {
	defer close(s.done)
	poller := zmq.NewPoller()
	bySock := make(map[*zmq.Socket]*rankState, len(s.ranks))
	for _, rs := range s.ranks {
		poller.Add(rs.sub, zmq.POLLIN)
		bySock[rs.sub] = rs
	}
	poller.Add(s.wakeRecv, zmq.POLLIN) // not in bySock: drained below
	if s.cfg.ReplayOnStart {
		for _, rs := range s.ranks {
			if err := s.recover(rs, 0, noLive); err != nil {
				return // errStopped
			}
		}
	}
	for {
		select {
		case <-s.quit:
			return
		default:
		}
		if s.cfg.loopHook != nil {
			s.cfg.loopHook(s)
		}
		select {
		case r := <-s.probeReq:
			if err := s.probeNow(); err != nil {
				return // errStopped
			}
			r <- s.emitted
		default:
		}
		if err := s.probeIdle(); err != nil {
			return // errStopped
		}
		polled, err := poller.Poll(s.pollWait(time.Now()))
		if err != nil {
			s.err = fmt.Errorf("subscriber poll: %w", err)
			s.cfg.Logger.Error("kv events subscriber stopped", "err", err)
			return
		}
		for _, p := range polled {
			rs := bySock[p.Socket]
			if rs == nil { // the wake socket: quit and probeReq are read at the top
				for {
					if _, err := s.wakeRecv.RecvBytes(zmq.DONTWAIT); err != nil {
						break
					}
				}
				continue
			}
			for i := 0; i < maxDrain; i++ {
				frames, err := rs.sub.RecvMessageBytes(zmq.DONTWAIT)
				if err != nil {
					if zmq.AsErrno(err) != zmq.Errno(syscall.EAGAIN) {
						s.cfg.Logger.Warn("kv events receive", "rank", rs.rank, "err", err)
					}
					break
				}
				if err := s.onLive(rs, frames); err != nil {
					return // errStopped
				}
			}
		}
	}
}

// maxPollWait bounds the socket loop's wait for input when nothing is due:
// it still turns over once a second (its test hook, a probe interval
// changed by a failure) while an idle engine costs one poll a second, not
// twenty.
const maxPollWait = time.Second

// pollWait is how long the socket loop's poll may wait at now: until the
// next idle probe is due, at least PollInterval and at most maxPollWait.
// Close and Probe wake it (wake).
func (s *Subscriber) pollWait(now time.Time) time.Duration {
	wait := maxPollWait
	if s.cfg.IdleProbe > 0 {
		for _, rs := range s.ranks {
			if rs.dealer != nil {
				wait = min(wait, rs.lastMsg.Add(s.probeInterval(rs)).Sub(now))
			}
		}
	}
	return max(wait, s.cfg.PollInterval)
}

// probeIdle replays each rank that has been quiet for IdleProbe: it
// delivers batches whose live copies were lost at the end of a burst, and
// notices an engine that restarted and stayed idle.
//
// A rank with live messages waiting on its SUB socket is not quiet, however
// long ago the loop last read it: the loop was held (process paused, CPU
// starved, consumer slow). Replaying it first would deliver ahead of the
// queued copies, and more than histSize of them could no longer be told
// from an engine restart.
func (s *Subscriber) probeIdle() error {
	if s.cfg.IdleProbe <= 0 {
		return nil
	}
	now := time.Now()
	for _, rs := range s.ranks {
		if rs.dealer == nil || now.Sub(rs.lastMsg) < s.probeInterval(rs) || pendingInput(rs) {
			continue
		}
		if err := s.probe(rs, now); err != nil {
			return err
		}
	}
	return nil
}

// probeNow is Probe's work in the socket loop: every rank with a replay
// socket and no live messages waiting, quiet or not, from the normal
// probe interval on.
func (s *Subscriber) probeNow() error {
	now := time.Now()
	for _, rs := range s.ranks {
		if rs.dealer == nil || pendingInput(rs) {
			continue
		}
		rs.replayFails = 0
		if err := s.probe(rs, now); err != nil {
			return err
		}
	}
	return nil
}

// probe replays rs from its next seq (from 0 before any).
func (s *Subscriber) probe(rs *rankState, now time.Time) error {
	rs.lastMsg = now
	if s.cfg.LiveStart && !rs.started {
		return nil // its stream starts at its first live batch
	}
	s.st.probes.Add(1)
	from := uint64(0)
	if rs.has {
		from = rs.last + 1
	}
	return s.recover(rs, from, noLive)
}

// pendingInput reports whether rs's SUB socket has a message waiting.
func pendingInput(rs *rankState) bool {
	ev, err := rs.sub.GetEvents()
	return err == nil && ev&zmq.POLLIN != 0
}

// maxProbeBackoff bounds how far probes of a rank whose replay fails back off.
const maxProbeBackoff = time.Minute

// probeInterval is IdleProbe, doubled for each replay exchange of rs that
// failed in a row (up to maxProbeBackoff, or IdleProbe if longer): each
// failed probe holds the socket loop for ReplayTimeout, so a replay socket
// that is down must not cost that every IdleProbe.
func (s *Subscriber) probeInterval(rs *rankState) time.Duration {
	d := s.cfg.IdleProbe
	for i := 0; i < rs.replayFails && d < maxProbeBackoff; i++ {
		d *= 2
	}
	return max(min(d, maxProbeBackoff), s.cfg.IdleProbe)
}

// onLive handles one live [topic, seq, payload] message.
func (s *Subscriber) onLive(rs *rankState, frames [][]byte) error {
	if len(frames) != 3 || len(frames[1]) != 8 {
		s.st.malformed.Add(1)
		return nil
	}
	seq := binary.BigEndian.Uint64(frames[1])
	if seq == endSeq {
		// Never a batch's seq. Taken as one, it would wrap last+1 to 0
		// and the next real batch would replay (and deliver twice)
		// everything from 0.
		s.st.malformed.Add(1)
		return nil
	}
	s.st.received.Add(1)
	rs.lastMsg = time.Now()
	// liveStart: with LiveStart, the rank's first batch ever seen starts
	// its stream; the batches before it are not replayed.
	liveStart := s.cfg.LiveStart && !rs.started
	rs.started = true
	switch {
	case rs.has && seq == rs.last+1:
		rs.lateOK = false // a run of late copies (isLateCopy) is over
	case rs.has && seq > rs.last+1:
		s.st.gaps.Add(1)
		s.cfg.Logger.Info("kv events gap", "rank", rs.rank, "after", rs.last, "got", seq)
		if err := s.recover(rs, rs.last+1, seq); err != nil {
			return err
		}
	case rs.has && s.isDuplicate(rs, seq, frames[2]):
		s.st.duplicates.Add(1)
		return nil
	case rs.has && s.isLateCopy(rs, seq):
		s.st.duplicates.Add(1)
		return nil
	case rs.has: // seq <= last with another payload: a new incarnation of the engine
		if err := s.reset(rs, seq, "sequence went backwards"); err != nil {
			return err
		}
		fallthrough
	default: // first sight of this rank (or of its new incarnation)
		if seq > 0 && !liveStart {
			s.st.gaps.Add(1)
			if err := s.recover(rs, 0, seq); err != nil {
				return err
			}
		}
	}
	if rs.has && seq <= rs.last {
		return nil // already delivered through replay
	}
	return s.deliver(rs, seq, frames[2], false)
}

// isDuplicate reports whether a live batch at seq <= last is one already
// delivered through replay (same payload), not an engine restart.
func (s *Subscriber) isDuplicate(rs *rankState, seq uint64, payload []byte) bool {
	sum, ok := rs.sumOf(seq)
	return ok && sum == xxh3.Hash(payload)
}

// isLateCopy decides a live batch at seq <= last whose history slot has
// been reused by a newer seq (seq was delivered more than histSize batches
// ago, typically by a replay that overtook queued live copies), so its
// payload cannot be compared. A new incarnation of the engine looks the
// same from here, so the engine is asked: a replay from last returning the
// very batch delivered at last means the engine still has this history and
// the live batch is a late copy. A run of late copies (consecutive seqs)
// costs one exchange. Anything else (another payload at last, an empty or
// failed replay, no replay socket) is left to the restart rule, as before.
func (s *Subscriber) isLateCopy(rs *rankState, seq uint64) bool {
	if seq > rs.last {
		return false
	}
	if e := rs.hist[seq%histSize]; !e.ok || e.seq <= seq {
		return false // remembered (another payload: a restart) or never delivered
	}
	if rs.lateNext == seq && rs.lateOK {
		rs.lateNext++
		return true
	}
	if !s.sameHistory(rs) {
		return false
	}
	rs.lateNext, rs.lateOK = seq+1, true
	return true
}

// sameHistory asks rs's replay socket for the batch at rs.last and reports
// whether it is the one delivered there. Only the first reply matters: the
// socket is replaced afterwards, which drops the rest of the exchange.
func (s *Subscriber) sameHistory(rs *rankState) bool {
	sum, ok := rs.sumOf(rs.last)
	if rs.dealer == nil || !ok {
		return false
	}
	s.st.replays.Add(1)
	var startb [8]byte
	binary.BigEndian.PutUint64(startb[:], rs.last)
	if _, err := rs.dealer.SendMessage("", startb[:]); err != nil {
		s.cfg.Logger.Warn("kv events replay request", "rank", rs.rank, "err", err)
		return false
	}
	defer s.resetDealer(rs)
	deadline := time.Now().Add(s.cfg.ReplayTimeout)
	for {
		frames, ok, err := s.recvReplay(rs, deadline)
		if err != nil || !ok {
			if err == nil {
				s.st.replayFailures.Add(1)
				rs.replayFails++
				s.cfg.Logger.Warn("kv events replay timed out", "rank", rs.rank, "endpoint", rs.replayEP)
			}
			return false // stopped, or no answer: undecided
		}
		seq, payload, end, valid := parseReplay(frames)
		if !valid {
			s.st.malformed.Add(1)
			continue
		}
		rs.replayFails = 0
		return !end && seq == rs.last && xxh3.Hash(payload) == sum
	}
}

// reset tells the consumer that rank rs restarted and forgets its state.
func (s *Subscriber) reset(rs *rankState, seq uint64, why string) error {
	s.st.resets.Add(1)
	s.cfg.Logger.Warn("kv events engine restarted", "rank", rs.rank, "last", rs.last, "got", seq, "why", why)
	rs.forget()
	return s.emit(Message{Kind: MsgReset, Rank: rs.rank, Seq: seq})
}

// deliver decodes one batch and hands it on; an undecodable payload is
// counted and reported as a one-batch hole.
func (s *Subscriber) deliver(rs *rankState, seq uint64, payload []byte, replayed bool) error {
	pos := s.pos
	slot := &s.ring[pos]
	if s.keptSum > ringKeepBytes {
		s.keptSum -= s.kept[pos]
		*slot, s.kept[pos] = Batch{}, 0
	}
	s.pos = (s.pos + 1) % len(s.ring)
	rs.last, rs.has, rs.started = seq, true, true
	rs.remember(seq, xxh3.Hash(payload))
	err := DecodeBatch(payload, slot)
	k := slot.retainedBytes()
	s.keptSum += k - s.kept[pos]
	s.kept[pos] = k
	if err != nil {
		s.st.decodeErrors.Add(1)
		s.st.lost.Add(1)
		s.cfg.Logger.Warn("kv events payload skipped", "rank", rs.rank, "seq", seq, "err", err)
		return s.emit(Message{Kind: MsgLostHistory, Rank: rs.rank, From: seq, Seq: seq + 1, Undecodable: true})
	}
	s.st.delivered.Add(1)
	if slot.Skipped > 0 {
		s.st.unknownEvents.Add(uint64(slot.Skipped))
	}
	if replayed {
		s.st.replayed.Add(1)
	}
	return s.emit(Message{Kind: MsgBatch, Rank: rs.rank, Seq: seq, Batch: slot, Replayed: replayed})
}

// emit blocks until the consumer has room (the stated back-pressure policy)
// or the subscriber is closed.
func (s *Subscriber) emit(m Message) error {
	select {
	case s.out <- m:
		s.emitted++
		return nil
	case <-s.quit:
		return errStopped
	}
}

func (s *Subscriber) lostHistory(rs *rankState, from, to uint64) error {
	s.st.lost.Add(1)
	s.cfg.Logger.Warn("kv events history lost", "rank", rs.rank, "from", from, "to", to)
	if to > 0 {
		rs.last, rs.has = to-1, true
	}
	return s.emit(Message{Kind: MsgLostHistory, Rank: rs.rank, From: from, Seq: to})
}
