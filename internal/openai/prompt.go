package openai

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strconv"
)

// Sentinel errors.
var (
	// ErrBadRequest marks a request body that does not decode or validate.
	ErrBadRequest = errors.New("openai: bad request")
	// ErrBadStream marks malformed SSE framing or a truncated stream.
	ErrBadStream = errors.New("openai: bad event stream")
)

// Prompt is a completion prompt in any of the four shapes vLLM accepts:
// a string, a list of strings, a flat list of token ids (one pre-tokenized
// prompt) or a list of token-id lists. Exactly one of Texts and Tokens is set.
type Prompt struct {
	Texts  []string   // one entry for a plain string
	Tokens [][]uint32 // one entry for a flat token-id list
	// List records that the JSON was a list of prompts (["a"] or [[1,2]]), so
	// the prompt re-encodes in its original shape.
	List bool
}

// Len is the number of prompts.
func (p *Prompt) Len() int { return len(p.Texts) + len(p.Tokens) }

// TokenPrompt returns a single pre-tokenized prompt.
func TokenPrompt(ids []uint32) Prompt { return Prompt{Tokens: [][]uint32{ids}} }

// UnmarshalJSON decodes any of the four shapes; anything else (numbers out of
// uint32 range, mixed lists, empty lists, null) is an error.
func (p *Prompt) UnmarshalJSON(b []byte) error {
	*p = Prompt{}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return fmt.Errorf("%w: empty prompt", ErrBadRequest)
	}
	switch b[0] {
	case '"':
		var s string
		if err := json.Unmarshal(b, &s); err != nil {
			return fmt.Errorf("%w: prompt: %v", ErrBadRequest, err)
		}
		p.Texts = []string{s}
		return nil
	case '[':
	default:
		return fmt.Errorf("%w: prompt must be a string, a list of strings, a list of token ids or a list of lists", ErrBadRequest)
	}
	var items []json.RawMessage
	if err := json.Unmarshal(b, &items); err != nil {
		return fmt.Errorf("%w: prompt: %v", ErrBadRequest, err)
	}
	if len(items) == 0 {
		return fmt.Errorf("%w: prompt is an empty list", ErrBadRequest)
	}
	first := bytes.TrimSpace(items[0])
	switch {
	case len(first) > 0 && first[0] == '"':
		p.List = true
		p.Texts = make([]string, len(items))
		for i, it := range items {
			if err := json.Unmarshal(it, &p.Texts[i]); err != nil || !isString(it) {
				return fmt.Errorf("%w: prompt[%d]: want a string", ErrBadRequest, i)
			}
		}
	case len(first) > 0 && first[0] == '[':
		p.List = true
		p.Tokens = make([][]uint32, len(items))
		for i, it := range items {
			ids, err := parseTokenList(it)
			if err != nil {
				return fmt.Errorf("%w: prompt[%d]: %v", ErrBadRequest, i, err)
			}
			if len(ids) == 0 {
				return fmt.Errorf("%w: prompt[%d] is empty", ErrBadRequest, i)
			}
			p.Tokens[i] = ids
		}
	default:
		ids, err := parseTokenList(b)
		if err != nil {
			return fmt.Errorf("%w: prompt: %v", ErrBadRequest, err)
		}
		p.Tokens = [][]uint32{ids}
	}
	return nil
}

func isString(b []byte) bool {
	b = bytes.TrimSpace(b)
	return len(b) > 0 && b[0] == '"'
}

// parseTokenList decodes a JSON array of non-negative integers < 2^32 with a
// hand-written scanner: one allocation for the result, none per token.
func parseTokenList(b []byte) ([]uint32, error) {
	b = b[skipSpace(b, 0):] // JSON whitespace only (bytes.TrimSpace trims \v, \f, U+0085, U+00A0 too)
	for len(b) > 0 && isSpace(b[len(b)-1]) {
		b = b[:len(b)-1]
	}
	if len(b) < 2 || b[0] != '[' || b[len(b)-1] != ']' {
		return nil, errors.New("want a list of token ids")
	}
	body := b[1 : len(b)-1]
	ids := make([]uint32, 0, bytes.Count(body, []byte(","))+1)
	i := skipSpace(body, 0)
	if i == len(body) {
		return ids, nil // []
	}
	for {
		start := i
		var v uint64
		for i < len(body) && body[i] >= '0' && body[i] <= '9' {
			v = v*10 + uint64(body[i]-'0')
			if v > math.MaxUint32 {
				return nil, fmt.Errorf("token id at byte %d: want an integer in [0, %d]", start, uint64(math.MaxUint32))
			}
			i++
		}
		if i == start || (body[start] == '0' && i-start > 1) {
			return nil, fmt.Errorf("token id at byte %d: want an integer in [0, %d]", start, uint64(math.MaxUint32))
		}
		ids = append(ids, uint32(v))
		i = skipSpace(body, i)
		if i == len(body) {
			return ids, nil
		}
		if body[i] != ',' {
			return nil, fmt.Errorf("token id at byte %d: want an integer in [0, %d]", start, uint64(math.MaxUint32))
		}
		i = skipSpace(body, i+1)
	}
}

// isSpace reports whether c is JSON whitespace.
func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

// MarshalJSON encodes the prompt in the shape it was decoded from.
func (p Prompt) MarshalJSON() ([]byte, error) {
	switch {
	case len(p.Tokens) == 1 && !p.List:
		return AppendTokenIDs(nil, p.Tokens[0]), nil
	case len(p.Tokens) > 0:
		out := []byte{'['}
		for i, ids := range p.Tokens {
			if i > 0 {
				out = append(out, ',')
			}
			out = AppendTokenIDs(out, ids)
		}
		return append(out, ']'), nil
	case len(p.Texts) == 1 && !p.List:
		return AppendString(nil, p.Texts[0]), nil
	case len(p.Texts) > 0:
		out := []byte{'['}
		for i, s := range p.Texts {
			if i > 0 {
				out = append(out, ',')
			}
			out = AppendString(out, s)
		}
		return append(out, ']'), nil
	}
	return nil, fmt.Errorf("%w: empty prompt", ErrBadRequest)
}

// AppendTokenIDs appends ids as a JSON array.
func AppendTokenIDs(dst []byte, ids []uint32) []byte {
	dst = append(dst, '[')
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, ',')
		}
		dst = strconv.AppendUint(dst, uint64(id), 10)
	}
	return append(dst, ']')
}
