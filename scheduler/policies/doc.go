// Package policies holds kvmesh's routing policies: the baselines (random,
// round-robin, least-request), faithful emulations of published routers'
// defaults (kthena, ray, sglang, dynamo, llmd; each file cites its source),
// and kvmesh's own estimated-TTFT policy. Every policy is safe for
// concurrent use and allocation-free per decision.
//
// The package must not touch the index or the network: it sees only the
// candidates the framework prepared (load view plus matched prefix depth).
//
// Where a published router keeps its own approximate view (SGLang's and
// Ray's router-side prefix trees of what they routed, Dynamo's active
// sequence tracking), the emulation reads the equivalent kvmesh view: the
// index including speculative entries (routed, not yet confirmed) and the
// router-local in-flight counters. That view is at least as accurate as
// theirs, so an emulation is never handicapped by kvmesh's plumbing.
package policies
