// Package scheduler is kvmesh's routing framework: the request and engine
// views a routing decision is made from, the Filter, Scorer and Policy
// extension points, the Scheduler that runs them (clamping, weighting and
// ranking scores itself, not in each plugin), and the versioned
// SchedulerConfig file format.
//
// Plugins live in subpackages (scheduler/filters, scheduler/scorers,
// scheduler/policies). Each owns its parameters: a config struct with
// defaults and Validate, decoded strictly from its block of the file by
// its factory (PolicyFactory, FilterFactory; ParseParams does the work).
// Plugins, the set a Config is built with, is filled explicitly in one
// place, scheduler/registry; the framework decodes only its own fields
// (config.go) and never names a plugin. This package must not import
// them, nor know about
// HTTP, NATS or gossip: a decision is a pure function of (request keys,
// index view, load view) plus the policy's small state (a round-robin
// counter, a seeded random stream).
//
// Prefill/decode disaggregation: call Schedule once with Request.Role =
// RolePrefill and once with RoleDecode (the role filter keeps engines of
// that role plus mixed ones); each call ranks its own candidates.
package scheduler
