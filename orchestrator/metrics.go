package orchestrator

import "github.com/prometheus/client_golang/prometheus"

// The orchestrator's metrics (registered by Register).
var (
	reconciles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_reconciles_total", Help: "ModelDeployment reconciles.",
	})
	reconcileErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_reconcile_errors_total", Help: "ModelDeployment reconciles that failed and were requeued.",
	})
	podActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_pod_actions_total", Help: "Pods created or deleted, by action and reason.",
	}, []string{"action", "reason"})
)

// Register adds the orchestrator's metrics to r.
func Register(r prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{reconciles, reconcileErrors, podActions} {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
