package pd

import (
	"math"
	"sync"
)

// OutputDist is the distribution of the output lengths of the streams an
// engine runs, per model, as the router observes finished requests
// (log-spaced buckets, forgetting over about 500 requests like
// learn.OutputLength).
// KVMesh uses it, when set, to price a running stream's TPOT risk from a
// prefill stall over the output lengths streams actually have instead of
// at their mean: a stall of s seconds adds s ÷ (n − 1) to the TPOT of a
// stream of n tokens, so short streams miss their objective on one prefill
// chunk the mean hides.
//
// A stream found on an engine is not a request drawn at random: each
// request is there for its time at the engine (sent to finished), so a
// request's length counts in proportion to that time (the inspection
// paradox). Counted once each, short requests, which come and go, would
// be taken for a large share of the running streams and every local
// prefill priced as breaking them. Safe for concurrent use.
type OutputDist struct {
	mu sync.Mutex
	m  map[string]*[distBuckets]float64 // per model: seconds at the engine per length bucket, forgetting
}

const (
	distBuckets = 32
	distMemory  = 500
)

// distLen is bucket b's representative output length (2^(b/2)).
var distLen = func() (l [distBuckets]float64) {
	for b := range l {
		l[b] = math.Round(math.Pow(2, float64(b)/2))
	}
	return l
}()

// NewOutputDist returns an empty distribution.
func NewOutputDist() *OutputDist { return &OutputDist{m: map[string]*[distBuckets]float64{}} }

// Observe records a finished request of model: its output length n and its
// time at the engine in seconds (from its sending to its last token; a time
// ≤ 0 counts as 1 ms).
func (d *OutputDist) Observe(model string, n int, seconds float64) {
	if d == nil || n < 1 {
		return
	}
	seconds = max(seconds, 1e-3)
	b := min(distBuckets-1, int(math.Round(2*math.Log2(float64(n)))))
	d.mu.Lock()
	defer d.mu.Unlock()
	w := d.m[model]
	if w == nil {
		w = new([distBuckets]float64)
		d.m[model] = w
	}
	keep := 1 - 1.0/distMemory
	for i := range w {
		w[i] *= keep
	}
	w[b] += seconds
}

// Weight is the seconds at the engine of model's requests observed, with
// the forgetting applied.
func (d *OutputDist) Weight(model string) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum float64
	if w := d.m[model]; w != nil {
		for _, x := range w {
			sum += x
		}
	}
	return sum
}

// pMissStall is the chance a running stream of model with TPOT now misses
// the objective slo after stall seconds are added to one of its steps,
// over the observed output lengths; ok false before any was observed.
func (d *OutputDist) pMissStall(model string, now, stall, slo float64) (p float64, ok bool) {
	if d == nil || slo <= 0 {
		return 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	ws := d.m[model]
	if ws == nil {
		return 0, false
	}
	var sum float64
	for b, w := range ws {
		if w == 0 {
			continue
		}
		sum += w
		p += w * pMiss(now+stall/max(distLen[b]-1, 1), slo)
	}
	if sum == 0 {
		return 0, false
	}
	return p / sum, true
}
