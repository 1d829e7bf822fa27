package des

import (
	"fmt"
	"io"
	"sync"
	"time"
)

// DefaultProgressEvery is how often, in wall time, a run reports each
// running policy's progress on Config.Progress.
const DefaultProgressEvery = 10 * time.Second

// progressMu keeps the progress lines of policies running in parallel
// whole on a writer that does not (a bytes.Buffer, a pipe's buffered
// writes).
var progressMu sync.Mutex

// progress reports one policy's run: a plain line every Config.ProgressEvery
// of wall time with the virtual time reached against the arrivals' span
// and the requests done, and, when it wrote any, a last one at the end.
// A run whose writer is nil reports nothing. The simulation loops call
// tick every few thousand events (with the cancellation check), so a line
// comes at most that many events late.
type progress struct {
	w     io.Writer
	name  string
	every time.Duration
	now   func() time.Time
	start time.Time
	next  time.Time
	span  time.Duration // the last open-loop arrival
	lines int
}

// startProgress starts reporting the run of name on cfg's writer (nil: a
// no-op progress); c holds the run's requests.
func startProgress(cfg *Config, name string, c *clock) *progress {
	if cfg.Progress == nil {
		return nil
	}
	p := &progress{w: cfg.Progress, name: name, every: cfg.ProgressEvery, now: cfg.progressClock}
	if p.every <= 0 {
		p.every = DefaultProgressEvery
	}
	if p.now == nil {
		p.now = time.Now
	}
	for i := range c.reqs {
		if c.reqs[i].After == 0 {
			p.span = max(p.span, c.reqs[i].Arrival)
		}
	}
	p.start = p.now()
	p.next = p.start.Add(p.every)
	return p
}

// tick writes a line when the wall clock has passed the next report time.
func (p *progress) tick(c *clock, virtual time.Duration) {
	if p == nil {
		return
	}
	if t := p.now(); !t.Before(p.next) {
		for !p.next.After(t) {
			p.next = p.next.Add(p.every)
		}
		p.write(c, virtual, t, "")
	}
}

// done writes the last line, when the run wrote any before.
func (p *progress) done(c *clock, virtual time.Duration) {
	if p == nil || p.lines == 0 {
		return
	}
	p.write(c, virtual, p.now(), "finished: ")
}

func (p *progress) write(c *clock, virtual time.Duration, t time.Time, what string) {
	p.lines++
	progressMu.Lock()
	defer progressMu.Unlock()
	fmt.Fprintf(p.w, "des %s: %svirtual %.1fs (arrivals span %.1fs), %d/%d requests done, %s wall\n",
		p.name, what, virtual.Seconds(), p.span.Seconds(), len(c.reqs)-c.pending, len(c.reqs), t.Sub(p.start).Round(time.Second))
}
