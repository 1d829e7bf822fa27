package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// AutoscalingPolicy scales the roles of one ModelDeployment, or existing
// workloads adopted per role (Deployments, StatefulSets, LeaderWorkerSets
// named or selected by labels, scaled through their /scale): per role from
// metric targets (HPA-style, with tolerance, stable and panic windows, rate
// limits and a scale-down cool-down), optionally keeping the ratio of two
// roles within a band, or sizing prefill and decode from TTFT/TPOT targets.
type AutoscalingPolicy struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   AutoscalingPolicySpec   `json:"spec"`
	Status AutoscalingPolicyStatus `json:"status,omitempty"`
}

// AutoscalingPolicySpec is the policy.
type AutoscalingPolicySpec struct {
	// Target is the ModelDeployment's name (same namespace). Empty: every
	// role names its own workload (the adoption mode).
	Target string `json:"target,omitempty"`
	// Prometheus configures the metrics with source prometheus (default:
	// the orchestrator's --prometheus-url).
	Prometheus *PrometheusSource `json:"prometheus,omitempty"`
	// Roles are the scaled roles with their bounds and metrics.
	Roles []RoleAutoscaling `json:"roles"`
	// TolerancePercent: no change while |current/target − 1| is within it (10).
	TolerancePercent *int32 `json:"tolerancePercent,omitempty"`
	// StableWindowSeconds: recommendations are averaged over it (180); at
	// least PanicWindowSeconds (the schema refuses less).
	StableWindowSeconds *int32 `json:"stableWindowSeconds,omitempty"`
	// PanicWindowSeconds: the short window used in panic mode (60).
	PanicWindowSeconds *int32 `json:"panicWindowSeconds,omitempty"`
	// PanicThresholdPercent: panic when the panic-window demand exceeds
	// this percent of current capacity (200); in panic mode replicas never drop.
	PanicThresholdPercent *int32 `json:"panicThresholdPercent,omitempty"`
	// MaxScaleUpRate: at most current × rate replicas in one step (2).
	MaxScaleUpRate *float64 `json:"maxScaleUpRate,omitempty"`
	// MaxScaleDownRate: at least current / rate replicas after one step (2).
	MaxScaleDownRate *float64 `json:"maxScaleDownRate,omitempty"`
	// ScaleDownCooldownSeconds since the last scale-up before any scale-down (300).
	ScaleDownCooldownSeconds *int32 `json:"scaleDownCooldownSeconds,omitempty"`
	// Ratio keeps numerator/denominator replicas within [minRatio, maxRatio].
	Ratio *RatioConstraint `json:"ratio,omitempty"`
	// SLO sizes prefill and decode from latency targets instead of metric targets.
	SLO *SLOTarget `json:"slo,omitempty"`
}

// RoleAutoscaling bounds one role and names its metric targets. A
// MinReplicas of 0 needs something that observes the role without engines
// (a Prometheus metric counting its demand, or a ratio band with a role
// that never goes to zero); without it the policy is refused
// (CannotScaleFromZero).
type RoleAutoscaling struct {
	Name        string         `json:"name"`
	MinReplicas int32          `json:"minReplicas"`
	MaxReplicas int32          `json:"maxReplicas"`
	Metrics     []MetricTarget `json:"metrics,omitempty"`
	// Workload adopts an existing workload as this role when the policy has
	// no target ModelDeployment.
	Workload *WorkloadRef `json:"workload,omitempty"`
}

// Workload kinds an AutoscalingPolicy can adopt.
const (
	WorkloadDeployment      = "Deployment"
	WorkloadStatefulSet     = "StatefulSet"
	WorkloadLeaderWorkerSet = "LeaderWorkerSet"
)

// WorkloadRef names one workload of a kind, by name or by a label selector
// that must select exactly one workload (same namespace). Its engine pods
// are the pods its /scale selector selects; the mesh knows them by pod name.
type WorkloadRef struct {
	// Kind: Deployment, StatefulSet or LeaderWorkerSet
	// (leaderworkerset.x-k8s.io/v1, when that CRD is installed).
	Kind     string                `json:"kind"`
	Name     string                `json:"name,omitempty"`
	Selector *metav1.LabelSelector `json:"selector,omitempty"`
}

// PrometheusSource is where the metrics with source prometheus are queried.
type PrometheusSource struct {
	// Address is the Prometheus base URL (http://prometheus.monitoring:9090).
	Address string `json:"address,omitempty"`
	// StaleAfterSeconds: the last good value of a query is used for at most
	// this long after a failed query (default 120); then the metric is
	// unobserved and the role holds.
	StaleAfterSeconds *int32 `json:"staleAfterSeconds,omitempty"`
}

// MetricTarget is a per-replica target value of one metric.
type MetricTarget struct {
	// Name: waitingRequests, kvUsage, prefillQueueTokens, runningRequests,
	// ttftP90Seconds or tpotP90Seconds.
	Name string `json:"name"`
	// Target value per replica (for latencies: the value itself).
	Target float64 `json:"target"`
	// Source: mesh (gossip, default) or prometheus.
	Source string `json:"source,omitempty"`
	// Query is the PromQL query when Source is prometheus.
	Query string `json:"query,omitempty"`
}

