package ratelimit

import (
	"encoding/binary"
	"fmt"
	"slices"
	"time"
)

// The state another replica publishes (through gossip) is its own usage, per scope, for
// its current and previous window:
//
//	version=2 | uvarint window_ms | varint window_index | uvarint n |
//	n × ( scope id: 8 bytes LE | uvarint curr_in | curr_out | prev_in | prev_out |
//	      curr_freed | prev_freed )
//
// out counts the output charged (reservations included) and freed the part of those
// reservations released at the end (Settle): the window's output is out − freed. They
// are sent apart so that, within one window, every counter only grows. Version 1 (no
// freed counters, from replicas that reserve nothing) is still read.
//
// Scope ids are xxh3 hashes of the key or model name, so no name crosses the wire and
// every replica computes the same id. Merge rule: per origin, a newer window replaces
// the older state; within the same window every counter only grows (a G-counter), so
// merging takes the maximum and reordered or duplicated gossip is harmless; a window
// more than one older than the origin's last is its clock stepping back and replaces
// it too. Across origins the counters are summed, each origin's placed in this
// replica's windows within one of where its window index says (placeWindow), so
// clocks that disagree by minutes still share one budget.
const (
	stateVersion   = 2
	maxEntryBytes  = 8 + 6*binary.MaxVarintLen64
	maxStateBytes  = 1 << 20
	DefaultMaxSize = 1024 // a payload that fits in one gossip packet with room to spare
)

// entryValues is how many counters an entry of a state version carries.
func entryValues(version byte) int {
	if version == 1 {
		return 4
	}
	return 6
}

type remoteCounts struct{ curr, prev [3]int64 }

// origin is the latest state received from one other replica. raw is the window
// index the origin sent (its clock); win is where its counts are placed in this
// replica's windows (the running sums): raw, unless the two clocks are more than a
// window apart (placeWindow).
type origin struct {
	win    int64
	raw    int64
	behind int64 // this replica's last window in which a state of the one before arrived after the grace (late)
	scopes map[uint64]remoteCounts
	warned [2]time.Time // last warning about this origin's skew, and its clock stepping back (Config.Now)
}

// placeWindow is where, in this replica's windows (w, now), an origin's state of
// window raw is counted, and whether the clocks are skewed by more than a window.
// An origin's latest state is its usage of its last window or two, whatever its
// clock says: a state ahead is counted a window ahead (usage: both its windows as
// current), a state behind as current (its current window as this one, its previous
// as the previous), so none of it is missed. A window apart is the normal case too
// (a state sent just before a boundary, clocks a fraction of a window apart), not
// skew; further apart only skew explains it. Before, a state was counted only at
// its own window when that was this one or the previous: a replica whose clock was
// a window or more off spent a budget of its own and counted nobody else's, and one
// a fraction behind had its current usage counted as the previous window's, faded.
// What remains is the sliding window's own estimate: an origin whose clock is
// behind by a fraction s of a window has up to s of its previous window's usage
// undercounted (one ahead is overcounted instead).
//
// A state one window behind that arrives within the grace after this replica's
// boundary (late) is, with clocks in sync, the origin's last state of the window
// that just ended, sent before the boundary and still in gossip: merge keeps it at
// its own window (its current usage as this window's previous), unless in this
// replica's previous window the origin was already a window behind past the grace
// (o.behind): then its clock is behind, and it is placed as above. Before, such a
// late state was placed as current for a gossip interval after every boundary, and
// its previous window (the one before the one that just ended) was counted on top.
func placeWindow(raw, w int64) (at int64, skewed bool) {
	switch d := raw - w; {
	case d >= 1:
		return w + 1, d > 1
	case d < 0:
		return w, d < -1
	default:
		return raw, false
	}
}

// remoteSum is, for one scope, the sum of the counts (count: net of released
// output, per origin) of the origins whose latest state is of window win, and
// refs how many origins it sums. The limiter keeps these running sums as states
// arrive (Limiter.remote), so an admission adds the other replicas' usage of a
// scope in a step per window they are at rather than a lookup per origin.
type remoteSum struct {
	win        int64
	refs       int64
	curr, prev [2]int64 // dimIn, dimOut
}

// counts is what an origin's counts c add to its scope's sums: the current and
// previous windows' input and net output.
func (c remoteCounts) counts() (curr, prev [2]int64) {
	return [2]int64{count(c.curr, dimIn), count(c.curr, dimOut)}, [2]int64{count(c.prev, dimIn), count(c.prev, dimOut)}
}

