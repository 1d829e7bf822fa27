// Package v1alpha1 holds the kvmesh.io/v1alpha1 API types: ModelDeployment
// (role groups of engines), RoleScaler (one role's /scale handle for HPA or
// KEDA) and AutoscalingPolicy (per-role and P/D-ratio autoscaling). The CRD
// schemas that validate them are in manifests/crds/ and must stay in step.
//
// DeepCopy is a JSON round trip (deepcopy.go) instead of generated code:
// controller-gen is not available here and these objects are small and
// copied only on reconcile, never on a request path.
package v1alpha1
