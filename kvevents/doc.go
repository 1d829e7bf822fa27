// Package kvevents owns the engine side of kvmesh's cache view: the vLLM/SGLang
// KV-event wire format (ZMQ SUB + DEALER replay, msgpack decoding of every
// schema version, sequence, gap and restart handling), the canonical kvmesh
// block key (DESIGN.md Contract 1), and the kvmesh delta and snapshot messages
// that sidecars publish (Contract 2).
//
// It must not know about NATS, gossip or scheduling: it turns engine bytes into
// typed events and keys, and kvmesh messages into bytes and back.
//
// Files by concern:
//   - types.go: Batch, Event, Tier — the decoded form everyone shares.
//   - key.go: Root, ChainKey, AppendKeys — Contract 1, zero-copy and allocation-free.
//   - msgpack.go, decode.go, encode.go: DecodeBatch (every form of the spec,
//     reusing the destination's slices) and AppendBatch (byte-exact msgspec
//     output in ArrayForm or MapForm).
//   - subscriber*.go, replay.go: Subscriber — one engine's ranks over ZMQ, with
//     gap replay, restart and lost-history signals, through a bounded queue.
//   - publisher.go: Publisher — a vLLM-faithful PUB + ROUTER replay publisher
//     with fault switches, used by the simulator and the tests.
//   - endpoint.go: vLLM's bind/connect rule and DP-rank port offsets.
//   - metrics.go: the subscriber's kvmesh_kvevents_* Prometheus counters.
//   - delta*.go: kvmesh deltas and snapshots (owned by the mesh component).
//
// Concurrency: DecodeBatch, AppendBatch and the key functions are pure and
// safe for concurrent use. A Subscriber runs one goroutine that owns all of
// its sockets; Next must be called from one goroutine. Publisher.Publish is
// safe for concurrent use; its replay service runs in one owned goroutine.
package kvevents
