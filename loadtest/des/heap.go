package des

import "time"

// evKind is what a scheduled simulation event does.
type evKind uint8

const (
	evArrival  evKind = iota // a workload request arrives at the client
	evStep                   // an engine's next step is due
	evSnapshot               // the router refreshes its load view
	evRelease                // a finished request frees a client concurrency slot
	evFollow                 // a closed-loop follow-up arrives (follow.go)
)

type event struct {
	at   time.Duration
	seq  uint64 // FIFO among equal times: determinism
	kind evKind
	arg  int
}

// eventHeap is a binary min-heap on (at, seq); hand-written so pushes and
// pops do not box through container/heap's interface.
type eventHeap struct {
	ev  []event
	seq uint64
}

func (h *eventHeap) len() int { return len(h.ev) }

func (h *eventHeap) less(i, j int) bool {
	a, b := &h.ev[i], &h.ev[j]
	return a.at < b.at || (a.at == b.at && a.seq < b.seq)
}

func (h *eventHeap) push(at time.Duration, kind evKind, arg int) {
	h.seq++
	h.ev = append(h.ev, event{at: at, seq: h.seq, kind: kind, arg: arg})
	i := len(h.ev) - 1
	for i > 0 {
		p := (i - 1) / 2
		if !h.less(i, p) {
			break
		}
		h.ev[i], h.ev[p] = h.ev[p], h.ev[i]
		i = p
	}
}

func (h *eventHeap) peek() (time.Duration, bool) {
	if len(h.ev) == 0 {
		return 0, false
	}
	return h.ev[0].at, true
}

func (h *eventHeap) pop() event {
	top := h.ev[0]
	n := len(h.ev) - 1
	h.ev[0] = h.ev[n]
	h.ev = h.ev[:n]
	i := 0
	for {
		l, r, m := 2*i+1, 2*i+2, i
		if l < n && h.less(l, m) {
			m = l
		}
		if r < n && h.less(r, m) {
			m = r
		}
		if m == i {
			break
		}
		h.ev[i], h.ev[m] = h.ev[m], h.ev[i]
		i = m
	}
	return top
}
