// Package sidecar owns one engine's (or, in DaemonSet mode, each local
// engine's) authoritative cache view: it consumes the engine's KV events
// (kvevents.Subscriber), maps engine block hashes to kvmesh keys with
// reference counts per tier, publishes the changes as deltas on NATS
// JetStream, answers snapshot requests (DESIGN.md Contract 2), scrapes the
// engine's /metrics, gossips load, delta head and key-set digest (Contract 3),
// and serves /health, /ready and /metrics.
//
// It must not know how deltas are applied (ingress/materialize) or how
// engines are scored (scheduler).
//
// Deltas are per engine, not per DP rank: a DP engine is one routing target
// (vLLM balances over its ranks behind one API server), so its key set is the
// union over ranks, with a key present while any rank holds it. Reference
// counts are kept per (rank, engine hash, tier) and per (key, tier), so a
// rank restart removes exactly what only that rank held.
//
// Lost history policy (ResyncPolicy). vLLM has no API to list its cache, so
// when the subscriber reports batches that can no longer be replayed the
// sidecar either
//   - "rebuild" (default): drops that rank's state and rebuilds from the
//     batches that follow. Blocks stored in the hole and their descendants are
//     unknown (counted as orphans) until the engine evicts and stores them
//     again: the view under-reports, it never routes to blocks that are gone.
//     This never costs the engine anything, which is why it is the default.
//   - "reset-engine": POSTs /reset_prefix_cache?reset_running_requests=true
//     (SGLang's /flush_cache when that is not found, remembered) so the
//     engine clears its cache and emits AllBlocksCleared: exact again at
//     once, at the price of the engine's whole prefix cache. Only the event
//     confirms a reset (vLLM answers 200 even when it could not); retried.
package sidecar
