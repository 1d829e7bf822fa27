package pd

import (
	"sync"
	"time"
)

// stallLedger is the router's own record of the local prefills it sent to
// each engine that decodes: when and how many seconds of prefill each added
// to the engine's steps. Every stream running there waits through them (a
// prefill chunk lengthens the step all of them share), so the prefill
// seconds sent to an engine over one stream lifetime, spread over the
// stream's output tokens, is what they add to its TPOT. No engine exports
// this (vLLM's TPOT histogram shows it a lifetime late); the router knows
// it because it made the decisions, as it knows its in-flight prefill
// tokens. Safe for concurrent use.
type stallLedger struct {
	mu sync.Mutex
	m  map[string]*stallRing
}

// ledgerSize bounds the records kept per engine: older ones are dropped
// (a stream lifetime rarely spans more local prefills than this).
const ledgerSize = 256

type stallRing struct {
	at   [ledgerSize]time.Time
	sec  [ledgerSize]float64
	next int
	n    int
}

func newStallLedger() *stallLedger { return &stallLedger{m: make(map[string]*stallRing)} }

// add records sec seconds of prefill sent to engine at now.
func (l *stallLedger) add(engine string, now time.Time, sec float64) {
	if l == nil || !(sec > 0) {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.m[engine]
	if !ok {
		r = &stallRing{}
		l.m[engine] = r
	}
	r.at[r.next], r.sec[r.next] = now, sec
	r.next = (r.next + 1) % ledgerSize
	r.n = min(r.n+1, ledgerSize)
}

// forget drops engine's records (the engine left the cluster).
func (l *stallLedger) forget(engine string) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.m, engine)
}

// engines is how many engines have records.
func (l *stallLedger) engines() int {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.m)
}

// since sums the prefill seconds sent to engine after from.
func (l *stallLedger) since(engine string, from time.Time) float64 {
	if l == nil {
		return 0
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	r, ok := l.m[engine]
	if !ok {
		return 0
	}
	sum := 0.0
	for i := 0; i < r.n; i++ {
		j := (r.next - 1 - i + ledgerSize) % ledgerSize
		if !r.at[j].After(from) {
			break
		}
		sum += r.sec[j]
	}
	return sum
}
