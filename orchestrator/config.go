package orchestrator

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
)

// Config configures the controller. Start from DefaultConfig.
type Config struct {
	// Namespace limits the controller to one namespace ("" watches all).
	Namespace string
	// Workers is the number of reconcile goroutines (default 2). A
	// deployment is never reconciled by two workers at once (the queue
	// guarantees it).
	Workers int
	// Resync re-lists the informers' caches this often (default 10 min); the
	// controller is level-triggered, so a resync repairs any missed event.
	Resync time.Duration
	// LeaderElection enables a Lease so that one replica reconciles.
	LeaderElection bool
	// LeaseNamespace and LeaseName name the Lease (default kvmesh,
	// kvmesh-orchestrator).
	LeaseNamespace, LeaseName string
	// Identity is this replica's name in the Lease (default hostname+random).
	Identity string
	// LeaseDuration, RenewDeadline, RetryPeriod: client-go's leader election
	// timings (15 s, 10 s, 2 s).
	LeaseDuration, RenewDeadline, RetryPeriod time.Duration
	// Load, when set, enables AutoscalingPolicies: the mesh's engine states
	// (a *gossip.Node joined as an orchestrator member).
	Load LoadSource
	// SLO supplies the ingresses' gossiped TTFT/TPOT summaries (default:
	// Load, when it is a *gossip.Node).
	SLO SLOSource
	// AutoscaleInterval is how often every policy is stepped (default 15 s,
	// Kthena's period).
	AutoscaleInterval time.Duration
	// PrometheusURL is the Prometheus queried for metrics with source
	// prometheus when the policy names no address (--prometheus-url).
	PrometheusURL string
	// PrometheusTimeout bounds one query (default 5 s).
	PrometheusTimeout time.Duration
	// RouteConfigMap names the ConfigMap each namespace's ModelRoutes are
	// rendered into (orchestrator/modelroutes; key routes.yaml, the
	// ingress's --routes file). Default kvmesh-routes; "" turns ModelRoutes
	// off.
	RouteConfigMap string
	// Logger receives structured logs (default slog.Default()).
	Logger *slog.Logger
}

// DefaultConfig is the production configuration.
func DefaultConfig() Config {
	return Config{
		Workers: 2, Resync: 10 * time.Minute, AutoscaleInterval: 15 * time.Second, PrometheusTimeout: 5 * time.Second,
		LeaderElection: true, LeaseNamespace: "kvmesh", LeaseName: "kvmesh-orchestrator",
		LeaseDuration: 15 * time.Second, RenewDeadline: 10 * time.Second, RetryPeriod: 2 * time.Second,
		RouteConfigMap: "kvmesh-routes",
	}
}

// Validate lists every problem at once.
func (c *Config) Validate() error {
	var errs []error
	if c.Workers < 1 {
		errs = append(errs, fmt.Errorf("workers %d < 1", c.Workers))
	}
	if c.Resync <= 0 {
		errs = append(errs, fmt.Errorf("resync %v <= 0", c.Resync))
	}
	if c.Load != nil && c.AutoscaleInterval <= 0 {
		errs = append(errs, fmt.Errorf("autoscale interval %v <= 0", c.AutoscaleInterval))
	}
	if c.Load != nil && c.PrometheusTimeout <= 0 {
		errs = append(errs, fmt.Errorf("prometheus timeout %v <= 0", c.PrometheusTimeout))
	}
	if c.PrometheusURL != "" && !strings.HasPrefix(c.PrometheusURL, "http://") && !strings.HasPrefix(c.PrometheusURL, "https://") {
		errs = append(errs, fmt.Errorf("prometheus url %q: want http:// or https://", c.PrometheusURL))
	}
	if c.LeaderElection {
		if c.LeaseNamespace == "" || c.LeaseName == "" {
			errs = append(errs, errors.New("leader election needs a lease namespace and name"))
		}
		if !(c.LeaseDuration > c.RenewDeadline && c.RenewDeadline > c.RetryPeriod && c.RetryPeriod > 0) {
			errs = append(errs, errors.New("leader election needs leaseDuration > renewDeadline > retryPeriod > 0"))
		}
	}
	return errors.Join(errs...)
}
