// Package kubetest starts a real kube-apiserver backed by a real etcd on
// loopback for integration tests, so controllers, CRDs, RBAC and admission
// webhooks are tested against the API server's own validation, storage and
// admission chain instead of a fake clientset.
//
// The binaries come from hack/kube-bins.sh (built from the Go module proxy and
// cached under $HOME/.cache/kvmesh/kube), or from the directory named by
// KVMESH_KUBE_BIN_DIR. When they are missing a test is skipped, unless CI=true:
// then the script builds them (6–8 minutes cold on 2 cores) and a failure
// fails the test. `make kube-bins` prebuilds them.
//
// There is no kubelet, scheduler or kube-controller-manager: pods stay
// Pending, no garbage collector runs and no ServiceAccount token controller
// exists (the ServiceAccount admission plugin is disabled; tokens are minted
// through the TokenRequest API, which the API server serves itself).
//
// The package owns the two processes and their temporary directory; it must
// not leave either running: Stop (or the test's Cleanup) terminates both and
// removes the directory, and the children get SIGKILL if the test binary dies.
package kubetest
