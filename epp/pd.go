package epp

import (
	"github.com/kvmesh/kvmesh/ingress"
	"github.com/kvmesh/kvmesh/scheduler"
)

// P/D through llm-d's routing sidecar: the picker routes a disaggregated
// request to a decode engine and names the prefill engine in the
// x-prefiller-host-port header; the decode pod's sidecar runs the prefill
// there first and then the decode locally (the NIXL handshake is the
// sidecar's). Existing llm-d decode sidecars work unchanged.

// PDConfig turns P/D on. The zero value is off.
type PDConfig struct {
	// Enabled turns P/D on: destinations are then decode (or mixed)
	// engines only, and Disaggregator decides per request.
	Enabled bool `yaml:"enabled"`
	// MinUncachedTokens is the built-in rule's threshold: a request whose
	// uncached prompt on the chosen decode engine is at least this long is
	// prefilled elsewhere. Zero: 512.
	MinUncachedTokens int `yaml:"minUncachedTokens"`
}

// DefaultPDConfig is P/D off with the built-in rule's default threshold.
func DefaultPDConfig() PDConfig { return PDConfig{MinUncachedTokens: 512} }

func (c *PDConfig) problems(bad func(string, ...any)) {
	if c.MinUncachedTokens < 0 {
		bad("pd.minUncachedTokens must be >= 0, got %d", c.MinUncachedTokens)
	}
}

// Disaggregator decides whether one request is prefilled on another engine.
// It is the hook the scheduler's P/D step plugs into: the P/D router on the
// pdrouter branch (scheduler/pd.Router.Route) takes exactly
// p.Request() and p.Engines() and returns a plan whose Prefill names the
// engine; an adapter is a few lines once that package is on main. Prefill is called
// on the stream's goroutine, concurrently for different requests, and must
// not block.
type Disaggregator interface {
	// Prefill returns the prefill engine's id for a request routed to the
	// decode engine decode, or ok=false to run it whole on decode.
	Prefill(p *ingress.Picked, decode string) (engine string, ok bool)
}

// UncachedThreshold is the built-in Disaggregator: prefill elsewhere when
// the decode engine would have to prefill at least Min tokens itself, on the
// best-ranked prefill engine (the same ranking: its cache hits count).
type UncachedThreshold struct{ Min int }

var _ Disaggregator = UncachedThreshold{}

func (u UncachedThreshold) Prefill(p *ingress.Picked, decode string) (string, bool) {
	ranked := p.Ranked()
	uncached := p.PromptTokens()
	for i := range ranked {
		if ranked[i].Engine == decode {
			uncached = int(float64(p.PromptTokens()) * (1 - ranked[i].Hit))
			break
		}
	}
	if uncached < u.Min {
		return "", false
	}
	for i := range ranked {
		if _, role, ok := p.Candidate(ranked[i].Engine); ok && role == scheduler.RolePrefill {
			return ranked[i].Engine, true
		}
	}
	return "", false
}
