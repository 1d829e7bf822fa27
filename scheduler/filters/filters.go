// Package filters holds kvmesh's scheduler filters: health, model, role,
// LoRA and max-waiting. Each is a stateless value safe for concurrent use.
// It must not touch the index, the network or the policies.
package filters

import (
	"errors"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/kvmesh/kvmesh/scheduler"
)

var (
	_ scheduler.Filter = Health{}
	_ scheduler.Filter = Model{}
	_ scheduler.Filter = Role{}
	_ scheduler.Filter = MaxWaiting{}
	_ scheduler.Filter = LoRA{}
)

// Config is the filters block of a SchedulerConfig. Health, model and role
// always run; the others as configured.
type Config struct {
	// MaxWaiting drops engines with more waiting requests; 0 disables.
	MaxWaiting int `yaml:"maxWaiting"`
	// StrictLoRA keeps only engines with the request's adapter loaded.
	StrictLoRA bool `yaml:"strictLoRA"`
}

// Validate lists every problem, with paths under name.
func (c Config) Validate(name string) error {
	p := scheduler.NewProblems(name)
	p.NonNegativeInt("maxWaiting", c.MaxWaiting)
	return errors.Join(p.Errs()...)
}

// Factory is the scheduler.FilterFactory of the filter chain: health,
// model and role always; LoRA and max-waiting as configured.
func Factory(name string, params *yaml.Node) ([]scheduler.Filter, error) {
	c, err := scheduler.ParseParams(name, params, Config{})
	if err != nil {
		return nil, err
	}
	fs := []scheduler.Filter{Health{}, Model{}, Role{}}
	if c.StrictLoRA {
		fs = append(fs, LoRA{Strict: true})
	}
	if c.MaxWaiting > 0 {
		fs = append(fs, MaxWaiting{Limit: c.MaxWaiting})
	}
	return fs, nil
}

// Health keeps healthy engines.
type Health struct{}

// Name implements scheduler.Filter.
func (Health) Name() string { return "health" }

// Keep implements scheduler.Filter.
func (Health) Keep(_ *scheduler.Request, c *scheduler.Candidate) bool { return c.Healthy }

// Model keeps engines serving the request's model (an empty request model
// matches any engine, for single-model deployments).
type Model struct{}

// Name implements scheduler.Filter.
func (Model) Name() string { return "model" }

// Keep implements scheduler.Filter.
func (Model) Keep(r *scheduler.Request, c *scheduler.Candidate) bool {
	return r.Model == "" || c.Model == "" || c.Model == r.Model
}

// Role keeps engines of the request's role, and mixed engines for any role.
type Role struct{}

// Name implements scheduler.Filter.
func (Role) Name() string { return "role" }

// Keep implements scheduler.Filter.
func (Role) Keep(r *scheduler.Request, c *scheduler.Candidate) bool {
	return c.Role == scheduler.RoleMixed || c.Role == r.Role || r.Role == scheduler.RoleMixed
}

// MaxWaiting drops engines whose waiting queue exceeds Limit. Limit 0
// disables the filter. When it drops every engine Schedule returns
// ErrNoCandidates and the ingress sheds the request (429/503).
//
// The queue is the larger of the engine's report (a snapshot, up to a
// scrape interval old) and the requests the routers have in flight there
// beyond its running batch: a burst sent within one scrape interval is in
// InFlight at once, where the snapshot would let all of it through (150
// requests at once took queues to 30–66 against a limit of 4).
type MaxWaiting struct{ Limit int }

// Name implements scheduler.Filter.
func (MaxWaiting) Name() string { return "max-waiting" }

// Keep implements scheduler.Filter.
func (f MaxWaiting) Keep(_ *scheduler.Request, c *scheduler.Candidate) bool {
	return f.Limit <= 0 || c.Queued() <= f.Limit
}

// LoRA keeps engines that have the request's adapter loaded, when Strict;
// otherwise it keeps every engine (the LoRA scorer prefers loaded ones).
type LoRA struct{ Strict bool }

// Name implements scheduler.Filter.
func (LoRA) Name() string { return "lora" }

// Keep implements scheduler.Filter.
func (f LoRA) Keep(r *scheduler.Request, c *scheduler.Candidate) bool {
	return !f.Strict || r.LoRA == "" || slices.Contains(c.LoRAs, r.LoRA)
}
