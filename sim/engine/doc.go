// Package engine is the core of the kvmesh engine simulator: a paged KV cache
// with vLLM's semantics, a continuous-batching scheduler and a roofline timing
// model. It is pure and clock-free: the caller passes the current time into
// every call and the engine answers with how long the work took, so the same
// code runs in real time (sim drives it from one goroutine per engine)
// and in virtual time (the discrete-event benchmark drives thousands of them).
//
// It owns: block allocation and LRU eviction, prefix-cache lookups, the optional
// CPU tier, preemption, batching, step timing, per-request results, load
// counters and the KV events those produce (handed to an EventSink).
// It must not touch the network, a wall clock, goroutines or global state, and
// it knows nothing about HTTP, ZMQ or kvmesh keys.
//
// An Engine is not safe for concurrent use; its owner serialises calls.
package engine
