package engine

import (
	"encoding/binary"
	"time"

	"github.com/zeebo/xxh3"
)

// Request is one generation request. The caller fills the exported fields
// before Add and must not change them afterwards; the engine owns the rest.
// Its methods may be called only by the engine's owner (the same goroutine or
// lock that calls Step).
type Request struct {
	ID        string   // unique among active requests; "" = assigned by Add
	Prompt    []uint32 // prompt token ids; not modified
	OutputLen int      // tokens to generate (>= 1); the caller decides EOS
	LoraName  string   // part of the block-hash extra keys (and events' lora_name)
	CacheSalt string   // vLLM cache_salt: isolates this request's prefix cache
	// HoldBlocks keeps the request's blocks referenced after it finishes (a
	// disaggregated prefill leg whose KV the decode engine has yet to read);
	// the owner frees them with Engine.ReleaseHeld. Aborted requests free
	// their blocks as usual.
	HoldBlocks bool
	// ExternalTokens is how many leading prompt tokens' KV arrived from
	// elsewhere (read from a remote prefill engine). At first admission the
	// ones the local cache does not hit count as computed at no compute cost
	// and their full blocks are cached (BlockStored), as vLLM's connector
	// path does. At most len(Prompt)−1 are used: the last prompt token is
	// recomputed to sample the first output token.
	ExternalTokens int
	// Sample numbers one of several sequences sampled from one prompt (an
	// HTTP request's n > 1, which vLLM runs as that many requests): each
	// number draws its own output tokens. 0 draws the prompt's own.
	Sample int

	arrival    time.Duration
	root       uint64 // parent hash of block 0
	outSeed    uint64 // seed of the generated tokens
	numTokens  int    // prompt + generated tokens known
	computed   int    // tokens whose KV is in blocks
	prefillEnd int    // numTokens when (re)entering the waiting queue
	generated  int
	blocks     []int32  // block table
	hashes     []uint64 // hashes of the first len(hashes) full blocks
	keys       []uint64 // Config.Keyer keys of the first len(keys) full blocks
	nCached    int      // leading blocks registered in the prefix cache
	state      reqState
	looked     bool // prefix-cache stats counted

	wasScheduled bool

	scheduled    time.Duration
	firstToken   time.Duration
	lastToken    time.Duration
	finished     time.Duration
	cachedTokens int
	cpuTokens    int
	remoteTokens int  // ExternalTokens used at first admission
	extUsed      bool // ExternalTokens consumed (a preempted request recomputes)
	holding      bool // finished with HoldBlocks; blocks not yet released
	preemptions  int
	aborted      bool
	tokenTimes   []time.Duration
}

type reqState uint8

const (
	stateNew reqState = iota
	stateWaiting
	stateRunning
	stateDone
)

// Result is what a finished (or aborted) request measured, in engine time.
type Result struct {
	ID              string
	PromptTokens    int
	OutputTokens    int
	CachedTokens    int // prompt tokens served from the GPU prefix cache at first schedule
	CPUCachedTokens int // prompt tokens loaded from the CPU tier at first schedule
	RemoteTokens    int // prompt tokens whose KV came from a remote prefill (ExternalTokens used)
	Preemptions     int
	Aborted         bool

	Arrival    time.Duration
	Scheduled  time.Duration // first time the request was scheduled
	FirstToken time.Duration
	Finished   time.Duration

	QueueTime   time.Duration // Scheduled − Arrival
	PrefillTime time.Duration // FirstToken − Scheduled
	TTFT        time.Duration // FirstToken − Arrival
	E2E         time.Duration // Finished − Arrival
	// TokenTimes holds every output token's time when Config.RecordTokenTimes
	// is set, otherwise nil.
	TokenTimes []time.Duration
}

// Generated is the number of output tokens produced so far.
func (r *Request) Generated() int { return r.generated }

// Done reports whether the request finished or was aborted.
func (r *Request) Done() bool { return r.state == stateDone }

