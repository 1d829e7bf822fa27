package sim

import (
	"context"
	"encoding/binary"
	"fmt"
	"log/slog"
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/kvevents/kvtest"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/zeebo/xxh3"

	"github.com/kvmesh/kvmesh/kvevents"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// rank is one DP rank: an engine, its event publisher and the goroutine that
// drives it in scaled real time.
//
// Engine time (modelled seconds) maps to wall time as start + t/TimeScale.
// While busy the engine's clock runs step to step (next start = previous
// end), so host jitter and slow steps never distort modelled durations: a
// lagging simulator only runs slower than scaled real time. When idle the
// clock jumps to the present.
type rank struct {
	s   *Server
	idx int
	pub *kvtest.Publisher // nil without --kv-events

	mu    sync.Mutex // guards everything below; held across Step (short) and never while sleeping
	eng   *engine.Engine
	calls map[*engine.Request]*call
	vt    time.Duration // engine time of the next step while busy
	busy  bool
	start time.Time
	batch kvevents.Batch
	fin   []*engine.Request
	held  bool // tests only: the driver takes no step while set (see hold)
	// onStep, when set (tests only), runs on the driver after each step,
	// before the step's tokens are delivered, with the number of requests
	// the step finished.
	onStep func(finished int)

	itl prometheus.Observer // vllm:inter_token_latency_seconds of this rank: set before the ranks run, observed in deliver

	wake chan struct{} // cap 1: a request arrived
	// transferring counts this rank's decode requests reading their KV from
	// a prefill engine (pd_read.go): vLLM keeps them in the waiting queue
	// (WAITING_FOR_REMOTE_KVS), so vllm:num_requests_waiting includes them.
	transferring atomic.Int64
	done         chan struct{} // closed when run returns
	log          *slog.Logger
}

// call is one engine request of an HTTP request. Fields after req are
// guarded by rank.mu.
type call struct {
	rk     *rank
	req    *engine.Request
	notify chan struct{} // cap 1, shared by the calls of one HTTP request
	maxOut int           // the request's max_tokens (finish reason "length" when reached)
	sample int           // which of its prompt's n samples (0: the one whose prompt the usage counts)
	cut    stopCut       // where a stop string ends the output (stop.go); zero: none

	pdKey   string  // P/D hold key of a prefill leg ("" otherwise)
	room    *uint64 // SGLang bootstrap room of a prefill leg
	heldIDs []int32 // blocks held for a decode engine, set when the leg finishes holding them

	generated int // tokens delivered to the client so far (at their step's end)
	done      bool
	aborted   bool
	result    engine.Result
}

func newRank(s *Server, idx int) (*rank, error) {
	rk := &rank{s: s, idx: idx, calls: make(map[*engine.Request]*call), start: time.Now(),
		wake: make(chan struct{}, 1), done: make(chan struct{}), log: s.log.With("rank", idx)}
	if err := rk.newEngine(); err != nil {
		return nil, err
	}
	if s.cfg.KVEvents != "" {
		pub, err := kvtest.NewPublisher(kvtest.PublisherConfig{
			Endpoint: s.cfg.KVEvents, ReplayEndpoint: s.cfg.KVReplay, DPRank: idx, Topic: s.cfg.Topic,
			BufferSteps: s.cfg.ReplayBuffer, Form: s.cfg.EventForm, Layout: s.cfg.ReplayLayout,
			DropRate: s.cfg.DropRate, DropSeed: s.cfg.Seed + uint64(idx), Logger: rk.log,
		})
		if err != nil {
			return nil, fmt.Errorf("rank %d: %w", idx, err)
		}
		rk.pub = pub
	}
	return rk, nil
}

func (rk *rank) newEngine() error {
	ec := rk.s.cfg.Engine
	ec.Keyer = keyer{model: rk.s.cfg.Model}
	var sink engine.EventSink
	if rk.s.cfg.KVEvents != "" {
		sink = rk
	}
	eng, err := engine.New(ec, sink)
	if err != nil {
		return fmt.Errorf("rank %d: %w", rk.idx, err)
	}
	rk.eng = eng
	return nil
}

// KVEvents implements engine.EventSink: one batch per step, published
// synchronously (the publisher encodes before returning).
func (rk *rank) KVEvents(_ time.Duration, events []kvevents.Event) {
	rk.batch = kvevents.Batch{TS: float64(time.Now().UnixNano()) / 1e9, DPRank: rk.idx, HasDPRank: true, Events: events}
	if _, err := rk.pub.Publish(&rk.batch); err != nil {
		rk.log.Debug("publish kv events", "err", err)
	}
	rk.batch.Events = nil
}

var _ engine.EventSink = (*rank)(nil)

// wallNow is the present in engine time.
func (rk *rank) wallNow() time.Duration {
	return time.Duration(float64(time.Since(rk.start)) * rk.s.cfg.TimeScale)
}

// arrivalTime stamps a new request (under mu): never later than the next
// step's start, so queue times are never negative.
func (rk *rank) arrivalTime() time.Duration {
	now := rk.wallNow()
	if rk.busy && now > rk.vt {
		return rk.vt
	}
	return max(now, rk.vt)
}

func (rk *rank) load() engine.Load {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	return rk.eng.Load()
}

// submit queues one engine request.
func (rk *rank) submit(c *call) error {
	rk.mu.Lock()
	if l := rk.eng.Load(); l.Waiting >= rk.s.cfg.MaxWaiting {
		rk.mu.Unlock()
		return errOverloaded
	}
	if err := rk.eng.Add(c.req, rk.arrivalTime()); err != nil {
		rk.mu.Unlock()
		return err
	}
	rk.calls[c.req] = c
	rk.mu.Unlock()
	select {
	case rk.wake <- struct{}{}:
	default:
	}
	return nil
}

// abort cancels a call whose client went away.
func (rk *rank) abort(c *call) {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	if c.done {
		return
	}
	if c.req.Done() {
		// The engine finished it in the step the driver has not delivered
		// yet (it sleeps the step's wall time between Step and deliver):
		// the client left too late to abort anything. Finish it as deliver
		// would, which deliver no longer can once the call is gone: a
		// prefill leg holding its blocks registers its hold, as vLLM holds
		// a finished do_remote_decode request's blocks whatever the client
		// does, so the abort timeout frees them (and counts them expired).
		// Dropped here, they stayed held for good with no hold to read or
		// expire.
		rk.deliverTokens(c.req, c)
		rk.finish(c.req, c)
		return
	}
	rk.eng.Abort(c.req.ID, rk.arrivalTime())
	delete(rk.calls, c.req)
	c.done, c.aborted = true, true
}

// hold stops (on) or resumes the driver between steps. Tests use it to queue
// a burst that is certain to overlap, whatever the host's speed.
func (rk *rank) hold(on bool) {
	rk.mu.Lock()
	rk.held = on
	rk.mu.Unlock()
	select {
	case rk.wake <- struct{}{}:
	default:
	}
}

// run drives the engine until ctx is done. It owns the timer and never holds
// mu while sleeping.
func (rk *rank) run(ctx context.Context) {
	defer close(rk.done)
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	for {
		rk.mu.Lock()
		for rk.eng.Idle() || rk.held {
			rk.busy = false
			rk.mu.Unlock()
			select {
			case <-rk.wake:
			case <-ctx.Done():
				return
			}
			rk.mu.Lock()
		}
		start := rk.vt
		if !rk.busy {
			start = max(rk.vt, rk.wallNow())
		}
		res := rk.eng.Step(start, start)
		if res.Steps == 0 {
			// Nothing schedulable (cannot happen with validated requests):
			// wait for a change instead of spinning.
			rk.busy = false
			rk.mu.Unlock()
			select {
			case <-rk.wake:
			case <-ctx.Done():
				return
			}
			continue
		}
		rk.busy, rk.vt = true, res.End
		rk.fin = append(rk.fin[:0], res.Finished...)
		onStep := rk.onStep
		rk.mu.Unlock()
		if onStep != nil {
			onStep(len(res.Finished))
		}

		if d := time.Until(rk.start.Add(rk.s.cfg.wallFor(res.End))); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				return
			}
		}
		rk.deliver()
	}
}

