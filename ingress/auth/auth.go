// Package auth checks the ingress's API keys: bearer tokens loaded from a file and/or
// an environment variable, compared in constant time, each mapped to a stable identity
// (its name) that the rate limiter and the access log use.
//
// It owns key parsing and checking only: it does not write HTTP responses (the ingress
// maps ErrUnauthorized to a 401 OpenAI error body) and it never logs a key.
package auth

import (
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"strings"
)

// Sentinel errors. ErrMissingKey and ErrInvalidKey wrap ErrUnauthorized, so the edge
// needs one errors.Is to choose the 401.
var (
	ErrUnauthorized  = errors.New("unauthorized")
	ErrMissingKey    = fmt.Errorf("%w: missing bearer API key", ErrUnauthorized)
	ErrInvalidKey    = fmt.Errorf("%w: invalid API key", ErrUnauthorized)
	ErrMalformed     = errors.New("malformed key entry")
	ErrDuplicateKey  = errors.New("duplicate key")
	ErrDuplicateName = errors.New("duplicate name")
	ErrConfig        = errors.New("invalid auth config")
)

// Anonymous is the identity of every request when no keys are configured.
const Anonymous = "anonymous"

// DefaultEnvVar is where keys are read from when Config.EnvVar is empty.
const DefaultEnvVar = "KVMESH_API_KEYS"

// Config says where the keys come from. Keys from both sources are merged; a key or
// name present twice is an error. With no keys at all, auth is off (every request is
// Anonymous) unless Required is set.
type Config struct {
	// KeysFile is a file in the ParseKeys format; "" means none.
	KeysFile string
	// EnvVar names an environment variable in the same format (entries may be separated
	// by ','). "" means DefaultEnvVar; "-" disables the environment.
	EnvVar string
	// Required makes Load fail when no key is configured, and when a source it names
	// holds none (KeysFile, or EnvVar when that variable is set, even to ""), so a
	// misconfigured deployment (a keys file of comments, an empty Secret) does not
	// silently run open.
	Required bool
}

// envName is the environment variable cfg reads, "" for none.
func (c Config) envName() string {
	switch c.EnvVar {
	case "":
		return DefaultEnvVar
	case "-":
		return ""
	}
	return c.EnvVar
}

// Sources says where cfg's keys come from, for logs: the keys file and/or the
// environment variable when it is set.
func (c Config) Sources() []string {
	var out []string
	if c.KeysFile != "" {
		out = append(out, c.KeysFile)
	}
	if env := c.envName(); env != "" {
		if _, set := os.LookupEnv(env); set {
			out = append(out, "$"+env)
		}
	}
	return out
}

// DefaultConfig reads keys from KVMESH_API_KEYS only and allows running without keys.
func DefaultConfig() Config { return Config{EnvVar: DefaultEnvVar} }

// Validate lists every problem with the configuration.
func (c Config) Validate() error {
	var errs []error
	if c.KeysFile != "" {
		if st, err := os.Stat(c.KeysFile); err != nil {
			errs = append(errs, fmt.Errorf("%w: keys file: %w", ErrConfig, err))
		} else if st.IsDir() {
			errs = append(errs, fmt.Errorf("%w: keys file %q is a directory", ErrConfig, c.KeysFile))
		}
	}
	if strings.ContainsAny(c.EnvVar, "= \t") {
		errs = append(errs, fmt.Errorf("%w: env var name %q", ErrConfig, c.EnvVar))
	}
	return errors.Join(errs...)
}

// Store holds the configured keys. It is immutable after Load, so Check is safe for
// concurrent use without locks.
type Store struct {
	// byPrefix buckets keys by the first 8 bytes of their SHA-256; a bucket holds every
	// key sharing that prefix (almost always one) and is searched with constant-time
	// compares of the full digest.
	byPrefix map[uint64][]digestEntry
	n        int
}

type digestEntry struct {
	sum  [sha256.Size]byte
	name string
}

// Load reads the keys named by cfg.
func Load(cfg Config) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	var file, env []byte
	if cfg.KeysFile != "" {
		b, err := os.ReadFile(cfg.KeysFile)
		if err != nil {
			return nil, fmt.Errorf("auth: read keys file: %w", err)
		}
		file = b
	}
	name := cfg.envName()
	v, envSet := "", false
	if name != "" {
		v, envSet = os.LookupEnv(name)
		env = []byte(v)
	}
	var srcs []keySource
	if file != nil {
		srcs = append(srcs, keySource{name: cfg.KeysFile, r: bytes.NewReader(file)})
	}
	if envSet {
		srcs = append(srcs, keySource{name: "$" + name, r: bytes.NewReader(env)})
	}
	entries, err := parseSources(srcs...)
	if err != nil {
		return nil, fmt.Errorf("auth: %w", err)
	}
	if cfg.Required {
		// Each source named must hold a key on its own: one that holds none is a
		// mistake (a file of comments, an empty Secret) even when the other has some.
		if cfg.KeysFile != "" && countKeys(file) == 0 {
			return nil, fmt.Errorf("auth: %w: keys file %q holds no key", ErrConfig, cfg.KeysFile)
		}
		if envSet && countKeys(env) == 0 {
			return nil, fmt.Errorf("auth: %w: $%s is set but holds no key (unset it to run without keys)", ErrConfig, name)
		}
		if len(entries) == 0 {
			return nil, fmt.Errorf("auth: %w: keys are required but none are configured", ErrConfig)
		}
	}
	return NewStore(entries), nil
}

// countKeys is the number of entries in src, which the merged parse has
// already checked.
func countKeys(src []byte) int {
	entries, _ := ParseKeys(bytes.NewReader(src))
	return len(entries)
}

// NewStore builds a Store from parsed entries (later duplicates replace earlier ones;
// ParseKeys already rejects duplicates).
func NewStore(entries []Entry) *Store {
	s := &Store{byPrefix: make(map[uint64][]digestEntry, len(entries))}
	for _, e := range entries {
		sum := sha256.Sum256([]byte(e.Key))
		p := binary.LittleEndian.Uint64(sum[:8])
		s.byPrefix[p] = append(s.byPrefix[p], digestEntry{sum: sum, name: e.Name})
		s.n++
	}
	return s
}

// Enabled reports whether any key is configured; when false, Check admits everyone.
func (s *Store) Enabled() bool { return s != nil && s.n > 0 }

// Len is the number of configured keys.
func (s *Store) Len() int {
	if s == nil {
		return 0
	}
	return s.n
}

var bearer = []byte("bearer ")

// Check authenticates an Authorization header value ("Bearer <key>") and returns the
// key's name. It does not allocate. The presented key is hashed first and looked up by
// hash, so timing does not depend on how much of a real key was guessed; the full
// digests are then compared in constant time.
func (s *Store) Check(authorization []byte) (string, error) {
	if !s.Enabled() {
		return Anonymous, nil
	}
	h := bytes.TrimSpace(authorization)
	if len(h) < len(bearer) || !bytes.EqualFold(h[:len(bearer)], bearer) {
		return "", ErrMissingKey
	}
	key := bytes.TrimSpace(h[len(bearer):])
	if len(key) == 0 {
		return "", ErrMissingKey
	}
	sum := sha256.Sum256(key)
	name := ""
	for _, e := range s.byPrefix[binary.LittleEndian.Uint64(sum[:8])] {
		if subtle.ConstantTimeCompare(sum[:], e.sum[:]) == 1 {
			name = e.name
		}
	}
	if name == "" {
		return "", ErrInvalidKey
	}
	return name, nil
}