// account adds (sign 1) or takes away (sign −1) one origin's counts c of scope id,
// its state being of window win, to or from the running sums. Caller holds l.mu.
func (l *Limiter) account(id uint64, win int64, c remoteCounts, sign int64) {
	curr, prev := c.counts()
	l.shiftSum(id, win, sign, curr, prev, sign)
}

// regrow moves one origin's counts of scope id at window win from old to c in the
// running sums (the same origin, so refs stay). Caller holds l.mu.
func (l *Limiter) regrow(id uint64, win int64, old, c remoteCounts) {
	oc, op := old.counts()
	nc, np := c.counts()
	l.shiftSum(id, win, 0, [2]int64{nc[0] - oc[0], nc[1] - oc[1]}, [2]int64{np[0] - op[0], np[1] - op[1]}, 1)
}

// shiftSum adds refs, and sign × curr and prev, to scope id's sum for window win,
// dropping a sum no origin is counted in any more. Caller holds l.mu.
func (l *Limiter) shiftSum(id uint64, win, refs int64, curr, prev [2]int64, sign int64) {
	sums := l.remote[id]
	i := 0
	for i < len(sums) && sums[i].win != win {
		i++
	}
	if i == len(sums) {
		if refs <= 0 {
			return // nothing of this window was counted
		}
		sums = append(sums, remoteSum{win: win})
		l.remote[id] = sums
	}
	s := &sums[i]
	s.refs += refs
	for d := range s.curr {
		s.curr[d] += sign * curr[d]
		s.prev[d] += sign * prev[d]
	}
	if s.refs <= 0 {
		last := len(sums) - 1
		sums[i] = sums[last]
		if last == 0 {
			delete(l.remote, id)
		} else {
			l.remote[id] = sums[:last]
		}
	}
}

// forget takes an origin's state out of the running sums. Caller holds l.mu.
func (l *Limiter) forget(o *origin) {
	for id, c := range o.scopes {
		l.account(id, o.win, c, -1)
	}
}

// AppendState appends this replica's current usage to dst, at most maxBytes long
// (≤ 0 means DefaultMaxSize). When not every scope fits, the busiest are sent: the
// others are too small to move a limit. Call it every gossip interval.
func (l *Limiter) AppendState(dst []byte, maxBytes int) []byte {
	if maxBytes <= 0 {
		maxBytes = DefaultMaxSize
	}
	w := l.cfg.Now().UnixNano() / l.window
	type item struct {
		id    uint64
		c     remoteCounts
		total int64
	}
	l.mu.Lock()
	items := make([]item, 0, len(l.local))
	for id, c := range l.local {
		c.roll(w)
		if c.win != w || c.curr == [3]int64{} && c.prev == [3]int64{} {
			continue
		}
		total := count(c.curr, dimIn) + count(c.curr, dimOut) + count(c.prev, dimIn) + count(c.prev, dimOut)
		items = append(items, item{id, remoteCounts{c.curr, c.prev}, total})
	}
	l.mu.Unlock()
	slices.SortFunc(items, func(a, b item) int {
		if a.total != b.total {
			return int(min(max(b.total-a.total, -1), 1))
		}
		return int(min(max(int64(a.id>>1)-int64(b.id>>1), -1), 1))
	})

	header := make([]byte, 0, 32)
	header = append(header, stateVersion)
	header = binary.AppendUvarint(header, uint64(l.cfg.Window.Milliseconds()))
	header = binary.AppendVarint(header, w)
	body := make([]byte, 0, min(maxBytes, len(items)*maxEntryBytes))
	n := 0
	var entry [maxEntryBytes]byte
	for _, it := range items {
		e := binary.LittleEndian.AppendUint64(entry[:0], it.id)
		e = binary.AppendUvarint(e, uint64(it.c.curr[0]))
		e = binary.AppendUvarint(e, uint64(it.c.curr[1]))
		e = binary.AppendUvarint(e, uint64(it.c.prev[0]))
		e = binary.AppendUvarint(e, uint64(it.c.prev[1]))
		e = binary.AppendUvarint(e, uint64(it.c.curr[2]))
		e = binary.AppendUvarint(e, uint64(it.c.prev[2]))
		if len(header)+binary.MaxVarintLen64+len(body)+len(e) > maxBytes {
			break
		}
		body = append(body, e...)
		n++
	}
	dst = append(dst, header...)
	dst = binary.AppendUvarint(dst, uint64(n))
	return append(dst, body...)
}

