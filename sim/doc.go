// Package sim is the kvmesh engine simulator's server (`kvmesh sim`): vLLM's
// OpenAI-compatible HTTP API, /metrics with vLLM's metric names, and vLLM's
// ZMQ KV-event publishing, in front of one sim/engine per data-parallel
// rank driven in (scaled) real time by one goroutine each.
//
// It owns the HTTP surface, the real-time drivers, text ↔ token handling and
// the metrics registry of one simulator instance (many run in one process in
// tests). It must not model the engine itself (sim/engine does), encode
// events (kvtest.Publisher does) or know about routing.
package sim
