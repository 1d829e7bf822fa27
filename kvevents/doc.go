// Package kvevents owns the engine side of kvmesh's cache view: the vLLM/SGLang
// KV-event wire format (ZMQ SUB + DEALER replay, msgpack decoding of every
// schema version, sequence, gap and restart handling), the canonical kvmesh
// block key (DESIGN.md Contract 1), and the kvmesh delta and snapshot messages
// that sidecars publish (Contract 2).
//
// It must not know about NATS, gossip or scheduling: it turns engine bytes into
// typed events and keys, and kvmesh messages into bytes and back.
package kvevents
