// Package mesh holds kvmesh's cache-state integration tests: engines
// (the kvmesh simulator, or meshtest.Cache where a test needs exact control of
// the event stream), sidecars, an in-process NATS server, memberlist gossip
// and several materializers on loopback. Every test asserts that each
// materializer's key set per engine and tier equals the engine's own cache
// exactly, after random load and after each fault.
package mesh
