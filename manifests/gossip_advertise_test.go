package manifests

import (
	"net"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestGossipAdvertisesThePodIP: every kvmesh container of the shipped
// manifests that binds gossip on every address (0.0.0.0, [::]) names the
// address its peers dial, --gossip-advertise=$(POD_IP) (or $(NODE_IP) on
// the node's network), from the downward API. Without it memberlist picks
// an RFC 6890 private address itself and finds none on an IPv6 cluster
// whose pods have global addresses (EKS IPv6): the orchestrator's gossip,
// and with it the orchestrator, would not start (tester h-ipv6 U1).
func TestGossipAdvertisesThePodIP(t *testing.T) {
	kc := kubectl(t)
	for _, dir := range []string{"install", "base", "orchestrator", "orchestrator-no-webhook", "overlays/sidecar-container",
		"overlays/daemonset", "overlays/injected", "gateway/base"} {
		for _, o := range render(t, kc, filepath.Join(".", dir)) {
			containers, _, _ := unstructured.NestedSlice(o.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				c := c.(map[string]any)
				args, _, _ := unstructured.NestedStringSlice(c, "args")
				bind, advertise := "", ""
				for _, a := range args {
					if v, ok := strings.CutPrefix(a, "--gossip-bind="); ok {
						bind = v
					}
					if v, ok := strings.CutPrefix(a, "--gossip-advertise="); ok {
						advertise = v
					}
				}
				host, _, err := net.SplitHostPort(bind)
				if bind == "" || err == nil && host != "" && !net.ParseIP(host).IsUnspecified() {
					continue // no gossip, or bound to one address
				}
				where := dir + ": " + o.GetKind() + " " + o.GetName() + " container " + c["name"].(string)
				v, ok := strings.CutPrefix(advertise, "$(")
				v, ok2 := strings.CutSuffix(v, ")")
				if !ok || !ok2 {
					t.Errorf("%s: --gossip-bind=%s without --gossip-advertise=$(POD_IP) (got %q)", where, bind, advertise)
					continue
				}
				env, _, _ := unstructured.NestedSlice(c, "env")
				found := false
				for _, e := range env {
					e := e.(map[string]any)
					path, _, _ := unstructured.NestedString(e, "valueFrom", "fieldRef", "fieldPath")
					if e["name"] == v && (path == "status.podIP" || path == "status.hostIP") {
						found = true
					}
				}
				if !found {
					t.Errorf("%s: --gossip-advertise=%s, but %s is not the pod's or node's IP from the downward API", where, advertise, v)
				}
			}
		}
	}
}
