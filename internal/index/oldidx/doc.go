// Package index owns kvmesh's compact prefix index: chain keys (DESIGN.md
// Contract 1) mapped to the engines that hold them, with a tier per entry and
// short-lived speculative entries for keys just routed to an engine.
//
// Keys are global across models (the model is part of the root hash), so one
// Index serves every model. It must not know about NATS, gossip, HTTP or
// scheduling policy: writers tell it what an engine holds, readers ask how deep
// each engine matches a request's key chain.
//
// Concurrency: every method is safe for concurrent use. Writes (Store, Remove,
// ClearEngine, AddSpeculative, ExpireSpeculative) take the write lock for one
// whole call, so a delta is applied atomically; Lookup takes the read lock
// once per call. Writers are expected to be few (one goroutine per source);
// readers many.
//
// Why one RWMutex and not shards: a lookup walks a request's whole key
// chain (up to thousands of keys spread uniformly over the table), so a
// sharded index would take most shard locks per lookup anyway, and a delta
// must be applied atomically. One read lock per lookup (a few µs) and one
// write lock per delta measured better than per-key shard locking
// (BenchmarkLookupParallel, docs/bench/scheduler.md).
//
// Layout: an open-addressing table of 16-byte buckets (key + four 16-bit
// engine elements: 12-bit slot, 3 tier bits, 1 speculative bit), overflow
// lists for keys on more than four engines. Engine ids map to small slots
// (at most MaxEngines per Index).
package oldidx
