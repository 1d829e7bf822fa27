// Package materialize owns the ingress's copy of every engine's cache state:
// it subscribes to the sidecars' deltas on NATS (DESIGN.md Contract 2),
// applies them per engine in sequence, takes a snapshot on first sight, a gap,
// a new epoch, a digest mismatch with gossip (Contract 3) or a NATS reconnect,
// and writes only the resulting set differences into the scheduler's index.
//
// It keeps its own per-engine, per-tier key sets (for digests and for replacing
// an engine's state from a snapshot) and must not touch the index's internals,
// the HTTP server or scheduling: the index is reached through the Index
// interface only.
//
// Catch-up decision: a restarted ingress does not replay JetStream. It lists the
// engines present in the KVMESH_DELTAS stream and in gossip and snapshots each
// one (first sight). A snapshot is exact and bounded by the engine's cache size,
// whereas replaying the stream is bounded by its retention and cannot start from
// an empty index anyway (the stream does not reach back to each epoch's start).
// The stream stays for operators (`nats stream info`, `nats sub`) and for
// discovering engines that are idle while the ingress starts.
package materialize
