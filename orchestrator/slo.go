package orchestrator

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// observeSLO builds the SLO mode's observation (nil without an SLO spec).
func (c *Controller) observeSLO(ap *v1alpha1.AutoscalingPolicy, targets map[string]roleTarget, engines map[string]gossip.EngineView, obs map[string]autoscale.Observation, pc *policyConds) *autoscale.SLOObservation {
	if ap.Spec.SLO == nil {
		return nil
	}
	pc.set(v1alpha1.ConditionSLOAtRisk, metav1.ConditionUnknown, "NoLatencySignal", "the mesh does not gossip TTFT/TPOT percentiles yet")
	return nil
}