// decodeState parses a state payload; it never panics on bad input.
func decodeState(b []byte) (windowMS uint64, win int64, scopes map[uint64]remoteCounts, err error) {
	if len(b) == 0 || len(b) > maxStateBytes {
		return 0, 0, nil, fmt.Errorf("%w: length %d", ErrBadState, len(b))
	}
	if b[0] != 1 && b[0] != stateVersion {
		return 0, 0, nil, fmt.Errorf("%w: version %d", ErrBadState, b[0])
	}
	values := entryValues(b[0])
	p := b[1:]
	next := func(what string) (uint64, error) {
		v, k := binary.Uvarint(p)
		if k <= 0 {
			return 0, fmt.Errorf("%w: bad %s", ErrBadState, what)
		}
		p = p[k:]
		return v, nil
	}
	if windowMS, err = next("window length"); err != nil {
		return 0, 0, nil, err
	}
	v, k := binary.Varint(p)
	if k <= 0 {
		return 0, 0, nil, fmt.Errorf("%w: bad window index", ErrBadState)
	}
	win, p = v, p[k:]
	n, err := next("count")
	if err != nil {
		return 0, 0, nil, err
	}
	if n > uint64(len(p)/(8+values)) {
		return 0, 0, nil, fmt.Errorf("%w: count %d exceeds payload", ErrBadState, n)
	}
	scopes = make(map[uint64]remoteCounts, n)
	for i := uint64(0); i < n; i++ {
		if len(p) < 8 {
			return 0, 0, nil, fmt.Errorf("%w: entry %d truncated", ErrBadState, i)
		}
		id := binary.LittleEndian.Uint64(p)
		p = p[8:]
		var vals [6]int64
		for j := range values {
			u, err := next("counter")
			if err != nil {
				return 0, 0, nil, err
			}
			if u > 1<<53 {
				return 0, 0, nil, fmt.Errorf("%w: counter %d out of range", ErrBadState, u)
			}
			vals[j] = int64(u)
		}
		c := remoteCounts{curr: [3]int64{vals[0], vals[1], vals[4]}, prev: [3]int64{vals[2], vals[3], vals[5]}}
		scopes[id] = maxCounts(scopes[id], c)
	}
	if len(p) != 0 {
		return 0, 0, nil, fmt.Errorf("%w: %d trailing bytes", ErrBadState, len(p))
	}
	return windowMS, win, scopes, nil
}

func maxCounts(a, b remoteCounts) remoteCounts {
	for d := range a.curr {
		a.curr[d] = max(a.curr[d], b.curr[d])
		a.prev[d] = max(a.prev[d], b.prev[d])
	}
	return a
}

// MergeState folds another replica's published state into this limiter. A malformed
// payload is counted, reported and otherwise ignored; a payload from a replica with a
// different window length is refused (ErrOldWindow) because its counts are not
// comparable. A state whose window is more than one window from this replica's
// (clock skew) is counted as if the clocks agreed (placeWindow), and a state more
// than a window older than the origin's last is taken as its clock having stepped
// back and replaces it (gossip delivers an origin's states in order, so it is no
// reordering); both are counted in kvmesh_ratelimit_state_skewed_total and logged
// (a warning per origin at most once a minute).
func (l *Limiter) MergeState(originID string, b []byte) error {
	windowMS, win, scopes, err := decodeState(b)
	if err != nil {
		l.metrics.mergeErrors.Inc()
		return fmt.Errorf("ratelimit: merge from %q: %w", originID, err)
	}
	if windowMS != uint64(l.cfg.Window.Milliseconds()) {
		l.metrics.mergeErrors.Inc()
		return fmt.Errorf("ratelimit: merge from %q: %w: %d ms, want %d ms", originID, ErrOldWindow, windowMS, l.cfg.Window.Milliseconds())
	}
	now := l.cfg.Now()
	w := now.UnixNano() / l.window
	skew, back, warn, err := l.merge(originID, win, w, scopes, now)
	if warn { // logged outside l.mu: requests wait on it
		if back != 0 {
			l.cfg.Logger.Warn("rate-limit state from a replica whose clock stepped back: its usage replaces what it sent before",
				"origin", originID, "stepped_back", time.Duration(back)*l.cfg.Window, "skew", time.Duration(skew)*l.cfg.Window)
		} else {
			l.cfg.Logger.Warn("rate-limit state from a replica whose clock is more than a window off: counted as if the clocks agreed (fix the clock: token budgets are estimates while it lasts)",
				"origin", originID, "skew", time.Duration(skew)*l.cfg.Window)
		}
	}
	return err
}

