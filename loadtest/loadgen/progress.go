package loadgen

import (
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/term"
)

// PlainProgressEvery is how often ProgressLine writes a line when its
// writer is not a terminal.
const PlainProgressEvery = 10 * time.Second

// ProgressLine returns a Config.Progress callback that reports on w,
// each line starting with prefix. On a terminal it redraws one status
// line in place ("\r") at every call; anywhere else (a file, a pipe, a CI
// log) carriage returns would pile up into one unreadable line, so it
// writes a plain line every PlainProgressEvery of the run and a last one
// when the run ends.
func ProgressLine(w io.Writer, prefix string) func(Progress) {
	return progressWriter(w, prefix, IsTerminal(w), PlainProgressEvery)
}

// IsTerminal reports whether w is a terminal (an *os.File on a tty).
func IsTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	return ok && term.IsTerminal(int(f.Fd()))
}

// progressWriter is ProgressLine with the terminal test and the plain
// period given. Calls come from one goroutine (Config.Progress's contract).
func progressWriter(w io.Writer, prefix string, tty bool, every time.Duration) func(Progress) {
	next := every
	return func(p Progress) {
		if tty {
			fmt.Fprintf(w, "\r%s%s   ", prefix, p.status())
			if p.Final {
				fmt.Fprintln(w)
			}
			return
		}
		if !p.Final && p.Elapsed < next {
			return
		}
		for next <= p.Elapsed {
			next += every
		}
		fmt.Fprintf(w, "%s%s\n", prefix, p.status())
	}
}

// status is the progress line's text.
func (p Progress) status() string {
	hit := "n/a" // no usage counted yet: undefined, not 0
	if p.PromptTokens > 0 {
		hit = fmt.Sprintf("%.1f%%", 100*float64(p.CachedTokens)/float64(p.PromptTokens))
	}
	rps := 0.0
	if s := p.Elapsed.Seconds(); s > 0 {
		rps = float64(p.Completed) / s
	}
	return fmt.Sprintf("%6s  %d/%d done  %d failed  %d in flight  %.1f req/s  hit %s",
		p.Elapsed.Truncate(100*time.Millisecond), p.Completed, p.Total, p.Failed, p.InFlight, rps, hit)
}
