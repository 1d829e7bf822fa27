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
//   - msgpack.go, decode.go: DecodeBatch (every form of the spec, reusing the
//     destination's slices).
//   - subscriber*.go, replay.go: Subscriber — one engine's ranks over ZMQ, with
//     gap replay, restart and lost-history signals, through a bounded queue.
//   - endpoint.go (and internal/endpoint): vLLM's bind/connect rule and
//     DP-rank port offsets.
//   - metrics.go: the subscriber's kvmesh_kvevents_* Prometheus counters.
//   - delta*.go: kvmesh deltas and snapshots (owned by the mesh component).
//
// The sending side (a vLLM-faithful publisher and the msgspec encoder) is in
// kvevents/kvtest, for the simulator and tests only, so the sidecar does not
// link it; both share internal/wire (msgpack writing) and internal/endpoint.
//
// Concurrency: DecodeBatch and the key functions are pure and safe for
// concurrent use. A Subscriber runs one goroutine that owns all of its
// sockets; Next must be called from one goroutine.
package kvevents
