// Package des is kvmesh's discrete-event routing benchmark: the real index
// and scheduler (every policy) against simulated engines (sim/engine,
// the simulator's cache and timing model) in virtual time, so 1,000+
// engines and hour-long traces run on one machine in seconds.
//
// It models what a real deployment's router sees and nothing more: cache
// state only through the engines' KV events (translated to kvmesh keys as
// a sidecar does, optionally delayed by a propagation latency), engine load
// only through periodic snapshots (gossip-like staleness), plus the
// router's own in-flight bookkeeping, which is always fresh.
//
// The package owns the event loop, the client model (arrivals, a
// concurrency limit) and the metrics. It must not change the engine model
// or the policies; it only drives them.
package des
