package ingress

import (
	"cmp"
	"encoding/json"
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// The SLO summary: every ingress replica measures the TTFT and TPOT its
// clients see per engine and gossips a compact summary (p90 over the last
// window and the sample count, plus the prompt tokens sent) as an App entry
// under SLOStateName. The orchestrator merges the replicas' summaries per
// role, weighted by count, as the SLO mode's live input (docs/ORCHESTRATOR.md,
// "SLO inputs from the mesh").
//
// Hot path: Observe finds the engine's preallocated histograms through an
// atomic pointer to a copy-on-write map and adds to atomic counters; it
// allocates only the first time an engine is seen.

// SLOStateName is the gossip app-state key of the summary.
const SLOStateName = "kvmesh.slo.v1"

// SLOSummary is one ingress's summary, JSON in a gossip App entry.
type SLOSummary struct {
	Version int `json:"v"` // 1
	// WindowSeconds is the time the counts cover.
	WindowSeconds float64     `json:"w"`
	Engines       []SLOEngine `json:"e"`
}

// SLOEngine is one engine's latencies seen by one ingress over the window.
// TTFT is charged to the engine that prefilled (the prefill engine of a P/D
// request), TPOT to the engine that decoded.
type SLOEngine struct {
	ID    string  `json:"id"`
	TTFT  float64 `json:"t,omitempty"`  // p90 seconds
	TTFTN uint64  `json:"tn,omitempty"` // requests
	TPOT  float64 `json:"p,omitempty"`  // p90 seconds per output token after the first
	TPOTN uint64  `json:"pn,omitempty"` // requests with two or more output tokens
	// PromptTokens prefilled on this engine over the window.
	PromptTokens uint64 `json:"pt,omitempty"`
}

// SLOConfig tunes the recorder. Start from DefaultSLOConfig.
type SLOConfig struct {
	// Interval between summaries (5 s); the window is Windows intervals.
	Interval time.Duration
	// Windows intervals make the window (6: 30 s).
	Windows int
	// MaxEngines bounds the engines tracked (1024); more are not recorded.
	MaxEngines int
	// MaxBlob bounds the encoded summary (3 KiB, under gossip's 4 KiB); when
	// it does not fit, the engines busiest by latency samples or by prompt
	// tokens are kept (rank).
	MaxBlob int
}

// DefaultSLOConfig: a 30 s window refreshed every 5 s.
func DefaultSLOConfig() SLOConfig {
	return SLOConfig{Interval: 5 * time.Second, Windows: 6, MaxEngines: 1024, MaxBlob: 3 << 10}
}

// Latency histogram: bucket 0 holds < sloBase, bucket i ≥ 1 holds
// [sloBase·f^(i-1), sloBase·f^i); the last one is open. 100 µs to ~130 s at
// 25 % resolution.
const (
	sloBuckets = 64
	sloBase    = 100e-6
	sloFactor  = 1.25
)

var sloLogFactor = math.Log(sloFactor)

func sloBucket(sec float64) int {
	if !(sec >= sloBase) {
		return 0
	}
	f := math.Log(sec/sloBase) / sloLogFactor
	if f >= sloBuckets-2 { // also +Inf
		return sloBuckets - 1
	}
	return int(f) + 1
}

// sloUpper is bucket i's upper bound in seconds.
func sloUpper(i int) float64 { return sloBase * math.Pow(sloFactor, float64(i)) }

type sloHist [sloBuckets]uint64

// quantile interpolates linearly within the bucket holding rank q·n.
func (h *sloHist) quantile(q float64) (float64, uint64) {
	var n uint64
	for _, c := range h {
		n += c
	}
	if n == 0 {
		return 0, 0
	}
	rank := q * float64(n)
	var cum float64
	for i, c := range h {
		if c == 0 {
			continue
		}
		if cum+float64(c) >= rank {
			lo := 0.0
			if i > 0 {
				lo = sloUpper(i - 1)
			}
			return lo + (sloUpper(i)-lo)*(rank-cum)/float64(c), n
		}
		cum += float64(c)
	}
	return sloUpper(sloBuckets - 1), n
}

// sloEngine is one engine's live counters and, owned by Tick's caller, its
// ring of past intervals.
type sloEngine struct {
	ttft, tpot [sloBuckets]atomic.Uint64
	prompt     atomic.Uint64

	ring       []sloInterval // Tick only
	idleWindow int           // Tick only: intervals without a sample
}

type sloInterval struct {
	ttft, tpot sloHist
	prompt     uint64
}

// SLOCarrier is the part of gossip the recorder publishes through;
// *gossip.Node satisfies it.
type SLOCarrier interface {
	SetAppState(name string, blob []byte) error
}

// SLORecorder records per-engine TTFT/TPOT and publishes the summary. Observe
// is safe from any goroutine; Tick is called by one goroutine.
type SLORecorder struct {
	cfg     SLOConfig
	engines atomic.Pointer[map[string]*sloEngine] // copy-on-write
	mu      sync.Mutex                            // serialises writers of engines
	dropped atomic.Uint64                         // observations of engines over MaxEngines

	// Tick's state.
	slot    int
	last    time.Time
	filled  int
	buf     []byte
	scratch []SLOEngine
	keyed   []rankedSLO
}

// NewSLORecorder returns a recorder; zero config fields take the defaults.
func NewSLORecorder(cfg SLOConfig) *SLORecorder {
	d := DefaultSLOConfig()
	if cfg.Interval <= 0 {
		cfg.Interval = d.Interval
	}
	if cfg.Windows <= 0 {
		cfg.Windows = d.Windows
	}
	if cfg.MaxEngines <= 0 {
		cfg.MaxEngines = d.MaxEngines
	}
	if cfg.MaxBlob <= 0 || cfg.MaxBlob > 4<<10 {
		cfg.MaxBlob = d.MaxBlob
	}
	r := &SLORecorder{cfg: cfg}
	m := map[string]*sloEngine{}
	r.engines.Store(&m)
	return r
}

// Observe records one request: ttft on the engine that prefilled, tpot
// (0: unknown) on the engine that decoded, prompt tokens on the prefill one.
func (r *SLORecorder) Observe(prefillEngine, decodeEngine string, ttft, tpot time.Duration, promptTokens int) {
	if e := r.engine(prefillEngine); e != nil {
		if ttft > 0 {
			e.ttft[sloBucket(ttft.Seconds())].Add(1)
		}
		if promptTokens > 0 {
			e.prompt.Add(uint64(promptTokens))
		}
	}
	if tpot > 0 {
		if e := r.engine(decodeEngine); e != nil {
			e.tpot[sloBucket(tpot.Seconds())].Add(1)
		}
	}
}

func (r *SLORecorder) engine(id string) *sloEngine {
	if id == "" {
		return nil
	}
	if e := (*r.engines.Load())[id]; e != nil {
		return e
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.engines.Load()
	if e := old[id]; e != nil {
		return e
	}
	if len(old) >= r.cfg.MaxEngines {
		r.dropped.Add(1)
		return nil
	}
	m := make(map[string]*sloEngine, len(old)+1)
	for k, v := range old {
		m[k] = v
	}
	e := &sloEngine{ring: make([]sloInterval, r.cfg.Windows)}
	m[id] = e
	r.engines.Store(&m)
	return e
}

// observeCall records a finished request (the hook in finish): a streamed
// one's TTFT, TPOT (the time after the first token over the tokens after
// it) and prompt tokens; a non-streamed answer's prompt tokens only, since
// it has no first-token time of its own but its prompt was prefilled all
// the same (the SLO mode sizes prefill from the prompt tokens/s: without
// them a non-streamed load read as none, tester h-orchagg F3).
func (r *SLORecorder) observeCall(c *call, total time.Duration) {
	prefill := c.pd.prefill
	if prefill == "" {
		prefill = c.engine
	}
	if !c.req.stream {
		if c.status == 200 {
			r.Observe(prefill, c.engine, 0, 0, c.promptTokens)
		}
		return
	}
	if c.ttft <= 0 {
		return
	}
	var tpot time.Duration
	if c.outTokens > 1 && total > c.ttft {
		tpot = (total - c.ttft) / time.Duration(c.outTokens-1)
	}
	r.Observe(prefill, c.engine, c.ttft, tpot, c.promptTokens)
}

// Tick publishes a summary when an interval has passed since the last one.
func (r *SLORecorder) Tick(now time.Time, c SLOCarrier) error {
	if !r.last.IsZero() && now.Sub(r.last) < r.cfg.Interval {
		return nil
	}
	r.last = now
	return c.SetAppState(SLOStateName, r.Summary())
}

// Summary closes the current interval and encodes the window's summary:
// engines by sample count, as many as fit in MaxBlob. Called by one
// goroutine (Tick's).
func (r *SLORecorder) Summary() []byte {
	r.filled = min(r.filled+1, r.cfg.Windows)
	slot := r.slot
	r.slot = (r.slot + 1) % r.cfg.Windows
	out := r.scratch[:0]
	var idle []string
	for id, e := range *r.engines.Load() {
		iv := &e.ring[slot]
		seen := false
		for i := range iv.ttft {
			iv.ttft[i] = e.ttft[i].Swap(0)
			iv.tpot[i] = e.tpot[i].Swap(0)
			seen = seen || iv.ttft[i] != 0 || iv.tpot[i] != 0
		}
		iv.prompt = e.prompt.Swap(0)
		if seen || iv.prompt != 0 {
			e.idleWindow = 0
		} else if e.idleWindow++; e.idleWindow >= 2*r.cfg.Windows {
			idle = append(idle, id)
		}
		var tt, tp sloHist
		se := SLOEngine{ID: id}
		for j := range e.ring {
			for i := range tt {
				tt[i] += e.ring[j].ttft[i]
				tp[i] += e.ring[j].tpot[i]
			}
			se.PromptTokens += e.ring[j].prompt
		}
		se.TTFT, se.TTFTN = tt.quantile(0.9)
		se.TPOT, se.TPOTN = tp.quantile(0.9)
		if se.TTFTN+se.TPOTN+se.PromptTokens > 0 {
			out = append(out, se)
		}
	}
	r.forget(idle)
	out = r.rank(out)
	r.scratch = out
	r.buf = r.encode(r.buf[:0], out)
	return r.buf
}

// rank orders es for a summary cut to MaxBlob: the busiest engines by
// either measure first, so the engines with the most latency samples and
// those with the most prompt tokens are kept alike. By samples alone a
// prefill engine that served only non-streamed requests (prompt tokens, no
// TTFT or TPOT sample) sorted last and was the first left out, and its load
// read as none to the SLO mode's prefill sizing. An engine's key is the
// better of its two ranks; ties go by ID.
func (r *SLORecorder) rank(es []SLOEngine) []SLOEngine {
	keyed := r.keyed[:0]
	for _, e := range es {
		keyed = append(keyed, rankedSLO{SLOEngine: e, key: math.MaxInt})
	}
	rankBy := func(n func(*SLOEngine) uint64) {
		slices.SortFunc(keyed, func(a, b rankedSLO) int {
			if c := cmp.Compare(n(&b.SLOEngine), n(&a.SLOEngine)); c != 0 {
				return c
			}
			return cmp.Compare(a.ID, b.ID)
		})
		for i := range keyed {
			if n(&keyed[i].SLOEngine) > 0 {
				keyed[i].key = min(keyed[i].key, i)
			}
		}
	}
	rankBy(func(e *SLOEngine) uint64 { return e.TTFTN + e.TPOTN })
	rankBy(func(e *SLOEngine) uint64 { return e.PromptTokens })
	slices.SortFunc(keyed, func(a, b rankedSLO) int {
		if c := cmp.Compare(a.key, b.key); c != 0 {
			return c
		}
		return cmp.Compare(a.ID, b.ID)
	})
	es = es[:0]
	for _, k := range keyed {
		es = append(es, k.SLOEngine)
	}
	r.keyed = keyed
	return es
}

// rankedSLO is an engine with its place in the summary's order.
type rankedSLO struct {
	SLOEngine
	key int
}

// encode writes {"v":1,"w":…,"e":[…]} with as many engines as fit, in
// order; an engine that does not fit is skipped and a smaller one after it
// may still fit.
func (r *SLORecorder) encode(b []byte, es []SLOEngine) []byte {
	w := float64(r.filled) * r.cfg.Interval.Seconds()
	head, _ := json.Marshal(SLOSummary{Version: 1, WindowSeconds: w})
	// head ends with `"e":null}`: replace the null with the array.
	head = head[:len(head)-len("null}")]
	b = append(b, head...)
	b = append(b, '[')
	n := 0
	for i := range es {
		one, err := json.Marshal(&es[i])
		if err != nil || len(b)+len(one)+3 > r.cfg.MaxBlob {
			continue
		}
		if n > 0 {
			b = append(b, ',')
		}
		b = append(b, one...)
		n++
	}
	return append(b, ']', '}')
}

func (r *SLORecorder) forget(ids []string) {
	if len(ids) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	old := *r.engines.Load()
	m := make(map[string]*sloEngine, len(old))
	for k, v := range old {
		m[k] = v
	}
	for _, id := range ids {
		delete(m, id)
	}
	r.engines.Store(&m)
}