// deliver makes the step's tokens visible to their clients.
func (rk *rank) deliver() {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	for r, c := range rk.calls {
		rk.deliverTokens(r, c)
	}
	for _, r := range rk.fin {
		if c, ok := rk.calls[r]; ok {
			rk.finish(r, c)
		}
	}
	clear(rk.fin)
	rk.fin = rk.fin[:0]
}

// deliverTokens makes r's new tokens visible to call c (under mu).
func (rk *rank) deliverTokens(r *engine.Request, c *call) {
	if g := r.Generated(); g != c.generated {
		// vLLM observes every token's gap from the one before as it is
		// sampled (IterationStats), not when the request finishes.
		for i := max(1, c.generated); i < g; i++ {
			rk.itl.Observe((r.TokenTime(i) - r.TokenTime(i-1)).Seconds())
		}
		c.generated = g
		signal(c.notify)
	}
}

// finish ends call c of finished request r (under mu): its result, the
// hold of a prefill leg that keeps its blocks, the metrics.
func (rk *rank) finish(r *engine.Request, c *call) {
	delete(rk.calls, r)
	c.done, c.result = true, r.Result()
	if r.HoldBlocks && rk.s.pd != nil {
		rk.s.pd.onFinished(rk, c)
	}
	rk.s.metrics.observe(rk.s.cfg.Model, rk.idx, c.result, c.finishReason())
	signal(c.notify)
}

