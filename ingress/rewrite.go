package ingress

import (
	"slices"
	"strconv"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
	"github.com/kvmesh/kvmesh/internal/openai"
)

// rewritePrompt appends body with its prompt value replaced by ids.
func rewritePrompt(dst, body []byte, start, end int, ids []uint32) []byte {
	dst = append(dst, body[:start]...)
	dst = openai.AppendTokenIDs(dst, ids)
	return append(dst, body[end:]...)
}

// chatToCompletionsBody turns a chat body into a completions body by
// replacing the "messages" member with the rendered prompt's token ids and
// renaming max_completion_tokens (chat only) to max_tokens, dropping a
// max_tokens it overrides; the other sampling fields carry over unchanged,
// except the members in r.wrapDrop, which vLLM's chat endpoint ignores but
// /v1/completions would read (a "prompt" after messages would be the prompt).
// A chat with no output limit runs to the model's context, but
// /v1/completions stops at 16 tokens when max_tokens is absent (vLLM's
// default), so the body then says max_tokens: room (the context left after
// the prompt, as vLLM's chat computes it) or, when room is unknown (≤ 0),
// null, which vLLM reads as that same context.
func chatToCompletionsBody(dst, body []byte, r *request, ids []uint32, room int) []byte {
	var buf [8]bodyEdit
	eds := append(buf[:0], bodyEdit{r.msgStart, r.msgEnd, editPrompt})
	last := false // a "max_tokens" member with max_completion_tokens' value goes last
	switch {
	case r.mtN > 1 || r.mctN > 1:
		// A name sent more than once: the engine reads the last member of
		// each, so the members stay as they came, and a max_tokens added
		// after them all carries the max_completion_tokens that wins.
		last = r.hasMCT
	case r.hasMCT:
		eds = append(eds, bodyEdit{r.mctKey[0], r.mctKey[1], editRename})
		if r.mtN > 0 { // a max_tokens after it, null too, would win as completions
			eds = append(eds, bodyEdit{r.mtMember[0], r.mtMember[1], editDrop})
		}
	case r.mctNull:
		eds = append(eds, bodyEdit{r.mctMember[0], r.mctMember[1], editDrop})
	}
	for _, d := range r.wrapDrop {
		eds = append(eds, bodyEdit{d[0], d[1], editDrop})
	}
	slices.SortFunc(eds, func(a, b bodyEdit) int { return a.start - b.start })
	base := len(dst)
	at := 0
	for _, e := range eds {
		dst = append(dst, body[at:e.start]...)
		at = e.end
		switch e.kind {
		case editPrompt:
			dst = append(dst, `"prompt":`...)
			dst = openai.AppendTokenIDs(dst, ids)
		case editRename:
			dst = append(dst, `"max_tokens"`...)
		case editDrop:
			// A dropped member takes one comma with it: the one before it
			// when there is one, else (the object's first member) the one
			// after it. Deciding on what is written so far keeps the commas
			// right when dropped members are neighbours.
			k := len(dst) - 1
			for k > base && isJSONSpace(dst[k]) {
				k--
			}
			if dst[k] == ',' {
				dst = dst[:k]
			} else if j := jsonscan.SkipWS(body, at); j < len(body) && body[j] == ',' {
				at = j + 1
			}
		}
	}
	if last || r.maxTokens < 0 {
		end := len(body) - 1
		for end > at && body[end] != '}' {
			end--
		}
		dst = append(dst, body[at:end]...)
		dst = append(dst, `,"max_tokens":`...)
		switch {
		case last:
			dst = append(dst, body[r.mctVal:r.mctMember[1]]...)
		case room > 0:
			dst = strconv.AppendInt(dst, int64(room), 10)
		default:
			dst = append(dst, "null"...)
		}
		at = end
	}
	return append(dst, body[at:]...)
}

// bodyEdit replaces body[start:end] in chatToCompletionsBody.
type bodyEdit struct {
	start, end int
	kind       uint8
}

const (
	editDrop   uint8 = iota // cut the member and one comma beside it
	editPrompt              // the chat messages → "prompt":[ids]
	editRename              // "max_completion_tokens" → "max_tokens"
)

// isJSONSpace reports whether c is whitespace between JSON tokens.
func isJSONSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// appendUsageRequest appends body with "stream_options":{"include_usage":true}
// added as its last member (the body is a validated object with members).
func appendUsageRequest(dst, body []byte) []byte {
	end := len(body) - 1
	for end > 0 && body[end] != '}' {
		end--
	}
	dst = append(dst, body[:end]...)
	dst = append(dst, `,"stream_options":{"include_usage":true}`...)
	return append(dst, body[end:]...)
}
