package kvtest

import (
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
	zmqep "github.com/kvmesh/kvmesh/kvevents/internal/endpoint"

	zmq "github.com/pebbe/zmq4"
)

// ReplayLayout is the shape of replay replies (spec §1).
type ReplayLayout uint8

const (
	// ReplayWithTopic is vLLM after PR #45177: ["", topic, seq, payload] ...
	// then ["", "", ff×8, ""].
	ReplayWithTopic ReplayLayout = iota
	// ReplayLegacy is older vLLM and SGLang: ["", seq, payload] ... then
	// ["", ff×8, ""].
	ReplayLegacy
)

// PublisherConfig configures a vLLM-like KV-event publisher: one per engine
// DP rank, as vLLM's ZmqEventPublisher.
type PublisherConfig struct {
	// Endpoint of the PUB socket for DP rank 0 (default "tcp://*:5557").
	// It binds if it contains "*" or "::", is ipc/inproc or has port 0, and
	// connects otherwise (then the subscriber binds).
	Endpoint string
	// ReplayEndpoint of the ROUTER socket for rank 0; "" disables replay.
	// The ROUTER always binds.
	ReplayEndpoint string
	// DPRank offsets both ports (rank r uses port+r) and is written into
	// every batch's envelope unless the batch already sets one.
	DPRank int
	// Topic is frame 0 of every live message (default "").
	Topic string
	// BufferSteps is how many batches the replay buffer keeps (default 10000).
	BufferSteps int
	// HWM is the PUB send high-water mark (default 100000); beyond it ZMQ
	// drops messages, which subscribers see as gaps.
	HWM int
	// Form selects array- or map-encoded events (default ArrayForm).
	Form EventForm
	// Layout selects the replay reply layout (default ReplayWithTopic).
	Layout ReplayLayout
	// DropRate is the fraction of batches (0..1) that get a sequence number
	// and enter the replay buffer but are not sent live: a fault switch for
	// tests and demos. DropSeed makes the choice deterministic.
	DropRate float64
	DropSeed uint64
	// Logger receives lifecycle and replay messages (default slog.Default()).
	Logger *slog.Logger
}

// DefaultPublisherConfig returns vLLM's defaults (spec §1) with replay on
// "tcp://*:5558".
func DefaultPublisherConfig() PublisherConfig {
	return PublisherConfig{
		Endpoint:       "tcp://*:5557",
		ReplayEndpoint: "tcp://*:5558",
		BufferSteps:    10000,
		HWM:            100000,
	}
}