// RatioConstraint is the P/D ratio band.
type RatioConstraint struct {
	NumeratorRole   string  `json:"numeratorRole"`
	DenominatorRole string  `json:"denominatorRole"`
	MinRatio        float64 `json:"minRatio"`
	MaxRatio        float64 `json:"maxRatio"`
}

// SLOTarget sizes roles from latency targets (Dynamo's planner, fed by the mesh).
type SLOTarget struct {
	// PrefillRole and DecodeRole name the two roles.
	PrefillRole string `json:"prefillRole"`
	DecodeRole  string `json:"decodeRole"`
	// TTFTMilliseconds and TPOTMilliseconds are the targets (500 and 50).
	TTFTMilliseconds int32 `json:"ttftMilliseconds,omitempty"`
	TPOTMilliseconds int32 `json:"tpotMilliseconds,omitempty"`
	// PrefillTokensPerSecond one prefill replica sustains within TTFT
	// (profiled). Absent: learned from the mesh, the ingresses' learned
	// prefill rate of the role's engines (gossip kvmesh.learn.v1) ×
	// PrefillUtilizationPercent.
	PrefillTokensPerSecond float64 `json:"prefillTokensPerSecond,omitempty"`
	// PrefillUtilizationPercent is the share of the learned prefill rate
	// one replica is planned for (default 80). Unused with
	// prefillTokensPerSecond.
	PrefillUtilizationPercent int32 `json:"prefillUtilizationPercent,omitempty"`
	// DecodeStreamsPerReplica one decode replica runs within TPOT (profiled).
	DecodeStreamsPerReplica float64 `json:"decodeStreamsPerReplica"`
	// TTFTBaselineWindowSeconds learns, over this window, the TTFT that
	// holds with no excess (the lowest measured/expected ratio) and
	// corrects only above it (0: off; the DES measured 900).
	TTFTBaselineWindowSeconds int32 `json:"ttftBaselineWindowSeconds,omitempty"`
	// LeadSeconds sizes for the load expected this far ahead from a
	// significant upward trend of the observations (0: off).
	LeadSeconds int32 `json:"leadSeconds,omitempty"`
	// TTFTAimPercent is the TTFT p90 the prefill correction steers to, in
	// percent of ttftMilliseconds (0 or absent: 100). The SLO counts
	// requests within the target, the correction sees the p90: an aim
	// below 100 keeps headroom for the tail (the DES measured 40).
	TTFTAimPercent int32 `json:"ttftAimPercent,omitempty"`
	// TPOTAimPercent is the same for the decode correction: the TPOT p90
	// it steers to, in percent of tpotMilliseconds (0 or absent: 100). The
	// DES's pick, run as the controller divides, kept 99 % with 60.
	TPOTAimPercent int32 `json:"tpotAimPercent,omitempty"`
	// RaiseOnly: latency corrections only add replicas; a latency below
	// its aim never sizes a role below its profiled demand (default: a
	// correction may halve it).
	RaiseOnly bool `json:"raiseOnly,omitempty"`
	// CorrectionWindowSeconds remembers the latency corrections: each
	// role's correction is the highest of the steps within this window, so
	// replicas a correction added are not removed as soon as they bring
	// the latency down (0: off; the DES measured 360).
	CorrectionWindowSeconds int32 `json:"correctionWindowSeconds,omitempty"`
	// AggregateBelow lets the decode role serve whole requests at low load
	// (0 or absent: off): while the prefill role's fractional demand plus
	// the decode role's (replicas' worth, corrections included, before
	// rounding up) is at most this, prefill is sized 0 and decode at least
	// 1, and the P/D router serves requests whole on decode engines. The
	// prefill role's minReplicas must be 0 for it to act (which needs a
	// ratio band with the decode role to be accepted); the band is not
	// applied while this holds prefill at 0. Not for sglang, whose decode
	// servers cannot serve whole requests (the DES measured 0.8).
	AggregateBelow float64 `json:"aggregateBelow,omitempty"`
}

// AutoscalingPolicyStatus reports the last decision.
type AutoscalingPolicyStatus struct {
	ObservedGeneration int64                   `json:"observedGeneration,omitempty"`
	Roles              []RoleAutoscalingStatus `json:"roles,omitempty"`
	LastScaleTime      *metav1.Time            `json:"lastScaleTime,omitempty"`
	Conditions         []metav1.Condition      `json:"conditions,omitempty"`
}

// RoleAutoscalingStatus is one role's decision.
type RoleAutoscalingStatus struct {
	Name            string `json:"name"`
	CurrentReplicas int32  `json:"currentReplicas"`
	DesiredReplicas int32  `json:"desiredReplicas"`
	Reason          string `json:"reason,omitempty"`
	// Workload is the adopted workload ("Deployment/name"), when adopting.
	Workload string `json:"workload,omitempty"`
}

// Condition types of an AutoscalingPolicy.
const (
	ConditionRatioConstraintActive = "RatioConstraintActive"
	ConditionSLOAtRisk             = "SLOAtRisk"
	ConditionScalingActive         = "ScalingActive"
	// ConditionMetricsAvailable is False while a Prometheus query fails
	// (reason PrometheusError; the last good value is used until stale).
	ConditionMetricsAvailable = "MetricsAvailable"
)

// AutoscalingPolicyList is a list of AutoscalingPolicies.
type AutoscalingPolicyList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []AutoscalingPolicy `json:"items"`
}
