// Package local runs ModelDeployments and AutoscalingPolicies on one machine:
// each role's replicas are `kvmesh sim` + `kvmesh sidecar` child processes on
// loopback, the mesh's gossip is joined as an observer (as the ingress does),
// and the policies are stepped by orchestrator/autoscale, the same code the
// Kubernetes controller runs. It owns the child processes it starts and
// stops every one of them before Run returns; it must not touch Kubernetes.
//
// Files: spec.go reads the YAML; process.go one child process; replica.go a
// sim + sidecar pair; backend.go the process supervisor (the Backend the
// reconcile step scales); reconcile.go the autoscale step; run.go the
// lifecycle; status.go what is reported.
package local
