package manifests

import (
	"strings"
	"testing"
	"time"
)

// serverShutdown bounds the ingress's listener shutdown after its drain
// (ingress/server.go, Close).
const serverShutdown = 5 * time.Second

// TestIngressRollingRestartKeepsServing: a replica being replaced keeps
// serving while its endpoint removal propagates (a preStop sleep, the
// kubelet's own action: the image needs no shell), and the termination grace
// period covers that sleep, the drain (--drain-timeout) and the listeners'
// shutdown, so Kubernetes does not SIGKILL a drain in progress. Without the
// preStop, requests that still arrived during endpoint propagation got 503
// "ingress is draining" or connection refused.
func TestIngressRollingRestartKeepsServing(t *testing.T) {
	kc := kubectl(t)
	d := find(t, render(t, kc, "base"), "Deployment", "kvmesh-ingress")
	pod := templatePod(t, d, "kvmesh")
	var drain time.Duration
	var preStop time.Duration
	for _, c := range pod.Spec.Containers {
		if c.Name != "ingress" {
			continue
		}
		if c.Lifecycle == nil || c.Lifecycle.PreStop == nil || c.Lifecycle.PreStop.Sleep == nil {
			t.Fatal("the ingress container has no preStop sleep action")
		}
		preStop = time.Duration(c.Lifecycle.PreStop.Sleep.Seconds) * time.Second
		for _, a := range c.Args {
			if v, ok := strings.CutPrefix(a, "--drain-timeout="); ok {
				var err error
				if drain, err = time.ParseDuration(v); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	if preStop < 5*time.Second {
		t.Errorf("preStop sleep %v: endpoint removal takes seconds to reach kube-proxy and load balancers", preStop)
	}
	if drain <= 0 {
		t.Fatal("the ingress has no --drain-timeout")
	}
	grace := time.Duration(*pod.Spec.TerminationGracePeriodSeconds) * time.Second
	if need := preStop + drain + serverShutdown; grace < need {
		t.Errorf("terminationGracePeriodSeconds %v < preStop %v + drain %v + shutdown %v", grace, preStop, drain, serverShutdown)
	}
}
