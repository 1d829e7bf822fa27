// Package kvtest is a vLLM-faithful KV-event publisher and encoder for
// tests and the engine simulator, as net/http/httptest is for HTTP: a
// PUB/ROUTER Publisher per DP rank with vLLM's sequence numbers, replay
// buffer and both replay layouts, fault injection (DropRate, DropNext,
// Restart), and AppendBatch, byte-exact msgspec output in ArrayForm or
// MapForm. Production binaries (the sidecar, the ingress) must not import
// it; kvevents holds only the receiving side.
package kvtest
