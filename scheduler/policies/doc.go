// Package policies holds kvmesh's routing policies: the baselines (random,
// round-robin, least-request), emulations of published routers as they ship
// (kthena and kthena-kvcache, ray, sglang, dynamo, llmd and llmd-precise;
// each file cites its upstream source, docs/EMULATIONS.md lists every known
// deviation), and kvmesh's own estimated-cost policy. Every policy is safe
// for concurrent use.
//
// The package must not touch the index or the network: it sees the
// candidates the framework prepared (load view plus matched prefix depth
// from KV events) and, where the published router keeps its own state, that
// state: the approximate prefix trees and hash LRUs of what it routed
// (History: SGLang, Ray, llm-d's approximate scorer, Kthena's prefix-cache),
// with their upstream sizes and eviction, and Dynamo's active-sequence
// tracking (ActiveBlocks). A policy that routes on its own history never
// hears of an engine's evictions, as upstream.
package policies