// TokenTime is when output token i (0-based, < Generated) was sampled, in
// engine time; zero unless the engine records token times.
func (r *Request) TokenTime(i int) time.Duration {
	if i < 0 || i >= len(r.tokenTimes) {
		return 0
	}
	return r.tokenTimes[i]
}

// OutputToken is the i-th generated token id (0-based); defined for any i.
func (r *Request) OutputToken(i int) uint32 { return fillerToken(r.outSeed, i) }

// OutputTokens appends the generated tokens [from, to) to dst.
func (r *Request) OutputTokens(dst []uint32, from, to int) []uint32 {
	for i := from; i < to; i++ {
		dst = append(dst, fillerToken(r.outSeed, i))
	}
	return dst
}

// CachedTokens is the number of prompt tokens not computed at the request's
// first schedule: prefix-cache hits (GPU plus CPU tier) and KV read from a
// remote prefill (vLLM counts both in num_cached_tokens); 0 before.
func (r *Request) CachedTokens() int { return r.cachedTokens + r.cpuTokens + r.remoteTokens }

// Result returns the request's measurements; fields not reached yet are zero.
func (r *Request) Result() Result {
	res := Result{
		ID: r.ID, PromptTokens: len(r.Prompt), OutputTokens: r.generated,
		CachedTokens: r.cachedTokens, CPUCachedTokens: r.cpuTokens, RemoteTokens: r.remoteTokens,
		Preemptions: r.preemptions, Aborted: r.aborted,
		Arrival: r.arrival, Scheduled: r.scheduled, FirstToken: r.firstToken, Finished: r.finished,
		TokenTimes: r.tokenTimes,
	}
	if r.wasScheduled {
		res.QueueTime = r.scheduled - r.arrival
	}
	if r.generated > 0 {
		res.PrefillTime = r.firstToken - r.scheduled
		res.TTFT = r.firstToken - r.arrival
	}
	if r.state == stateDone {
		res.E2E = r.finished - r.arrival
	}
	return res
}

// appendTokens appends tokens [from, to) of the sequence to dst.
func (r *Request) appendTokens(dst []uint32, from, to int) []uint32 {
	if from < len(r.Prompt) {
		dst = append(dst, r.Prompt[from:min(to, len(r.Prompt))]...)
		from = min(to, len(r.Prompt))
	}
	for i := from; i < to; i++ {
		dst = append(dst, fillerToken(r.outSeed, i-len(r.Prompt)))
	}
	return dst
}

// promptSeed derives the generation seed from the prompt and the engine seed.
func promptSeed(prompt []uint32, seed uint64, buf []byte) uint64 {
	h := seed
	for len(prompt) > 0 {
		n := min(len(prompt), len(buf)/4)
		h = blockHash(h, prompt[:n], buf)
		prompt = prompt[n:]
	}
	return xxh3.HashStringSeed("out", h)
}

// sampleSeed is the output seed of sample k > 0 of a prompt whose own seed
// is seed.
func sampleSeed(seed uint64, k int) uint64 {
	var b [8]byte
	binary.LittleEndian.PutUint64(b[:], uint64(k))
	return xxh3.HashSeed(b[:], seed)
}

// GeneratedTokens appends the first n tokens an engine with config c
// generates for prompt (sample sample), the tokens Request.OutputTokens
// gives once the request is added: generation is a pure function of the
// prompt, so a server can read an answer before it is generated (the
// simulator cuts an output at its first stop string this way).
func (c Config) GeneratedTokens(dst, prompt []uint32, sample, n int) []uint32 {
	c = c.Defaults()
	seed := promptSeed(prompt, c.HashSeed, make([]byte, 4*max(c.BlockSize, 256))) // Engine.byteBuf's size: the seed depends on it
	if sample != 0 {
		seed = sampleSeed(seed, sample)
	}
	for i := range n {
		dst = append(dst, fillerToken(seed, i))
	}
	return dst
}
