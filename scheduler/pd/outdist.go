package pd

import (
	"math"
	"sync"
)

// OutputDist is the distribution of the output lengths of the streams an
// engine runs, as the router observes finished requests (log-spaced
// buckets, forgetting over about 500 requests like learn.OutputLength).
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
	w  [distBuckets]float64 // seconds at the engine per length bucket, forgetting
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
func NewOutputDist() *OutputDist { return &OutputDist{} }

// Observe records a finished request's output length n and its time at
// the engine in seconds (from its sending to its last token; a time ≤ 0
// counts as 1 ms).
func (d *OutputDist) Observe(n int, seconds float64) {
	if d == nil || n < 1 {
		return
	}
	seconds = max(seconds, 1e-3)
	b := min(distBuckets-1, int(math.Round(2*math.Log2(float64(n)))))
	d.mu.Lock()
	defer d.mu.Unlock()
	keep := 1 - 1.0/distMemory
	for i := range d.w {
		d.w[i] *= keep
	}
	d.w[b] += seconds
}

// Weight is the seconds at the engine of the requests observed, with the
// forgetting applied.
func (d *OutputDist) Weight() float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum float64
	for _, w := range d.w {
		sum += w
	}
	return sum
}

// pMissStall is the chance a running stream with TPOT now misses the
// objective slo after stall seconds are added to one of its steps, over
// the observed output lengths; ok false before any was observed.
func (d *OutputDist) pMissStall(now, stall, slo float64) (p float64, ok bool) {
	if d == nil || slo <= 0 {
		return 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	var sum float64
	for b, w := range d.w {
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