// grace is how long after a window boundary a state of the window that just ended
// is taken as late rather than as its origin's clock being behind (placeWindow): a
// twentieth of the window, and at least three gossip intervals (Share's).
func (l *Limiter) grace() int64 {
	return max(l.window/20, 3*l.interval.Load())
}

// skewWarnEvery spaces the skew warnings about one origin.
const skewWarnEvery = time.Minute

// merge is MergeState's part under l.mu: the origin's state of window win, this
// replica being at window w. skew is the origin's window minus this one's and back
// how many windows it stepped back (0: it did not), both meaningful when warn, which
// says a skew warning about the origin is due.
func (l *Limiter) merge(originID string, win, w int64, scopes map[uint64]remoteCounts, now time.Time) (skew, back int64, warn bool, err error) {
	at, skewed := placeWindow(win, w)
	skew = win - w
	late := win == w-1 && now.UnixNano()-w*l.window < l.grace()
	l.mu.Lock()
	defer l.mu.Unlock()
	o, ok := l.origins[originID]
	if late && (!ok || o.behind != w-1) {
		at = win // sent before the boundary, not skew (placeWindow)
	}
	if ok && win < w && !late {
		o.behind = w
	}
	if !ok {
		if len(l.origins) >= l.cfg.MaxOrigins {
			for id, old := range l.origins {
				if old.win < w-1 {
					l.forget(old)
					delete(l.origins, id)
				}
			}
			if len(l.origins) >= l.cfg.MaxOrigins {
				l.metrics.mergeErrors.Inc()
				return 0, 0, false, fmt.Errorf("ratelimit: merge from %q: %w: more than %d origins", originID, ErrBadState, l.cfg.MaxOrigins)
			}
		}
		o = &origin{win: at, raw: win, scopes: scopes}
		if win < w && !late {
			o.behind = w
		}
		l.origins[originID] = o
		for id, c := range scopes {
			l.account(id, at, c, 1)
		}
		l.metrics.origins.Set(float64(len(l.origins)))
	} else {
		switch {
		case win > o.raw || win < o.raw-1: // newer, or the origin's clock stepped back
			if win < o.raw-1 {
				back, skewed = o.raw-win, true
			}
			l.forget(o)
			o.win, o.raw, o.scopes = at, win, scopes
			for id, c := range scopes {
				l.account(id, at, c, 1)
			}
		case win == o.raw && at != o.win: // the same window, placed anew: this clock moved on
			l.forget(o)
			o.win = at
			for id, c := range scopes {
				o.scopes[id] = maxCounts(o.scopes[id], c)
			}
			for id, c := range o.scopes {
				l.account(id, at, c, 1)
			}
		case win == o.raw:
			for id, c := range scopes {
				old, had := o.scopes[id]
				c = maxCounts(old, c)
				switch {
				case !had:
					l.account(id, at, c, 1)
				case c != old: // most scopes did not move since the last state
					l.regrow(id, at, old, c)
				default:
					continue
				}
				o.scopes[id] = c
			}
		}
		// A window older than the last: reordered, ignored.
	}
	if !skewed {
		return 0, 0, false, nil
	}
	l.metrics.skewed.Inc()
	last := &o.warned[0]
	if back != 0 {
		last = &o.warned[1]
	}
	if since := now.Sub(*last); !last.IsZero() && since < skewWarnEvery && since > -skewWarnEvery {
		return skew, back, false, nil
	}
	*last = now
	return skew, back, true, nil
}

// ForgetOrigin drops a replica's state, e.g. when gossip reports it left or died.
func (l *Limiter) ForgetOrigin(originID string) {
	l.mu.Lock()
	if o, ok := l.origins[originID]; ok {
		l.forget(o)
		delete(l.origins, originID)
	}
	l.metrics.origins.Set(float64(len(l.origins)))
	l.mu.Unlock()
}
