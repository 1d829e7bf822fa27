// Package webhook is kvmesh's mutating admission webhook: pods labelled
// kvmesh.io/inject=true get the kvmesh sidecar as a native sidecar (an init
// container with restartPolicy Always, Kubernetes ≥ 1.29) wired to the
// engine's ports in the same pod: KV events, replay and the engine's HTTP
// port (metrics). Ports come from the pod's annotations
// (kvmesh.io/engine-port, kvmesh.io/kv-events-port, kvmesh.io/replay-port)
// with vLLM's defaults.
//
// The package owns the HTTPS server, its serving certificate (CertSource:
// the Secret kvmesh-webhook-tls it creates and renews, mounted files, or one
// generated in memory) and the CA bundle of the MutatingWebhookConfiguration
// it registers, kept in step with every rotation. It must not mutate
// anything but pods that ask for injection, nor write a Secret cert-manager
// issued.
package webhook
