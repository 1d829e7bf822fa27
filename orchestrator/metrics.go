package orchestrator

import (
	"context"
	"net/url"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientmetrics "k8s.io/client-go/tools/metrics"

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
		Name: "kvmesh_orchestrator_pod_actions_total", Help: "Pods created, deleted, released (their labels no longer name the deployment) or marked complete (mark_complete: a member of a replica seen whole and Running), by action and reason.",
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

// client-go's requests to the API server, with kube-controller-manager's
// names and labels (component-base's rest_client_* series, so its
// dashboards and alerts apply): verb (method) and host are the client's few
// (the API server), code an HTTP status or "<error>". URLs, namespaces and
// resources are not labels.
var (
	clientBuckets        = []float64{0.005, 0.025, 0.1, 0.25, 0.5, 1, 2, 4, 8, 15, 30, 60}
	clientRequestLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_request_duration_seconds", Help: "Latency of the orchestrator's requests to the API server, by verb and host.", Buckets: clientBuckets,
	}, []string{"verb", "host"})
	clientRateLimiterLatency = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "rest_client_rate_limiter_duration_seconds", Help: "Time the orchestrator's requests waited for client-go's rate limit (--kube-api-qps, --kube-api-burst), by verb and host.", Buckets: clientBuckets,
	}, []string{"verb", "host"})
	clientRequestResults = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "rest_client_requests_total", Help: "The orchestrator's requests to the API server, by HTTP code (or <error>), method and host.",
	}, []string{"code", "method", "host"})
)

type clientLatency struct{ h *prometheus.HistogramVec }

func (l clientLatency) Observe(_ context.Context, verb string, u url.URL, d time.Duration) {
	l.h.WithLabelValues(strings.ToUpper(verb), u.Host).Observe(d.Seconds())
}

type clientResult struct{}

func (clientResult) Increment(_ context.Context, code, method, host string) {
	clientRequestResults.WithLabelValues(code, strings.ToUpper(method), host).Inc()
}

func init() {
	for _, d := range []string{"up", "down", "hold"} {
		autoscaleDecisions.WithLabelValues(d)
	}
	for _, o := range []string{"ok", "error", "stale"} {
		promQueries.WithLabelValues(o)
	}
}

// Register adds the orchestrator's metrics to r, with client-go's request
// metrics (rest_client_*: client-go takes its hooks once per process, the
// first caller's; this package's are the same for every registry).
func Register(r prometheus.Registerer) error {
	cs := []prometheus.Collector{reconciles, reconcileErrors, podActions, autoscaleDesired, autoscaleCurrent, autoscaleDecisions, policyTargetErrors, promQueries, sloInputs, sloSummaryErrors, learnShareErrors,
		clientRequestLatency, clientRateLimiterLatency, clientRequestResults}
	cs = append(cs, LeaderCollectors()...)
	for _, c := range append(cs, modelroutes.Collectors()...) {
		if err := r.Register(c); err != nil {
			return err
		}
	}
	return nil
}

// client-go's request metrics are package variables its clients read on
// every request: set them before any client exists (an init, as
// component-base does), not in Register, which ran while informers were
// already watching (a data race under -race).
func init() {
	clientmetrics.Register(clientmetrics.RegisterOpts{
		RequestLatency: clientLatency{clientRequestLatency}, RateLimiterLatency: clientLatency{clientRateLimiterLatency}, RequestResult: clientResult{},
	})
}
