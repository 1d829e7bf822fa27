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
// (BenchmarkLookupParallel, docs/BENCHMARKS.md).
//
// Layout: an open-addressing table of 16-byte buckets (key + four 16-bit
// engine elements: 12-bit slot, 3 tier bits, 1 speculative bit), homed on
// 64-byte lines; keys on more than four engines keep two elements inline and
// the rest in 64-byte chunks of one arena. Engine ids map to small slots (at
// most MaxEngines at once; ClearEngine releases a slot for reuse, so engines
// that come and go do not use them up). Large arrays live in their own
// mappings backed by transparent huge pages on Linux (mem_linux.go).
//
// Lookup searches a chain by default (search.go): it probes spread-out keys
// in rounds and applies the spans between probes with equal elements by
// their length, which is exact because engines hold prefixes of chains. The
// scan (Config.ExactLookup, and the fallback) is a software pipeline over
// batches of keys (lookup.go): prefetch
// the home lines of keys two batches ahead, resolve the next batch, extend
// depths with the current one, and apply runs of keys with identical
// elements (a chain held by the same engines) in one step. On amd64 the
// prefetch is one PREFETCHT0 loop in assembly (prefetch_amd64.s): Go has no
// prefetch intrinsic, and plain loads would hold the reorder buffer.
package index
