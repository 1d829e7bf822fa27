package v1alpha1

import metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

// ModelRoute is one model routing rule for the ingresses of its namespace:
// a client-facing model name (or prefix, headers, path) served by a weighted
// split of model pools, with an ordered fallback, LoRA adapter names and a
// per-replica rate limit. The orchestrator renders a namespace's accepted
// ModelRoutes, highest priority first, into the RouteConfig file the
// ingresses hot-reload (a ConfigMap, default kvmesh-routes, key routes.yaml;
// docs/REQUESTS.md has the rule's semantics).
type ModelRoute struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModelRouteSpec   `json:"spec"`
	Status ModelRouteStatus `json:"status,omitempty"`
}

// ModelRouteSpec is the rule; the route's name is the object's.
type ModelRouteSpec struct {
	// Priority orders the namespace's routes, which the ingress tries in
	// order (the first match wins): higher first, then by name. Default 0.
	Priority int32 `json:"priority,omitempty"`
	// Match selects requests; every non-empty part must fit.
	Match RouteMatch `json:"match,omitempty"`
	// Backends are the model pools requests are split across by weight.
	Backends []RouteBackend `json:"backends"`
	// Fallback is the ordered list of models tried after the picked one.
	Fallback []string `json:"fallback,omitempty"`
	// LoRAAdapters are adapter names that also match the route.
	LoRAAdapters []string `json:"loraAdapters,omitempty"`
	// RateLimit bounds the route's traffic on each ingress replica.
	RateLimit *RouteRateLimit `json:"rateLimit,omitempty"`
}

// RouteMatch selects requests.
type RouteMatch struct {
	// Model is the request's model: exact, or a prefix ending in "*".
	// Empty: any.
	Model string `json:"model,omitempty"`
	// Headers must all be present with exactly these values.
	Headers map[string]string `json:"headers,omitempty"`
	// PathPrefix must prefix the request path. Empty: any.
	PathPrefix string `json:"pathPrefix,omitempty"`
}

// RouteBackend is one weighted model pool.
type RouteBackend struct {
	Model string `json:"model"`
	// Weight is the share of requests (default 1; 0 takes none).
	Weight *int32 `json:"weight,omitempty"`
}

// RouteRateLimit is a per-replica budget (0: no limit).
type RouteRateLimit struct {
	RequestsPerMinute    int64 `json:"requestsPerMinute,omitempty"`
	InputTokensPerMinute int64 `json:"inputTokensPerMinute,omitempty"`
}

// ModelRouteStatus says whether the route is valid and in the ingresses'
// route file.
type ModelRouteStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// ConfigMap names the ConfigMap (same namespace) whose routes.yaml holds
	// the route; Position is its index there (the ingress tries routes in
	// order).
	ConfigMap string `json:"configMap,omitempty"`
	Position  *int32 `json:"position,omitempty"`
	// Conditions: Accepted (the rule is valid) and Programmed (it is in the
	// route file).
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// Condition types of a ModelRoute.
const (
	ConditionAccepted   = "Accepted"
	ConditionProgrammed = "Programmed"
)

// ModelRouteList is a list of ModelRoutes.
type ModelRouteList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelRoute `json:"items"`
}
