package manifests

import (
	"strings"
	"testing"
)

// TestOnlyKvmeshCRDsInOverlays: no kustomization but crds/third-party (a copy
// applied on purpose) renders a CRD kvmesh does not own. A shared CRD such as
// the InferencePool's belongs to the gateway's release: applied with an
// overlay it conflicts with that release's copy, and deleted with the overlay
// it takes every InferencePool in the cluster with it.
func TestOnlyKvmeshCRDsInOverlays(t *testing.T) {
	kc := kubectl(t)
	for _, dir := range kustomizations(t) {
		if dir == "crds/third-party" {
			continue
		}
		for _, o := range render(t, kc, dir) {
			if o.GetKind() == "CustomResourceDefinition" && !strings.HasSuffix(o.GetName(), ".kvmesh.io") {
				t.Errorf("%s renders the third-party CRD %s", dir, o.GetName())
			}
		}
	}
}
