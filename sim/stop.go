package sim

import (
	"encoding/json"
	"slices"
	"strconv"
	"strings"
)

// stopCut is where a stop string or a stop token ends one output.
//
// A stop string: vLLM checks the detokenized text after every token (from
// min_tokens on) and ends the request at the first token whose text
// completes a stop string, with finish_reason "stop", stop_reason the
// string, and the text cut before it (or after it,
// include_stop_str_in_output).
//
// A stop token (stop_token_ids): the engine core ends the request on the
// first generated token among them, with stop_reason that token's id; the
// token counts as output but its text is left out (kept with
// include_stop_str_in_output). vLLM's min_tokens logits processor keeps
// those tokens from being sampled before min_tokens, and its length check
// comes first, so one that would be the max_tokens-th token finishes by
// length.
//
// Generation here is a pure function of the prompt, so the cut is found
// before the request runs and the engine generates exactly that many
// tokens.
type stopCut struct {
	tokens int    // output tokens up to the stop (0: nothing ends this output early)
	stop   string // the stop string that ended it
	id     int64  // the stop token that ended it (when token)
	token  bool   // a stop token, not a string, ended it
	text   int    // bytes of the output text kept
}

// stopAt finds where g's stop strings or stop tokens cut the out tokens
// prompt (sample) generates; zero when none does. The first cut wins; at
// the stop token itself its text decides (vLLM's detokenizer checks the
// stop strings after the engine core stopped on the token).
func (s *Server) stopAt(prompt []uint32, sample, out int, g *gen) stopCut {
	if (len(g.stop) == 0 && len(g.stopIDs) == 0) || out < 1 {
		return stopCut{}
	}
	ids := s.cfg.Engine.GeneratedTokens(nil, prompt, sample, out)
	first := max(1, g.minTokens) // vLLM skips the stop check before min_tokens
	if t := s.stopToken(ids, first, g); t.tokens > 0 {
		// A stop string wins if it ends in the text the detokenizer then
		// checks: before the token, or within it when its text is kept.
		within := t.tokens - 1
		if g.keepStop {
			within = t.tokens
		}
		if st := s.stopString(ids, first, within, g); st.tokens > 0 {
			return st
		}
		return t
	}
	return s.stopString(ids, first, out, g)
}

// stopToken is the cut of the first of g's stop tokens among ids, from
// the first-th token on and before max_tokens.
func (s *Server) stopToken(ids []uint32, first int, g *gen) stopCut {
	if len(g.stopIDs) == 0 {
		return stopCut{}
	}
	for k := first; k <= len(ids) && k < g.maxTokens; k++ {
		id := int64(ids[k-1])
		if !slices.Contains(g.stopIDs, id) {
			continue
		}
		keep := k - 1
		if g.keepStop {
			keep = k
		}
		return stopCut{tokens: k, id: id, token: true, text: len(s.tok.Decode(ids[:keep], true))}
	}
	return stopCut{}
}

// stopString is the cut of the first of g's stop strings that ends within
// the text of the first out tokens of ids, from the first-th token on.
func (s *Server) stopString(ids []uint32, first, out int, g *gen) stopCut {
	if len(g.stop) == 0 || first > out {
		return stopCut{}
	}
	before := 0 // text bytes of the first first-1 tokens: a stop must end past them
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

// reason is the choice's stop_reason: the stop string or token id, or
// null.
func (c stopCut) reason() json.RawMessage {
	if c.tokens == 0 {
		return json.RawMessage("null")
	}
	if c.token {
		return strconv.AppendInt(nil, c.id, 10)
	}
	b, _ := json.Marshal(c.stop)
	return b
}