func (c *PublisherConfig) setDefaults() {
	d := DefaultPublisherConfig()
	if c.Endpoint == "" {
		c.Endpoint = d.Endpoint
	}
	if c.BufferSteps == 0 {
		c.BufferSteps = d.BufferSteps
	}
	if c.HWM == 0 {
		c.HWM = d.HWM
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
}

// Validate lists every problem with the configuration.
func (c *PublisherConfig) Validate() error {
	var errs []error
	if c.DPRank < 0 {
		errs = append(errs, fmt.Errorf("DPRank %d is negative", c.DPRank))
	}
	if c.BufferSteps < 0 {
		errs = append(errs, fmt.Errorf("BufferSteps %d is negative", c.BufferSteps))
	}
	if c.HWM < 0 {
		errs = append(errs, fmt.Errorf("HWM %d is negative", c.HWM))
	}
	if c.DropRate < 0 || c.DropRate > 1 {
		errs = append(errs, fmt.Errorf("DropRate %v is outside [0, 1]", c.DropRate))
	}
	if c.Form > MapForm {
		errs = append(errs, fmt.Errorf("unknown event form %d", c.Form))
	}
	if c.Layout > ReplayLegacy {
		errs = append(errs, fmt.Errorf("unknown replay layout %d", c.Layout))
	}
	if c.Endpoint != "" {
		if _, err := kvevents.OffsetEndpoint(c.Endpoint, c.DPRank); err != nil {
			errs = append(errs, fmt.Errorf("Endpoint: %w", err))
		}
	}
	if c.ReplayEndpoint != "" {
		if _, err := kvevents.OffsetEndpoint(c.ReplayEndpoint, c.DPRank); err != nil {
			errs = append(errs, fmt.Errorf("ReplayEndpoint: %w", err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", kvevents.ErrConfig, errors.Join(errs...))
	}
	return nil
}

// PublisherStats are a publisher's counters.
type PublisherStats struct {
	Published      uint64 // batches given a sequence number
	Dropped        uint64 // of those, not sent live (fault switch)
	ReplayRequests uint64
	ReplayedSent   uint64 // batches sent in replay replies
}

// Publisher publishes KV-event batches like vLLM's ZmqEventPublisher: a PUB
// socket carrying [topic, seq (8 B big-endian), payload] with seq from 0,
// and a ROUTER answering replay requests from a bounded buffer.
//
// Publish is safe for concurrent use. A goroutine owned by the Publisher
// serves replay requests; Close stops it and is idempotent.
type Publisher struct {
	cfg      PublisherConfig
	zctx     *zmq.Context
	ownCtx   bool // zctx is this publisher's: Close terminates it
	endpoint string
	replayEP string

	// mu guards the PUB socket, the sequence, the ring and the drop state.
	mu      sync.Mutex
	pub     *zmq.Socket
	seq     uint64
	ring    []ringEntry // ring[seq % len] holds seq's payload
	scratch []byte
	rng     *rand.Rand
	dropN   int // force-drop the next dropN batches
	closed  bool

	router *zmq.Socket // owned by the replay goroutine
	quit   chan struct{}
	done   chan struct{}
	once   sync.Once

	published, dropped, replayReqs, replayedSent atomic.Uint64
}

type ringEntry struct {
	seq     uint64
	valid   bool
	payload []byte
}

// NewPublisher opens the sockets and starts the replay service.
func NewPublisher(cfg PublisherConfig) (*Publisher, error) {
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("new publisher: %w", err)
	}
	p := &Publisher{
		cfg:  cfg,
		ring: make([]ringEntry, max(cfg.BufferSteps, 0)),
		rng:  rand.New(rand.NewPCG(cfg.DropSeed, 0x6b766d657368)),
		quit: make(chan struct{}),
		done: make(chan struct{}),
	}
	if err := p.open(); err != nil {
		p.closeSockets()
		return nil, fmt.Errorf("new publisher: %w", err)
	}
	if p.router != nil {
		go p.serveReplay()
	} else {
		close(p.done)
	}
	return p, nil
}

func (p *Publisher) open() error {
	var err error
	if p.zctx, p.ownCtx, err = zmqep.BindContext(p.cfg.Endpoint, p.cfg.ReplayEndpoint); err != nil {
		return err
	}
	ep, _ := kvevents.OffsetEndpoint(p.cfg.Endpoint, p.cfg.DPRank)
	if p.pub, err = p.zctx.NewSocket(zmq.PUB); err != nil {
		return err
	}
	_ = p.pub.SetLinger(0)
	if err = p.pub.SetIpv6(true); err != nil { // [v6] endpoints; IPv4 ones still work
		return err
	}
	if err = p.pub.SetSndhwm(p.cfg.HWM); err != nil {
		return err
	}
	if zmqep.ShouldBind(ep) {
		if err = p.pub.Bind(ep); err != nil {
			return fmt.Errorf("bind %s: %w", ep, err)
		}
		last, err := p.pub.GetLastEndpoint()
		if err != nil {
			return err
		}
		p.endpoint = zmqep.Connectable(last)
	} else {
		if err = p.pub.Connect(ep); err != nil {
			return fmt.Errorf("connect %s: %w", ep, err)
		}
		p.endpoint = ep
	}
	if p.cfg.ReplayEndpoint == "" {
		return nil
	}
	rep, _ := kvevents.OffsetEndpoint(p.cfg.ReplayEndpoint, p.cfg.DPRank)
	if p.router, err = p.zctx.NewSocket(zmq.ROUTER); err != nil {
		return err
	}
	_ = p.router.SetLinger(0)
	if err = p.router.SetIpv6(true); err != nil {
		return err
	}
	// A ROUTER drops replies beyond its HWM; leave room for a whole buffer.
	if err = p.router.SetSndhwm(max(p.cfg.BufferSteps+16, 1000)); err != nil {
		return err
	}
	if err = p.router.Bind(rep); err != nil {
		return fmt.Errorf("bind replay %s: %w", rep, err)
	}
	last, err := p.router.GetLastEndpoint()
	if err != nil {
		return err
	}
	p.replayEP = zmqep.Connectable(last)
	return nil
}

// Endpoint is the PUB endpoint a local subscriber connects to (the real port
// when bound to port 0 or "*"), or the endpoint connected to.
func (p *Publisher) Endpoint() string { return p.endpoint }

// ReplayEndpoint is the ROUTER endpoint to connect a DEALER to ("" if off).
func (p *Publisher) ReplayEndpoint() string { return p.replayEP }

// Publish assigns the next sequence number to b, keeps its payload for
// replay and sends it live (unless the fault switch drops it). A batch
// without a DP rank gets the publisher's. It is safe for concurrent use.
func (p *Publisher) Publish(b *kvevents.Batch) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return 0, fmt.Errorf("publish: %w", kvevents.ErrClosed)
	}
	seq := p.seq
	if !b.HasDPRank {
		saved := *b
		saved.DPRank, saved.HasDPRank = p.cfg.DPRank, true
		p.scratch = AppendBatch(p.scratch[:0], &saved, p.cfg.Form)
	} else {
		p.scratch = AppendBatch(p.scratch[:0], b, p.cfg.Form)
	}
	if len(p.ring) > 0 {
		e := &p.ring[seq%uint64(len(p.ring))]
		e.seq, e.valid = seq, true
		if cap(e.payload) > 2*len(p.scratch)+512 {
			e.payload = nil // sized for a far bigger batch: every entry would keep its biggest
		}
		e.payload = append(e.payload[:0], p.scratch...)
	}
	p.seq++
	p.published.Add(1)
	if p.dropN > 0 || (p.cfg.DropRate > 0 && p.rng.Float64() < p.cfg.DropRate) {
		if p.dropN > 0 {
			p.dropN--
		}
		p.dropped.Add(1)
		return seq, nil
	}
	var seqb [8]byte
	binary.BigEndian.PutUint64(seqb[:], seq)
	if _, err := p.pub.SendMessage(p.cfg.Topic, seqb[:], p.scratch); err != nil {
		return seq, fmt.Errorf("publish seq %d: %w", seq, err)
	}
	return seq, nil
}

// SendRaw sends frames on the live socket as they are, outside the
// sequence and the replay buffer: malformed or hostile messages for fault
// tests.
func (p *Publisher) SendRaw(frames ...any) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return fmt.Errorf("send raw: %w", kvevents.ErrClosed)
	}
	if _, err := p.pub.SendMessage(frames...); err != nil {
		return fmt.Errorf("send raw: %w", err)
	}
	return nil
}

