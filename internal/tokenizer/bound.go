package tokenizer

import (
	"errors"
	"time"
)

// Bound limits one encoding (AppendEncodeBounded), so a caller that will
// refuse a long prompt, or has given up on it, does not pay for all of it.
// The zero value bounds nothing. The encoding checks the token count after
// every word, and the deadline and Stop every pollBytes of text and every
// pollMerges steps of a long word's merge, so it ends within about a
// millisecond of either.
type Bound struct {
	// MaxTokens > 0 stops the encoding with ErrTooManyTokens once it has
	// produced more than MaxTokens ids (before special tokens are added,
	// which only add more).
	MaxTokens int
	// Deadline, when not zero, stops the encoding with ErrDeadline once
	// passed.
	Deadline time.Time
	// Stop, when not nil, is polled as often as the deadline; a non-nil
	// error stops the encoding with that error (a client that left).
	Stop Stopper
}

// Stopper is polled by a bounded encoding on its goroutine. Stopped must be
// cheap and must not block.
type Stopper interface {
	Stopped() error
}

// Errors of a bounded encoding; match with errors.Is.
var (
	// ErrTooManyTokens: the text has more ids than Bound.MaxTokens.
	ErrTooManyTokens = errors.New("tokenizer: more tokens than the bound")
	// ErrDeadline: Bound.Deadline passed before the encoding (or a chat
	// rendering, ChatTemplate.RenderPromptBounded) ended.
	ErrDeadline = errors.New("tokenizer: encoding deadline passed")
)

const (
	pollBytes  = 64 << 10 // bytes of words between polls
	pollMerges = 4096     // merge steps of one long word between polls
)

// bound is a Bound in force for one appendRaw call, kept in its scratch.
type bound struct {
	on       bool
	maxLen   int // stop once dst is longer; 0: no limit
	deadline time.Time
	stop     Stopper
	work     int   // bytes since the last poll
	err      error // why the encoding stopped
}

func newBound(b *Bound, start int) bound {
	if b == nil || b.MaxTokens <= 0 && b.Deadline.IsZero() && b.Stop == nil {
		return bound{}
	}
	nb := bound{on: true, deadline: b.Deadline, stop: b.Stop}
	if b.MaxTokens > 0 {
		nb.maxLen = start + b.MaxTokens
	}
	return nb
}

// after accounts for one word of n bytes that took dst to length ids, and
// reports whether the encoding must stop.
func (b *bound) after(ids, n int) bool {
	if b.maxLen > 0 && ids > b.maxLen {
		b.err = ErrTooManyTokens
		return true
	}
	if b.work += n; b.work >= pollBytes {
		b.work = 0
		return b.poll()
	}
	return b.err != nil
}

// poll checks the deadline and Stop.
func (b *bound) poll() bool {
	if b.err != nil {
		return true
	}
	if !b.deadline.IsZero() && !time.Now().Before(b.deadline) {
		b.err = ErrDeadline
		return true
	}
	if b.stop != nil {
		if err := b.stop.Stopped(); err != nil {
			b.err = err
			return true
		}
	}
	return false
}
