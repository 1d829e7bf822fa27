package manifests

import (
	"path/filepath"
	"testing"

	"k8s.io/apimachinery/pkg/api/resource"
)

// TestIngressGOMEMLIMIT: the ingress sets the Go GC's soft limit to about
// 90 % of its container's memory limit, so the heap is collected harder
// before the OOM killer ends the replica (a changed limit must change both).
func TestIngressGOMEMLIMIT(t *testing.T) {
	found := false
	eachDoc(t, filepath.Join("base", "ingress.yaml"), func(doc map[string]any) {
		if doc["kind"] != "Deployment" {
			return
		}
		cs, _ := dig(doc, "spec", "template", "spec", "containers").([]any)
		for _, c := range cs {
			c, _ := c.(map[string]any)
			if c["name"] != "ingress" {
				continue
			}
			found = true
			lim, _ := dig(c, "resources", "limits", "memory").(string)
			limit, err := resource.ParseQuantity(lim)
			if err != nil {
				t.Fatalf("limits.memory %q: %v", lim, err)
			}
			var gml string
			envs, _ := c["env"].([]any)
			for _, e := range envs {
				if e, _ := e.(map[string]any); e["name"] == "GOMEMLIMIT" {
					gml, _ = e["value"].(string)
				}
			}
			soft, err := resource.ParseQuantity(goQuantity(gml))
			if gml == "" || err != nil {
				t.Fatalf("GOMEMLIMIT %q (%v): want about 90 %% of limits.memory %s", gml, err, lim)
			}
			if r := float64(soft.Value()) / float64(limit.Value()); r < 0.85 || r > 0.95 {
				t.Errorf("GOMEMLIMIT %s is %.0f %% of limits.memory %s; want about 90 %%", gml, 100*r, lim)
			}
		}
	})
	if !found {
		t.Fatal("no ingress container in base/ingress.yaml")
	}
}

// goQuantity turns GOMEMLIMIT's units (MiB, GiB) into Kubernetes' (Mi, Gi).
func goQuantity(s string) string {
	if n := len(s); n > 2 && s[n-1] == 'B' && s[n-2] == 'i' {
		return s[:n-1]
	}
	return s
}
