package ratelimit

import (
	"errors"
	"fmt"
	"log/slog"
	"time"
)

// Limits caps the tokens one scope (an API key or a model) may use per Config.Window,
// cluster-wide. Zero means unlimited in that dimension.
type Limits struct {
	InputTokens  int64 `yaml:"input_tokens"`  // prompt tokens per window
	OutputTokens int64 `yaml:"output_tokens"` // completion tokens per window
}

func (l Limits) zero() bool { return l.InputTokens == 0 && l.OutputTokens == 0 }

// Config configures a Limiter. Every scope is limited separately: a request must fit
// both its key's limits and its model's limits.
type Config struct {
	// Window is the sliding window the limits apply to. Default one minute, so limits
	// read as tokens per minute. Every replica of a cluster must use the same window.
	Window time.Duration `yaml:"window"`
	// PerKey applies to every API key without an entry in Keys.
	PerKey Limits `yaml:"per_key"`
	// Keys overrides PerKey by key name (auth identity).
	Keys map[string]Limits `yaml:"keys"`
	// PerModel applies to every model without an entry in Models.
	PerModel Limits `yaml:"per_model"`
	// Models overrides PerModel by model name.
	Models map[string]Limits `yaml:"models"`
	// MaxScopes bounds the tracked scopes (memory). When it is full and no idle scope can
	// be dropped, a new scope is not tracked and its requests are admitted (fail open,
	// counted in kvmesh_ratelimit_untracked_total): refusing unknown keys is auth's job.
	MaxScopes int `yaml:"max_scopes"`
	// MaxOrigins bounds how many other replicas' usage is kept; more are ignored.
	MaxOrigins int `yaml:"max_origins"`
	// KeyLimits, when set, is asked for a key's limits on every request:
	// budgets that arrive with the caller (a JWT's rate-limit claim,
	// ingress/auth). Each dimension it sets (> 0) replaces the one of Keys
	// or PerKey; one it leaves 0, or ok false, keeps the operator's. Nothing
	// is cached here, so a key whose caller's budgets are gone (ok false)
	// is back under the operator's limits at once. Must be fast and
	// concurrency-safe.
	KeyLimits func(key string) (l Limits, ok bool) `yaml:"-"`
	// Now is the clock; nil means time.Now. Tests set it.
	Now func() time.Time `yaml:"-"`
	// Logger gets the warnings about other replicas' clocks (MergeState); nil
	// means slog.Default().
	Logger *slog.Logger `yaml:"-"`
}

// DefaultConfig has a one-minute window and no limits (every request is admitted).
func DefaultConfig() Config {
	return Config{Window: time.Minute, MaxScopes: 1 << 16, MaxOrigins: 256}
}

// withDefaults fills zero fields from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	if c.Window == 0 {
		c.Window = d.Window
	}
	if c.MaxScopes == 0 {
		c.MaxScopes = d.MaxScopes
	}
	if c.MaxOrigins == 0 {
		c.MaxOrigins = d.MaxOrigins
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c
}

// Validate lists every problem with the configuration (after defaults).
func (c Config) Validate() error {
	var errs []error
	if c.Window < time.Second || c.Window > 24*time.Hour {
		errs = append(errs, fmt.Errorf("%w: window %v not in [1s, 24h]", ErrConfig, c.Window))
	}
	if c.MaxScopes < 1 {
		errs = append(errs, fmt.Errorf("%w: max_scopes %d < 1", ErrConfig, c.MaxScopes))
	}
	if c.MaxOrigins < 1 {
		errs = append(errs, fmt.Errorf("%w: max_origins %d < 1", ErrConfig, c.MaxOrigins))
	}
	check := func(what string, l Limits) {
		if l.InputTokens < 0 || l.OutputTokens < 0 {
			errs = append(errs, fmt.Errorf("%w: %s: negative limit %+v", ErrConfig, what, l))
		}
	}
	check("per_key", c.PerKey)
	check("per_model", c.PerModel)
	for k, l := range c.Keys {
		check("keys["+k+"]", l)
	}
	for m, l := range c.Models {
		check("models["+m+"]", l)
	}
	return errors.Join(errs...)
}
