package demo

import (
	"context"
	"errors"
	"fmt"
)

// Cluster is the demo's mesh (embedded NATS, simulated engines with their
// sidecars, ingress replicas) for other harnesses that run their own load
// through it, such as `kvmesh bench --mode live`. It is the same wiring Run
// uses, not a second one. Its methods must be called from one goroutine.
type Cluster struct {
	m *mesh
}

// StartCluster starts NATS and cfg.Engines engines with their sidecars
// (cfg's workload, policies and concurrency are unused). Close stops them.
func StartCluster(ctx context.Context, cfg Config) (*Cluster, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("demo: %w", err)
	}
	c := &Cluster{m: &mesh{cfg: cfg}}
	if err := c.m.startEngines(ctx); err != nil {
		return nil, errors.Join(err, c.m.stop())
	}
	return c, nil
}

// StartIngresses starts cfg.Ingresses replicas routing with policy and
// waits until each sees every engine; run makes their names unique.
func (c *Cluster) StartIngresses(ctx context.Context, policy string, run int) error {
	return c.m.startIngresses(ctx, policy, run)
}

// StopIngresses drains and closes the ingress replicas.
func (c *Cluster) StopIngresses() error { return c.m.stopIngresses() }

// ResetCaches empties every engine's prefix cache and waits until the
// sidecars have seen it.
func (c *Cluster) ResetCaches(ctx context.Context) error { return c.m.resetCaches(ctx) }

// IngressURLs are the running ingresses' base URLs.
func (c *Cluster) IngressURLs() []string { return c.m.ingressURLs() }

// EngineIDs are the engines' ids, as the ingresses name them in
// X-Kvmesh-Engine.
func (c *Cluster) EngineIDs() []string { return append([]string(nil), c.m.engineIDs...) }

// EngineURLs are the engines' base URLs (their OpenAI API and /metrics).
func (c *Cluster) EngineURLs() []string {
	out := make([]string, len(c.m.sims))
	for i, s := range c.m.sims {
		out[i] = s.URL()
	}
	return out
}

// Close stops everything, in reverse start order; safe to call twice.
func (c *Cluster) Close() error { return c.m.stop() }
