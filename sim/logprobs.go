package sim

import (
	"math"
	"slices"
	"strconv"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/openai"
	"github.com/kvmesh/kvmesh/sim/engine"
)

// Log probabilities, in vLLM's shapes. The simulator samples no
// distribution: each output token gets a made-up log probability, the
// highest of its position (it is what a greedy engine would have chosen),
// and the alternatives are the request's own later output tokens at lower
// ones. Deterministic per request and position, so a stream and its
// non-streamed twin agree.

// tokenLogprob is the made-up log probability of output position pos
// holding id: in (-2, 0].
func tokenLogprob(id uint32, pos int) float64 {
	h := uint64(id)*0x9E3779B97F4A7C15 ^ uint64(pos)*0xBF58476D1CE4E5B9
	return -float64(h>>40%2000) / 1000
}

// appendLogprob appends lp to three decimals (as made up as that is).
func appendLogprob(dst []byte, lp float64) []byte {
	return strconv.AppendFloat(dst, math.Round(lp*1000)/1000, 'f', -1, 64)
}

// alternatives appends up to n token ids other than chosen for position
// pos: the request's own output tokens after it (ids the model's
// tokenizer knows), without repeats.
func alternatives(dst []uint32, req *engine.Request, pos int, chosen uint32, n int) []uint32 {
	var window [3 * openai.MaxLogprobs]uint32
	cand := req.OutputTokens(window[:0], pos+1, pos+1+cap(window))
	for _, id := range cand {
		if len(dst) == n {
			break
		}
		if id == chosen || slices.Contains(dst, id) {
			continue
		}
		dst = append(dst, id)
	}
	return dst
}

// appendTokenFields appends `{"token":t,"logprob":lp,"bytes":[...]`, the
// members chat's per-token and top_logprobs entries share, leaving the
// object open for the caller to close (or to add top_logprobs to).
func appendTokenFields(dst []byte, t string, lp float64) []byte {
	dst = append(dst, `{"token":`...)
	dst = openai.AppendString(dst, t)
	dst = append(dst, `,"logprob":`...)
	dst = appendLogprob(dst, lp)
	dst = append(dst, `,"bytes":[`...)
	for i := 0; i < len(t); i++ {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(t[i]), 10)
	}
	return append(dst, ']')
}

// appendChatLogprobs appends chat's {"content":[...]} for output positions
// [from, to) of req, each with top alternatives.
func (s *Server) appendChatLogprobs(dst []byte, req *engine.Request, from, to, top int) []byte {
	dst = append(dst, `{"content":[`...)
	var alts []uint32
	for i, id := range req.OutputTokens(nil, from, to) {
		if i > 0 {
			dst = append(dst, ',')
		}
		pos := from + i
		t, lp := s.tok.Decode([]uint32{id}, false), tokenLogprob(id, pos)
		dst = appendTokenFields(dst, t, lp)
		dst = append(dst, `,"top_logprobs":[`...)
		if top > 0 {
			dst = append(appendTokenFields(dst, t, lp), '}') // the sampled token, the likeliest
			alts = alternatives(alts[:0], req, pos, id, top-1)
			for k, a := range alts {
				dst = append(dst, ',')
				dst = append(appendTokenFields(dst, s.tok.Decode([]uint32{a}, false), lp-0.5-float64(k)), '}')
			}
		}
		dst = append(dst, "]}"...)
	}
	return append(dst, "]}"...)
}

// appendCompletionLogprobs appends completions' {"text_offset","token_logprobs",
// "tokens","top_logprobs"} for output positions [from, to) of req; offset
// is the characters of the choice's text before from (vLLM's text_offset).
func (s *Server) appendCompletionLogprobs(dst []byte, req *engine.Request, from, to, top, offset int) []byte {
	ids := req.OutputTokens(nil, from, to)
	toks := make([]string, len(ids))
	for i, id := range ids {
		toks[i] = s.tok.Decode([]uint32{id}, false)
	}
	dst = append(dst, `{"text_offset":[`...)
	for i := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendInt(dst, int64(offset), 10)
		offset += utf8.RuneCountInString(toks[i])
	}
	dst = append(dst, `],"token_logprobs":[`...)
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = appendLogprob(dst, tokenLogprob(id, from+i))
	}
	dst = append(dst, `],"tokens":[`...)
	for i := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = openai.AppendString(dst, toks[i])
	}
	dst = append(dst, `],"top_logprobs":[`...)
	var alts []uint32
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		if top == 0 {
			dst = append(dst, "null"...)
			continue
		}
		lp := tokenLogprob(id, from+i)
		dst = append(dst, '{')
		dst = openai.AppendString(dst, toks[i])
		dst = append(dst, ':')
		dst = appendLogprob(dst, lp)
		alts = alternatives(alts[:0], req, from+i, id, top-1)
		seen := []string{toks[i]} // a dict: tokens that decode alike are one key
		for _, a := range alts {
			t := s.tok.Decode([]uint32{a}, false)
			if slices.Contains(seen, t) {
				continue
			}
			dst = append(dst, ',')
			dst = openai.AppendString(dst, t)
			dst = append(dst, ':')
			dst = appendLogprob(dst, lp-0.5*float64(len(seen)))
			seen = append(seen, t)
		}
		dst = append(dst, '}')
	}
	return append(dst, "]}"...)
}