// DropNext makes the next n batches skip the live socket (they still enter
// the replay buffer), as if the PUB high-water mark had dropped them.
func (p *Publisher) DropNext(n int) {
	p.mu.Lock()
	p.dropN += n
	p.mu.Unlock()
}

// SetDropRate changes the fraction of batches dropped from the live socket.
func (p *Publisher) SetDropRate(rate float64) {
	p.mu.Lock()
	p.cfg.DropRate = min(max(rate, 0), 1)
	p.mu.Unlock()
}

// Restart simulates an engine restart without rebinding: the sequence
// starts again at 0 and the replay buffer is emptied.
func (p *Publisher) Restart() {
	p.mu.Lock()
	p.seq = 0
	for i := range p.ring {
		p.ring[i].valid = false
	}
	p.mu.Unlock()
}

// NextSeq is the sequence number the next Publish will use.
func (p *Publisher) NextSeq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seq
}

// Stats returns the publisher's counters.
func (p *Publisher) Stats() PublisherStats {
	return PublisherStats{
		Published:      p.published.Load(),
		Dropped:        p.dropped.Load(),
		ReplayRequests: p.replayReqs.Load(),
		ReplayedSent:   p.replayedSent.Load(),
	}
}

// replayPoll bounds how long Close waits for the replay goroutine.
const replayPoll = 20 * time.Millisecond

