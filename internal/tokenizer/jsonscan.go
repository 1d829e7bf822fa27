package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"math"
	"unicode/utf8"

	"github.com/kvmesh/kvmesh/internal/jsonscan"
)

// The large parts of tokenizer.json (a 128k-entry vocabulary, 280k merges)
// are read with internal/jsonscan: encoding/json with reflection takes over
// a second and ~100 MB of garbage for Llama 3. The small parts are decoded
// by encoding/json from the raw spans fields returns.

// fields reads the object that is the whole of b into raw values by key
// (values are not copied).
func fields(b []byte) (map[string][]byte, error) {
	out := map[string][]byte{}
	err := jsonscan.ForEachMember(b, func(k, v []byte, koff, _ int) error {
		key, err := memberKey(b, k, koff)
		out[key] = v
		return err
	})
	return out, err
}

// memberKey decodes a member's key as encoding/json does: k is its text (the
// bytes of b after the quote at koff when it holds no escapes). A key that
// held escapes arrives decoded in a copy; it is decoded again from its
// literal, so invalid UTF-8 next to an escape becomes U+FFFD exactly as
// encoding/json makes it.
func memberKey(b, k []byte, koff int) (string, error) {
	if len(k) == 0 || &k[0] == &b[koff+1] { // written as it reads: no second scan
		return str(k, false)
	}
	end, _, err := jsonscan.SkipString(b, koff)
	if err != nil {
		return "", err
	}
	return str(b[koff:end], true)
}

// str decodes a JSON string as encoding/json does: raw is the literal with
// its quotes when quoted, or text without escapes when not; text that is
// plain valid UTF-8 is copied directly.
func str(raw []byte, quoted bool) (string, error) {
	inner := raw
	if quoted {
		inner = raw[1 : len(raw)-1]
	}
	if (!quoted || bytes.IndexByte(inner, '\\') < 0) && utf8.Valid(inner) {
		return string(inner), nil
	}
	if !quoted {
		raw = append(append([]byte{'"'}, raw...), '"')
	}
	var out string
	if err := json.Unmarshal(raw, &out); err != nil {
		return "", fmt.Errorf("%w: %v", jsonscan.ErrMalformed, err)
	}
	return out, nil
}

// element decodes a string element of an array.
func element(e []byte) (string, error) {
	if e[0] != '"' {
		return "", fmt.Errorf("%w: want a string, got %.32q", jsonscan.ErrMalformed, e)
	}
	return str(e, true)
}

// scanVocab reads {"token": id, ...}.
func scanVocab(raw []byte) (map[string]uint32, error) {
	vocab := make(map[string]uint32, len(raw)/16)
	err := jsonscan.ForEachMember(raw, func(k, v []byte, koff, _ int) error {
		key, err := memberKey(raw, k, koff)
		if err != nil {
			return err
		}
		id, ok := jsonscan.ParseUint(v, math.MaxUint32)
		if !ok {
			return fmt.Errorf("%w: token %q: want an id, got %.32q", jsonscan.ErrMalformed, key, v)
		}
		vocab[key] = uint32(id)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("vocab: %w: %v", ErrInvalid, err)
	}
	return vocab, nil
}

// scanMerges reads ["a b", ...] or [["a", "b"], ...].
func scanMerges(raw []byte) ([][2]string, error) {
	var out [][2]string
	err := jsonscan.ForEachElem(raw, func(e []byte) error {
		if e[0] == '[' {
			var pair [2]string
			n := 0
			err := jsonscan.ForEachElem(e, func(part []byte) error {
				s, err := element(part)
				if err == nil && n < 2 {
					pair[n] = s
				}
				n++
				return err
			})
			if err == nil && n != 2 {
				err = fmt.Errorf("%w: merge with %d parts", jsonscan.ErrMalformed, n)
			}
			out = append(out, pair)
			return err
		}
		s, err := element(e)
		if err != nil {
			return err
		}
		a, b, ok := cutSpace(s)
		if !ok {
			return fmt.Errorf("%w: merge %q has no space", jsonscan.ErrMalformed, s)
		}
		out = append(out, [2]string{a, b})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("bpe merges: %w: %v", ErrInvalid, err)
	}
	return out, nil
}

func cutSpace(s string) (string, string, bool) {
	for i := 0; i < len(s); i++ {
		if s[i] == ' ' {
			return s[:i], s[i+1:], true
		}
	}
	return "", "", false
}