// restart replaces the engine with an empty one and restarts the event
// sequence at 0, as an engine process restart would; calls in flight end
// as aborted.
func (rk *rank) restart() error {
	rk.mu.Lock()
	defer rk.mu.Unlock()
	for r, c := range rk.calls {
		c.done, c.aborted = true, true
		delete(rk.calls, r)
		signal(c.notify)
	}
	if rk.s.pd != nil {
		rk.s.pd.dropRank(rk)
	}
	if err := rk.newEngine(); err != nil {
		return err
	}
	rk.busy = false
	if rk.pub != nil {
		rk.pub.Restart()
	}
	return nil
}

func (c *call) finishReason() string {
	if c.aborted {
		return "abort"
	}
	if c.cut.tokens > 0 && c.result.OutputTokens >= c.cut.tokens {
		return "stop" // the stop string, even on the last token max_tokens allows
	}
	if c.result.OutputTokens >= c.maxOut {
		return "length"
	}
	return "stop"
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// keyer gives the engine kvmesh keys (DESIGN.md Contract 1) for CachedKeys.
type keyer struct{ model string }

var _ engine.BlockKeyer = keyer{}

func (k keyer) Root(lora, salt string) uint64 { return kvevents.Root(k.model, lora, salt) }
func (k keyer) Chain(parent uint64, block []uint32) uint64 {
	return kvevents.ChainKey(parent, block)
}

// outputLen decides how many tokens a request generates: max_tokens with
// ignore_eos or EOSRate 0; otherwise min_tokens plus a geometric number of
// tokens (a seeded stand-in for sampling EOS), capped at max_tokens.
func outputLen(cfg *Config, prompt []uint32, sample, maxTokens, minTokens int, ignoreEOS bool) int {
	if ignoreEOS || cfg.EOSRate == 0 {
		return maxTokens
	}
	buf := make([]byte, 0, 4*len(prompt))
	for _, t := range prompt {
		buf = binary.LittleEndian.AppendUint32(buf, t)
	}
	h := xxh3.HashSeed(buf, cfg.Seed^0x656f73^uint64(sample)*0x9e3779b97f4a7c15) // "eos"; each sample its own length
	u := (float64(h>>11) + 0.5) / (1 << 53)
	extra := int(math.Floor(math.Log(u) / math.Log1p(-cfg.EOSRate)))
	return max(1, min(maxTokens, minTokens+extra+1))
}
