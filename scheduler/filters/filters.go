// Package filters holds kvmesh's scheduler filters: health, model, role,
// LoRA and max-waiting. Each is a stateless value safe for concurrent use.
// It must not touch the index, the network or the policies.
package filters

import (
	"slices"

	"github.com/kvmesh/kvmesh/scheduler"
)

var (
	_ scheduler.Filter = Health{}
	_ scheduler.Filter = Model{}
	_ scheduler.Filter = Role{}
	_ scheduler.Filter = MaxWaiting{}
	_ scheduler.Filter = LoRA{}
)

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

// MaxWaiting drops engines whose waiting queue (snapshot) exceeds Limit.
// Limit 0 disables the filter. When it drops every engine Schedule returns
// ErrNoCandidates and the ingress sheds the request (429/503).
type MaxWaiting struct{ Limit int }

// Name implements scheduler.Filter.
func (MaxWaiting) Name() string { return "max-waiting" }

// Keep implements scheduler.Filter.
func (f MaxWaiting) Keep(_ *scheduler.Request, c *scheduler.Candidate) bool {
	return f.Limit <= 0 || c.Waiting <= f.Limit
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
