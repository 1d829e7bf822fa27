// Package ingress is kvmesh's stateless OpenAI-compatible router (DESIGN.md
// Contract 4): it parses a request, tokenizes it, computes the canonical block
// keys, asks the scheduler for an engine using the local index and the gossip
// load view, and proxies the request, streaming SSE through as it arrives and
// retrying on the next-best engine only before the first byte reached the
// client. A batch of prompts goes to one engine, routed on its first prompt.
// A client that goes away cancels its upstream request: a stream when its
// body is closed, a buffered answer through a connection watcher
// (clientwatch.go).
//
// It owns the HTTP edge (status codes and OpenAI error bodies), upstream
// connections, in-flight accounting, metrics, the access log and the debug
// endpoints. It does not own the index (index, fed by
// ingress/materialize), the scheduling policy (scheduler/), gossip
// membership (gossip/), tokenization (internal/tokenizer) or API keys, rate
// limits and sessions (ingress/auth, ingress/ratelimit, ingress/session): it
// reaches all of them through the small interfaces in deps.go.
package ingress
