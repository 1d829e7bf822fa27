// Package natsutil owns how kvmesh talks to NATS: connection options (URLs,
// user/password, token, nkey seed, creds file, TLS, reconnects), the embedded
// nats-server with JetStream used when no URL is given, the KVMESH_DELTAS
// stream, and the subject names of DESIGN.md Contract 2 with token escaping.
//
// It knows nothing about what the messages mean: encoding lives in kvevents,
// publishing in sidecar, applying in ingress/materialize.
package natsutil
