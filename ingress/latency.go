package ingress

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvmesh/kvmesh/internal/monotime"
)

// recentLatency is one engine's recent TTFT and TPOT as this replica's
// clients saw them: the means over the streamed requests that finished
// there in the last latencyWindow, kept until a later window has requests
// (an engine that finished none keeps its last value, as a histogram's
// last scrape delta would). The scheduler reads them as
// scheduler.Engine.TTFT and TPOT (the P/D step's streams' TPOT, the Kthena
// and AIBrix emulations' latency scores); the DES gives every router the
// same per-engine means over its 200 ms snapshots (loadtest/des/clock.go,
// scrape), so a policy measured there sees here what it saw there. The
// SLORecorder (slo_gossip.go) sees the same answers but keeps p90s over a
// 30 s window for the autoscaler, and only in cluster mode: too slow and
// too coarse for a per-request price.
//
// Observe runs once per finished request and takes the lock; get runs for
// every candidate of every request and takes it only when a window is due.
type recentLatency struct {
	mu         sync.Mutex
	ttft, tpot time.Duration // sums over the open window (mu)
	n          int64         // requests in the open window (mu)
	opened     atomic.Int64  // monotime reading of when the open window started (0: none yet)
	meanTTFT   atomic.Int64  // ns: the last closed window with requests
	meanTPOT   atomic.Int64
}

// latencyWindow is how long a window stays open: the DES's snapshot
// interval.
const latencyWindow = 200 * time.Millisecond

// observe records one finished request (tpot 0: one output token, none).
func (l *recentLatency) observe(ttft, tpot time.Duration) {
	if ttft <= 0 || tpot <= 0 {
		return // the DES counts requests with two or more output tokens only
	}
	l.mu.Lock()
	l.ttft += ttft
	l.tpot += tpot
	l.n++
	l.mu.Unlock()
}

// get returns the means at now, closing the open window when it is due.
// The window is timed on the monotonic clock (now from time.Now): on the
// wall clock, a step back would keep it open, and the means frozen, for
// the size of the step.
func (l *recentLatency) get(now time.Time) (ttft, tpot time.Duration) {
	t := monotime.Of(now)
	if o := l.opened.Load(); (o == 0 || t-o >= int64(latencyWindow)) && l.opened.CompareAndSwap(o, t) {
		l.mu.Lock()
		if l.n > 0 {
			l.meanTTFT.Store(int64(l.ttft) / l.n)
			l.meanTPOT.Store(int64(l.tpot) / l.n)
		}
		l.ttft, l.tpot, l.n = 0, 0, 0
		l.mu.Unlock()
	}
	return time.Duration(l.meanTTFT.Load()), time.Duration(l.meanTPOT.Load())
}
