package sim

import (
	"encoding/json"
	"strings"
)

// stopCut is where a stop string ends one output: vLLM checks the
// detokenized text after every token (from min_tokens on) and ends the
// request at the first token whose text completes a stop string, with
// finish_reason "stop", stop_reason the string, and the text cut before it
// (or after it, include_stop_str_in_output). Generation here is a pure
// function of the prompt, so the cut is found before the request runs
// and the engine generates exactly that many tokens.
type stopCut struct {
	tokens int    // output tokens up to the stop (0: no stop string ends this output)
	stop   string // the stop string that ended it
	text   int    // bytes of the output text kept
}

// stopAt finds where g's stop strings cut the out tokens prompt (sample)
// generates; zero when none does.
func (s *Server) stopAt(prompt []uint32, sample, out int, g *gen) stopCut {
	if len(g.stop) == 0 || out < 1 {
		return stopCut{}
	}
	ids := s.cfg.Engine.GeneratedTokens(nil, prompt, sample, out)
	first := max(1, g.minTokens) // vLLM skips the stop check before min_tokens
	before := 0                  // text bytes of the first first-1 tokens: a stop must end past them
	if first > 1 {
		before = len(s.tok.Decode(ids[:first-1], true))
	}
	// find reports the stop string (first in request order) that ends
	// within the text of the first k tokens, and where it starts.
	find := func(k int) (string, int) {
		text := s.tok.Decode(ids[:k], true)
		for _, st := range g.stop {
			from := max(0, before-len(st)+1)
			if from > len(text) {
				continue
			}
			if i := strings.Index(text[from:], st); i >= 0 {
				return st, from + i
			}
		}
		return "", -1
	}
	if first > out {
		return stopCut{}
	}
	if st, _ := find(out); st == "" {
		return stopCut{}
	}
	lo, hi := first, out // the first k whose text holds a stop: texts only grow with k
	for lo < hi {
		mid := (lo + hi) / 2
		if st, _ := find(mid); st != "" {
			hi = mid
		} else {
			lo = mid + 1
		}
	}
	st, at := find(lo)
	c := stopCut{tokens: lo, stop: st, text: at}
	if g.keepStop {
		c.text += len(st)
	}
	return c
}

// clip cuts the next piece of an output's text at the stop: sent is how
// many bytes of the text were sent before piece.
func (c stopCut) clip(piece string, sent int) string {
	if c.tokens == 0 {
		return piece
	}
	if room := c.text - sent; len(piece) > room {
		return piece[:max(0, room)]
	}
	return piece
}

// reason is the choice's stop_reason: the stop string, or null.
func (c stopCut) reason() json.RawMessage {
	if c.tokens == 0 {
		return json.RawMessage("null")
	}
	b, _ := json.Marshal(c.stop)
	return b
}
