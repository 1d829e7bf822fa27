// Package openai owns kvmesh's view of the OpenAI HTTP API as vLLM serves it:
// request and response wire types (with vLLM's extras), the OpenAI error body,
// a Server-Sent Events writer, a strict SSE reader (vLLM's framing only) and a
// lenient one (any framing the SSE standard allows, for clients of servers
// other than kvmesh's). The simulator, the
// ingress, the load generator and tests share it so every side speaks the
// same bytes.
//
// It must not know about routing, engines or transports: it turns bytes into
// typed values and back. Every decoder rejects malformed input with an error
// wrapping ErrBadRequest or ErrBadStream; none panics.
package openai
