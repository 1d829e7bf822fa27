// Package gossip owns kvmesh's membership layer (DESIGN.md Contract 3): a
// hashicorp/memberlist cluster of sidecars, ingresses and orchestrators with
// node metadata, per-engine load and key-set digest broadcasts, per-ingress
// in-flight counts, small opaque application blobs (e.g. rate-limit usage),
// encryption with a shared key, and failure detection that removes a dead
// sidecar's engines from every member's view within seconds.
//
// It carries state; it does not interpret it. It must not touch NATS, the
// index or the scheduler: those read the view through Node's methods.
package gossip
