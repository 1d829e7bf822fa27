package modelroutes

import "github.com/prometheus/client_golang/prometheus"

// The controller's metrics (the orchestrator registers Collectors).
var (
	routeStates = prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "kvmesh_orchestrator_model_routes",
		Help: "ModelRoutes per namespace at the last reconcile, by state: programmed (in the route file), invalid, pending (valid, file not written).",
	}, []string{"namespace", "state"})
	fileWrites = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvmesh_orchestrator_route_file_writes_total",
		Help: "Route file (ConfigMap) writes by outcome: created, updated, error.",
	}, []string{"outcome"})
)

func init() {
	for _, o := range []string{"created", "updated", "error"} {
		fileWrites.WithLabelValues(o)
	}
}

// Collectors are the controller's metrics.
func Collectors() []prometheus.Collector { return []prometheus.Collector{routeStates, fileWrites} }

// observe sets namespace ns's route counts after a reconcile; a namespace
// with no ModelRoute left loses its series (namespaces come and go).
func observe(ns string, p plan, programmed bool) {
	if len(p.entries) == 0 {
		routeStates.DeletePartialMatch(prometheus.Labels{"namespace": ns})
		return
	}
	var ok, invalid, pending float64
	for _, e := range p.entries {
		switch {
		case e.invalid != nil:
			invalid++
		case programmed && !e.excess:
			ok++
		default:
			pending++
		}
	}
	routeStates.WithLabelValues(ns, "programmed").Set(ok)
	routeStates.WithLabelValues(ns, "invalid").Set(invalid)
	routeStates.WithLabelValues(ns, "pending").Set(pending)
}
