package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Key limits. Short keys are guessable; long lines are a sign of a wrong file.
const (
	MinKeyLen  = 8
	MaxKeyLen  = 256
	MaxNameLen = 64
	maxLineLen = 4096
)

// Entry is one API key and the identity it authenticates as.
type Entry struct {
	Name string // stable identity, used as the rate-limit key on every replica
	Key  string // the secret; never logged
}

// ParseKeys reads API keys, one per line: "name key" or just "key" (the name is then
// derived from the key's hash, so every replica derives the same one). Blank lines and
// lines starting with '#' are skipped; a ',' also separates entries so the same grammar
// fits an environment variable. Every problem is reported, with its line number.
func ParseKeys(r io.Reader) ([]Entry, error) {
	return parseSources(keySource{r: r})
}

// keySource is one input of parseSources: name labels its problems (a file's path,
// "$VAR"), "" for none.
type keySource struct {
	name string
	r    io.Reader
}

// parseSources parses every source as ParseKeys does, as one set: a key or name given
// twice is refused even across sources, and each problem names its source and line.
func parseSources(srcs ...keySource) ([]Entry, error) {
	var (
		out   []Entry
		errs  []error
		names = map[string]string{}
		keys  = map[string]string{}
	)
	for _, src := range srcs {
		sc := bufio.NewScanner(src.r)
		sc.Buffer(make([]byte, 0, 1024), maxLineLen)
		line := 0
		at := func(line int) string {
			if src.name == "" {
				return fmt.Sprintf("line %d", line)
			}
			return fmt.Sprintf("%s line %d", src.name, line)
		}
		for sc.Scan() {
			line++
			for _, part := range bytes.Split(sc.Bytes(), []byte{','}) {
				e, ok, err := parseEntry(string(bytes.TrimSpace(part)))
				if err != nil {
					errs = append(errs, fmt.Errorf("%s: %w", at(line), err))
					continue
				}
				if !ok {
					continue
				}
				if prev, dup := keys[e.Key]; dup {
					errs = append(errs, fmt.Errorf("%s: %w (first on %s)", at(line), ErrDuplicateKey, prev))
					continue
				}
				if prev, dup := names[e.Name]; dup {
					errs = append(errs, fmt.Errorf("%s: name %q: %w (first on %s)", at(line), e.Name, ErrDuplicateName, prev))
					continue
				}
				keys[e.Key], names[e.Name] = at(line), at(line)
				out = append(out, e)
			}
		}
		if err := sc.Err(); err != nil {
			errs = append(errs, fmt.Errorf("%s: %w: %w", at(line+1), ErrMalformed, err))
		}
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("parse keys: %w", errors.Join(errs...))
	}
	return out, nil
}

// parseEntry parses one "name key" or "key" entry; ok is false for blanks and comments.
func parseEntry(s string) (e Entry, ok bool, err error) {
	if s == "" || s[0] == '#' {
		return Entry{}, false, nil
	}
	fields := strings.Fields(s)
	switch len(fields) {
	case 1:
		e = Entry{Key: fields[0], Name: DerivedName(fields[0])}
	case 2:
		e = Entry{Name: fields[0], Key: fields[1]}
		if err := validName(e.Name); err != nil {
			return Entry{}, false, err
		}
	default:
		return Entry{}, false, fmt.Errorf("%w: want \"name key\" or \"key\", got %d fields", ErrMalformed, len(fields))
	}
	if err := validKey(e.Key); err != nil {
		return Entry{}, false, err
	}
	return e, true, nil
}

// DerivedName is the identity of an unnamed key: "key-" and 12 hex digits of its SHA-256,
// identifying it in logs and limits without revealing it.
func DerivedName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(sum[:6])
}

func validKey(k string) error {
	if len(k) < MinKeyLen || len(k) > MaxKeyLen {
		return fmt.Errorf("%w: key length %d not in [%d, %d]", ErrMalformed, len(k), MinKeyLen, MaxKeyLen)
	}
	for i := 0; i < len(k); i++ {
		if c := k[i]; c <= ' ' || c > '~' {
			return fmt.Errorf("%w: key has a non-printable or non-ASCII byte at %d", ErrMalformed, i)
		}
	}
	return nil
}

func validName(n string) error {
	if n == "" || len(n) > MaxNameLen {
		return fmt.Errorf("%w: name length %d not in [1, %d]", ErrMalformed, len(n), MaxNameLen)
	}
	if n == Anonymous {
		return fmt.Errorf("%w: name %q is reserved", ErrMalformed, n)
	}
	for i := 0; i < len(n); i++ {
		c := n[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.' || c == '@') {
			return fmt.Errorf("%w: name %q: byte %q not in [A-Za-z0-9._@-]", ErrMalformed, n, c)
		}
	}
	return nil
}
