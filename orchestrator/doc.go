// Package orchestrator runs kvmesh's Kubernetes controller: it turns each
// ModelDeployment (kvmesh.io/v1alpha1) into engine pods grouped by group,
// role and replica, keeps one RoleScaler per role so HPA or KEDA can scale a
// role alone, rolls template changes within each role's maxUnavailable,
// recreates failed pods per the recovery policy, creates each new group as a
// gang, and cleans up through a finalizer.
//
// The controller is level-triggered: informers feed a rate-limited work
// queue of ModelDeployment keys, and each reconcile reads the cached world,
// computes a plan (plan.go, a pure function with table tests) and takes one
// step toward the spec. Status goes through the status subresource with
// conditions; events record what an operator should see. Leader election on
// a Lease keeps one active replica.
//
// Why pods and not StatefulSets or LeaderWorkerSets: a group spans several
// roles that must be created together (gang), recreated together (the
// GroupRecreate policy) and rolled per role within maxUnavailable with a
// partition; one StatefulSet per role could not express the cross-role
// gang or group recovery, and LeaderWorkerSet is an optional add-on CRD.
// Managing pods directly (as Kthena's ModelServing does) keeps all three in
// one plan.
//
// Deletion: owner references point every child at its ModelDeployment, but
// the garbage collector runs in kube-controller-manager; the finalizer
// kvmesh.io/cleanup deletes children explicitly so cleanup does not depend
// on it (and works in the tests, which run no controller-manager).
package orchestrator