// serveReplay answers one replay request per loop, as vLLM's publisher
// thread does. It owns the ROUTER socket.
func (p *Publisher) serveReplay() {
	defer close(p.done)
	poller := zmq.NewPoller()
	poller.Add(p.router, zmq.POLLIN)
	var batch []ringEntry // copies taken under mu, sent outside it
	for {
		select {
		case <-p.quit:
			return
		default:
		}
		polled, err := poller.Poll(replayPoll)
		if err != nil {
			p.cfg.Logger.Warn("kv events replay poll", "err", err)
			return
		}
		if len(polled) == 0 {
			continue
		}
		msg, err := p.router.RecvMessageBytes(zmq.DONTWAIT)
		if err != nil {
			continue
		}
		p.replayReqs.Add(1)
		// [identity, "", start_seq(8)]
		if len(msg) != 3 || len(msg[1]) != 0 || len(msg[2]) != 8 {
			p.cfg.Logger.Warn("kv events replay: malformed request", "frames", len(msg))
			if len(msg) > 0 {
				p.sendEnd(msg[0])
			}
			continue
		}
		start := binary.BigEndian.Uint64(msg[2])
		batch = p.collect(batch[:0], start)
		for _, e := range batch {
			var seqb [8]byte
			binary.BigEndian.PutUint64(seqb[:], e.seq)
			if p.cfg.Layout == ReplayLegacy {
				_, err = p.router.SendMessage(msg[0], "", seqb[:], e.payload)
			} else {
				_, err = p.router.SendMessage(msg[0], "", p.cfg.Topic, seqb[:], e.payload)
			}
			if err != nil {
				break
			}
			p.replayedSent.Add(1)
		}
		p.sendEnd(msg[0])
	}
}

func (p *Publisher) sendEnd(identity []byte) {
	end := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if p.cfg.Layout == ReplayLegacy {
		_, _ = p.router.SendMessage(identity, "", end, "")
	} else {
		_, _ = p.router.SendMessage(identity, "", "", end, "")
	}
}

// collect copies the buffered batches with seq >= start, oldest first.
func (p *Publisher) collect(dst []ringEntry, start uint64) []ringEntry {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := uint64(len(p.ring))
	if n == 0 {
		return dst
	}
	first := uint64(0)
	if p.seq > n {
		first = p.seq - n
	}
	first = max(first, start)
	for s := first; s < p.seq; s++ {
		e := p.ring[s%n]
		if !e.valid || e.seq != s {
			continue
		}
		dst = append(dst, ringEntry{seq: s, valid: true, payload: append([]byte(nil), e.payload...)})
	}
	return dst
}

// Close stops the replay service and closes the sockets (linger 0: batches
// not yet sent are discarded). It is idempotent.
func (p *Publisher) Close() error {
	p.once.Do(func() {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		close(p.quit)
		<-p.done
		p.closeSockets()
	})
	return nil
}

func (p *Publisher) closeSockets() {
	if p.pub != nil {
		_ = p.pub.Close()
	}
	if p.router != nil {
		_ = p.router.Close()
	}
	if p.ownCtx {
		_ = p.zctx.Term() // returns once every socket is closed (linger 0)
	}
}
