package tokenizer

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"unicode/utf8"
)

// A minimal JSON scanner for the large parts of tokenizer.json (a 128k-entry
// vocabulary, 280k merges): encoding/json with reflection takes over a
// second and ~100 MB of garbage for Llama 3; this reads them in one pass. It
// only has to be correct on valid JSON and must fail cleanly on anything else.

var errScan = errors.New("malformed JSON")

type scanner struct {
	b []byte
	i int
}

func (s *scanner) ws() {
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case ' ', '\t', '\n', '\r':
			s.i++
		default:
			return
		}
	}
}

func (s *scanner) peek() byte {
	s.ws()
	if s.i >= len(s.b) {
		return 0
	}
	return s.b[s.i]
}

func (s *scanner) expect(c byte) error {
	if s.peek() != c {
		return fmt.Errorf("%w at byte %d: want %q", errScan, s.i, c)
	}
	s.i++
	return nil
}

// str reads a JSON string; strings without escapes are copied directly.
func (s *scanner) str() (string, error) {
	start, simple, err := s.skipString()
	if err != nil {
		return "", err
	}
	if raw := s.b[start+1 : s.i-1]; simple && utf8.Valid(raw) {
		return string(raw), nil
	}
	var out string
	if err := json.Unmarshal(s.b[start:s.i], &out); err != nil {
		return "", fmt.Errorf("%w: %v", errScan, err)
	}
	return out, nil
}

// skipString passes over a string; simple means it has no escapes.
func (s *scanner) skipString() (start int, simple bool, err error) {
	if s.peek() != '"' {
		return 0, false, fmt.Errorf("%w at byte %d: want a string", errScan, s.i)
	}
	start = s.i
	simple = true
	s.i++
	for s.i < len(s.b) {
		switch c := s.b[s.i]; {
		case c == '"':
			s.i++
			return start, simple, nil
		case c == '\\':
			simple = false
			s.i += 2
			continue
		case c < 0x20:
			return 0, false, fmt.Errorf("%w at byte %d: control character in string", errScan, s.i)
		}
		s.i++
	}
	return 0, false, fmt.Errorf("%w: unterminated string", errScan)
}

// uint reads a non-negative integer that fits uint32.
func (s *scanner) uint() (uint32, error) {
	s.ws()
	start := s.i
	for s.i < len(s.b) && s.b[s.i] >= '0' && s.b[s.i] <= '9' {
		s.i++
	}
	n, err := strconv.ParseUint(string(s.b[start:s.i]), 10, 32)
	if err != nil {
		return 0, fmt.Errorf("%w at byte %d: want an id: %v", errScan, start, err)
	}
	return uint32(n), nil
}

// skip passes over one value and returns its bytes.
func (s *scanner) skip() ([]byte, error) {
	s.ws()
	start := s.i
	depth := 0
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			if _, _, err := s.skipString(); err != nil {
				return nil, err
			}
			if depth == 0 {
				return s.b[start:s.i], nil
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			if depth == 0 { // end of a scalar inside the enclosing container
				return s.b[start:s.i], nil
			}
			depth--
			if depth == 0 {
				s.i++
				return s.b[start:s.i], nil
			}
		case ',':
			if depth == 0 {
				return s.b[start:s.i], nil
			}
		}
		s.i++
	}
	if depth == 0 && s.i > start {
		return s.b[start:s.i], nil
	}
	return nil, fmt.Errorf("%w: unexpected end", errScan)
}

// fields reads an object into raw values by key (values are not copied).
func (s *scanner) fields() (map[string][]byte, error) {
	out := map[string][]byte{}
	err := s.object(func(k string) error {
		v, err := s.skip()
		out[k] = v
		return err
	})
	return out, err
}

// object calls f for each key; f must consume the value.
func (s *scanner) object(f func(key string) error) error {
	if err := s.expect('{'); err != nil {
		return err
	}
	if s.peek() == '}' {
		s.i++
		return nil
	}
	for {
		k, err := s.str()
		if err != nil {
			return err
		}
		if err := s.expect(':'); err != nil {
			return err
		}
		if err := f(k); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case '}':
			s.i++
			return nil
		default:
			return fmt.Errorf("%w at byte %d: want , or }", errScan, s.i)
		}
	}
}

// array calls f for each element; f must consume it.
func (s *scanner) array(f func() error) error {
	if err := s.expect('['); err != nil {
		return err
	}
	if s.peek() == ']' {
		s.i++
		return nil
	}
	for {
		if err := f(); err != nil {
			return err
		}
		switch s.peek() {
		case ',':
			s.i++
		case ']':
			s.i++
			return nil
		default:
			return fmt.Errorf("%w at byte %d: want , or ]", errScan, s.i)
		}
	}
}

// scanVocab reads {"token": id, ...}.
func scanVocab(raw []byte) (map[string]uint32, error) {
	s := &scanner{b: raw}
	vocab := make(map[string]uint32, len(raw)/16)
	err := s.object(func(k string) error {
		id, err := s.uint()
		if err == nil {
			vocab[k] = id
		}
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("vocab: %w: %v", ErrInvalid, err)
	}
	return vocab, nil
}

// scanMerges reads ["a b", ...] or [["a", "b"], ...].
func scanMerges(raw []byte) ([][2]string, error) {
	s := &scanner{b: raw}
	var out [][2]string
	err := s.array(func() error {
		if s.peek() == '[' {
			var pair [2]string
			n := 0
			err := s.array(func() error {
				str, err := s.str()
				if err == nil && n < 2 {
					pair[n] = str
				}
				n++
				return err
			})
			if err == nil && n != 2 {
				err = fmt.Errorf("%w: merge with %d parts", errScan, n)
			}
			out = append(out, pair)
			return err
		}
		str, err := s.str()
		if err != nil {
			return err
		}
		a, b, ok := cutSpace(str)
		if !ok {
			return fmt.Errorf("%w: merge %q has no space", errScan, str)
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
