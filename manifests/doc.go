// Package manifests holds kvmesh's Kubernetes manifests (kustomize bases,
// overlays, CRDs, dashboards) and the tests that prove them: every overlay
// renders and is accepted by a real kube-apiserver (server-side dry run), the
// NATS configuration's users can do exactly what their role needs, and every
// dashboard query names a metric that a running mesh exports.
package manifests
