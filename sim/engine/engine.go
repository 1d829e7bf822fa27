package engine

import (
	"fmt"
	"strconv"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// EventSink receives the KV events of one engine step, in order, at engine
// time now (the step's start, when vLLM publishes them). It is called
// synchronously from Step and ResetPrefixCache, never concurrently; it must
// not retain events or any slice inside them after returning (copy or encode
// them), and must not call back into the Engine.
type EventSink interface {
	KVEvents(now time.Duration, events []kvevents.Event)
}

// Load is the state a router sees (vLLM's /metrics, gossip load).
type Load struct {
	Running             int
	Waiting             int
	KVUsage             float64 // used GPU blocks / capacity (cached free blocks count as free)
	UsedBlocks          int     // GPU blocks referenced by requests
	CachedBlocks        int     // GPU blocks holding a prefix-cache hash (used or free)
	CPUBlocks           int     // blocks in the CPU tier
	QueuedPrefillTokens int     // prompt tokens still to compute (waiting + partial prefills)
	PrefixQueries       uint64  // prompt tokens looked up in the prefix cache
	PrefixHits          uint64  // of those, found in the GPU cache
	CPUPrefixHits       uint64  // of those, found in the CPU tier
	Preemptions         uint64
	PromptTokens        uint64 // prompt tokens of admitted requests
	GenerationTokens    uint64 // output tokens produced
	HeldRequests        int    // finished HoldBlocks requests whose blocks are not released yet
	HeldBlocks          int    // blocks those requests hold
	RemoteTokens        uint64 // prompt tokens whose KV was read from a remote prefill (ExternalTokens)
	Finished            uint64 // requests completed (not aborted)
	Steps               uint64 // engine steps executed
}

// Engine is one simulated engine (one DP rank). See the package doc.
type Engine struct {
	cfg  Config
	bs   int
	none uint64
	pool *pool
	cpu  *cpuTier // nil without a CPU tier
	sink EventSink

	waiting waitQueue
	running []*Request
	active  map[string]*Request
	held    map[*Request]struct{} // finished HoldBlocks requests still holding blocks
	nextID  uint64

	load          Load
	queuedPrefill int

	// Per-step scratch, reused so steps allocate nothing.
	sched    []scheduled
	finished []*Request
	events   []kvevents.Event
	hashBuf  []uint64
	tokBuf   []uint32
	extraBuf []byte // extra_keys of the step's BlockStored events
	hitBuf   []int32
	byteBuf  []byte
	blockBuf []uint32
	stepDur  []time.Duration
	phase    [][]*Request
}

type scheduled struct {
	r *Request
	n int
}

// New returns an engine. sink may be nil (events are then not built at all).
func New(cfg Config, sink EventSink) (*Engine, error) {
	cfg = cfg.Defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	e := &Engine{
		cfg: cfg, bs: cfg.BlockSize, none: noneHash(cfg.HashSeed), sink: sink,
		pool:   newPool(cfg.GPUBlocks, cfg.BlockSize, cfg.KeepBlockTokens, cfg.Keyer != nil),
		active: make(map[string]*Request), held: make(map[*Request]struct{}),
	}
	if cfg.CPUBlocks > 0 {
		e.cpu = newCPUTier(cfg.CPUBlocks, cfg.BlockSize, cfg.KeepBlockTokens, cfg.Keyer != nil)
	}
	e.byteBuf = make([]byte, 4*max(cfg.BlockSize, 256))
	e.blockBuf = make([]uint32, cfg.BlockSize)
	e.phase = make([][]*Request, cfg.BlockSize)
	return e, nil
}

// Config returns the engine's configuration (with defaults applied).
func (e *Engine) Config() Config { return e.cfg }

// Add queues r at engine time now. It fails on an empty prompt, OutputLen < 1,
// a duplicate active ID or a request that can never fit in the cache.
func (e *Engine) Add(r *Request, now time.Duration) error {
	switch {
	case r == nil || len(r.Prompt) == 0:
		return fmt.Errorf("add: %w: empty prompt", ErrBadRequest)
	case r.OutputLen < 1:
		return fmt.Errorf("add: %w: output length %d < 1", ErrBadRequest, r.OutputLen)
	case r.state != stateNew:
		return fmt.Errorf("add: %w: request already added", ErrBadRequest)
	case len(r.Prompt)+r.OutputLen > e.cfg.MaxModelLen:
		return fmt.Errorf("add: %w: %d+%d tokens > max model len %d", ErrTooLong, len(r.Prompt), r.OutputLen, e.cfg.MaxModelLen)
	case r.ExternalTokens < 0 || r.ExternalTokens > len(r.Prompt):
		return fmt.Errorf("add: %w: external tokens %d outside [0, %d]", ErrBadRequest, r.ExternalTokens, len(r.Prompt))
	case (len(r.Prompt)+r.OutputLen+e.bs-1)/e.bs > e.cfg.GPUBlocks:
		return fmt.Errorf("add: %w: needs more than %d blocks", ErrTooLong, e.cfg.GPUBlocks)
	}
	if r.ID == "" {
		e.nextID++
		r.ID = "req-" + strconv.FormatUint(e.nextID, 10)
	}
	if _, dup := e.active[r.ID]; dup {
		return fmt.Errorf("add: %w: %q", ErrDuplicateID, r.ID)
	}
	e.active[r.ID] = r
	r.arrival = now
	r.root = rootFor(e.none, r.LoraName, r.CacheSalt)
	r.outSeed = promptSeed(r.Prompt, e.cfg.HashSeed, e.byteBuf)
	if r.Sample != 0 {
		r.outSeed = sampleSeed(r.outSeed, r.Sample)
	}
	nb := (len(r.Prompt) + r.OutputLen + e.bs - 1) / e.bs
	if cap(r.blocks) < nb {
		r.blocks = make([]int32, 0, nb)
	}
	if cap(r.hashes) < nb {
		r.hashes = make([]uint64, 0, nb)
	}
	if e.cfg.Keyer != nil && cap(r.keys) < nb {
		r.keys = make([]uint64, 0, nb)
	}
	r.numTokens = len(r.Prompt)
	r.prefillEnd = r.numTokens
	r.state = stateWaiting
	e.waiting.pushBack(r)
	e.queuedPrefill += r.numTokens
	return nil
}

// Abort removes an active request (client went away), freeing its blocks.
// It returns false when no active request has that id.
func (e *Engine) Abort(id string, now time.Duration) bool {
	r, ok := e.active[id]
	if !ok {
		return false
	}
	switch r.state {
	case stateWaiting:
		e.waiting.remove(r)
	case stateRunning:
		for i, x := range e.running {
			if x == r {
				e.running = append(e.running[:i], e.running[i+1:]...)
				break
			}
		}
	}
	if r.computed < r.prefillEnd {
		e.queuedPrefill -= r.prefillEnd - r.computed
	}
	e.freeBlocks(r)
	r.aborted = true
	r.state = stateDone
	r.finished = now
	delete(e.active, id)
	return true
}

// Idle reports whether no request is waiting or running.
func (e *Engine) Idle() bool { return len(e.running) == 0 && e.waiting.len() == 0 }

// Load returns the current load counters. It costs O(1).
func (e *Engine) Load() Load {
	l := e.load
	l.Running = len(e.running)
	l.Waiting = e.waiting.len()
	l.UsedBlocks = e.pool.n - e.pool.numFree
	l.KVUsage = float64(l.UsedBlocks) / float64(e.pool.n)
	l.CachedBlocks = e.pool.numHashed
	if e.cpu != nil {
		l.CPUBlocks = e.cpu.used
	}
	l.QueuedPrefillTokens = e.queuedPrefill
	return l
}

// PreemptAll preempts every running request (they keep their place, ahead
// of the waiting queue, and recompute later), freeing all blocks — what
// vLLM's reset_prefix_cache(reset_running_requests=True) does first.
func (e *Engine) PreemptAll() {
	for i := len(e.running) - 1; i >= 0; i-- {
		e.preempt(e.running[i])
	}
	clear(e.running)
	e.running = e.running[:0]
}

// ResetPrefixCache drops every cached block of both tiers and emits
// AllBlocksCleared, as vLLM's reset_prefix_cache(). Like vLLM it refuses
// (ErrBusy) while requests hold blocks.
func (e *Engine) ResetPrefixCache(now time.Duration) error {
	if e.pool.numFree != e.pool.n {
		return fmt.Errorf("reset prefix cache: %w: %d requests running", ErrBusy, len(e.running))
	}
	for b := int32(0); int(b) < e.pool.n; b++ {
		if e.pool.hashed[b] {
			e.pool.unhash(b)
		}
	}
	if e.cpu != nil {
		e.cpu.clear()
	}
	e.resetEvents()
	e.events = append(e.events, kvevents.Event{Kind: kvevents.AllBlocksCleared})
	e.flushEvents(now)
	return nil
}

// CachedBlock is one block in the engine's prefix cache.
type CachedBlock struct {
	Hash      uint64
	Key       uint64 // Config.Keyer's key of the block, 0 without a keyer
	Parent    uint64 // hash of the previous block of the chain
	HasParent bool   // false for a chain's first block
	// Tokens, LoraName and CacheSalt are set only with Config.KeepBlockTokens.
	Tokens    []uint32
	LoraName  string
	CacheSalt string
}

// CachedBlocks returns the engine's own prefix cache in one tier (GPU or CPU),
// one entry per distinct hash, in no particular order. It is the ground truth
// a router's index is compared with. Tokens are copies.
func (e *Engine) CachedBlocks(tier kvevents.Tier) []CachedBlock {
	var out []CachedBlock
	switch tier {
	case kvevents.TierGPU:
		p := e.pool
		for h, b := range p.byHash {
			cb := CachedBlock{Hash: h}
			if p.key != nil {
				cb.Key = p.key[b]
			}
			if p.keep {
				cb.Parent, cb.HasParent = p.parent[b], p.hasParent[b]
				cb.Tokens = append([]uint32(nil), p.blockTokens(b)...)
				cb.LoraName, cb.CacheSalt = p.extra[b].lora, p.extra[b].salt
			}
			out = append(out, cb)
		}
	case kvevents.TierCPU:
		if e.cpu == nil {
			return nil
		}
		c := e.cpu
		for h, i := range c.slot {
			cb := CachedBlock{Hash: h}
			if c.key != nil {
				cb.Key = c.key[i]
			}
			if c.keep {
				cb.Parent, cb.HasParent = c.parent[i], c.hasParent[i]
				cb.Tokens = append([]uint32(nil), c.toks[int(i)*c.bs:int(i+1)*c.bs]...)
				cb.LoraName, cb.CacheSalt = c.extra[i].lora, c.extra[i].salt
			}
			out = append(out, cb)
		}
	}
	return out
}
