package orchestrator

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/orchestrator/modelroutes"
)

// The orchestrator's metrics (registered by Register).
var (
	reconciles = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_reconciles_total", Help: "ModelDeployment reconciles.",
	})
	reconcileErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_reconcile_errors_total", Help: "ModelDeployment reconciles that failed and were requeued.",
	})
	podActions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_pod_actions_total", Help: "Pods created, deleted or released (their labels no longer name the deployment), by action and reason.",
	}, []string{"action", "reason"})
	// Autoscaler decisions: the desired replicas of every role of every
	// policy at its last step, and how many steps scaled up, down or held.
	autoscaleDesired = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_orchestrator_autoscale_desired_replicas", Help: "Replicas the autoscaler wants per role, at its last step.",
	}, []string{"namespace", "policy", "role"})
	autoscaleCurrent = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_orchestrator_autoscale_current_replicas", Help: "Replicas a role had at the autoscaler's last step.",
	}, []string{"namespace", "policy", "role"})
	autoscaleDecisions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_autoscale_decisions_total", Help: "Autoscaler role decisions by direction (up, down, hold).",
	}, []string{"direction"})
	policyTargetErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_autoscale_target_errors_total", Help: "Autoscaler steps whose target could not be resolved or scaled, by reason.",
	}, []string{"reason"})
	promQueries = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_prometheus_queries_total", Help: "Prometheus queries of AutoscalingPolicy metrics, by outcome (ok, error, stale).",
	}, []string{"outcome"})
	sloSummaryErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_slo_summary_errors_total", Help: "Ingress TTFT/TPOT summaries read from gossip that did not decode or were out of range (skipped).",
	})
	sloInputs = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_orchestrator_slo_input", Help: "The SLO mode's live inputs merged from the ingresses' gossip, by policy and input (ttft_p90_seconds, tpot_p90_seconds, prompt_tokens_per_second, running_streams; prefill_tokens_per_replica when learned).",
	}, []string{"namespace", "policy", "input"})
	learnShareErrors = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_learn_share_errors_total", Help: "Ingress learned-cost shares read from gossip that did not decode or held implausible sums (skipped, or their bad engines dropped).",
	})
)

func init() {
	for _, d := range []string{"up", "down", "hold"} {
		autoscaleDecisions.WithLabelValues(d)
	}
	for _, o := range []string{"ok", "error", "stale"} {
		promQueries.WithLabelValues(o)
	}
}

// Register adds the orchestrator's metrics to r.
func Register(r prometheus.Registerer) error {
	cs := []prometheus.Collector{reconciles, reconcileErrors, podActions, autoscaleDesired, autoscaleCurrent, autoscaleDecisions, policyTargetErrors, promQueries, sloInputs, sloSummaryErrors, learnShareErrors}
	for _, c := range append(cs, modelroutes.Collectors()...) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}
