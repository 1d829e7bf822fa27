package local

import (
	"context"
	"fmt"
	"time"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// LoadSource reports every engine in the mesh; a *gossip.Node joined as an
// observer is one. Engines must be safe to call from any goroutine.
type LoadSource interface {
	Engines() []gossip.EngineView
}

var _ LoadSource = (*gossip.Node)(nil)

// policyRunner steps one AutoscalingPolicy: it observes the target's roles
// in the mesh, lets autoscale decide, and scales the Backend. The decision
// is autoscale's (windows, tolerance, rate limits, ratio band, SLO sizing);
// this only feeds it and applies it.
type policyRunner struct {
	ap   v1alpha1.AutoscalingPolicy
	a    *autoscale.Autoscaler
	last autoscale.Result
}

func newPolicyRunner(ap v1alpha1.AutoscalingPolicy) (*policyRunner, error) {
	a, err := autoscale.New(policyFromSpec(&ap.Spec))
	if err != nil {
		return nil, fmt.Errorf("AutoscalingPolicy %s: %w", ap.Name, err)
	}
	return &policyRunner{ap: ap, a: a}, nil
}

// observe sums the mesh's load over each role's replicas (engine id =
// replica id); KV usage is averaged. A role none of whose replicas is in
// the mesh yet has no metrics (autoscale then holds it).
func observe(md *v1alpha1.ModelDeployment, b Backend, engines map[string]gossip.EngineView) map[string]autoscale.Observation {
	obs := map[string]autoscale.Observation{}
	for _, r := range md.Spec.Roles {
		ids := b.Replicas(md.Name, r.Name)
		var waiting, running, queued, kv float64
		n := 0
		for _, id := range ids {
			e, ok := engines[id]
			if !ok {
				continue
			}
			waiting += float64(e.Waiting)
			running += float64(e.Running)
			queued += float64(e.QueuedPrefill)
			kv += e.KVUsage
			n++
		}
		o := autoscale.Observation{Current: int32(len(ids)), Metrics: map[string]float64{}}
		if n > 0 {
			o.Metrics[autoscale.WaitingRequests] = waiting
			o.Metrics[autoscale.RunningRequests] = running
			o.Metrics[autoscale.PrefillQueueTokens] = queued
			o.Metrics[autoscale.KVUsage] = kv / float64(n)
		}
		obs[r.Name] = o
	}
	return obs
}

// step runs one decision and applies it. slo may be nil (no latency
// signal: the SLO mode is then not applied, as in the Kubernetes
// controller).
func (p *policyRunner) step(ctx context.Context, now time.Time, md *v1alpha1.ModelDeployment, b Backend, load LoadSource, slo *autoscale.SLOObservation) error {
	engines := map[string]gossip.EngineView{}
	for _, v := range load.Engines() {
		engines[v.ID] = v
	}
	res := p.a.Step(now, observe(md, b, engines), slo)
	p.last = res
	for _, r := range p.ap.Spec.Roles {
		d, ok := res.Roles[r.Name]
		if !ok || d.Desired == d.Current {
			continue
		}
		if err := b.Scale(ctx, md.Name, r.Name, int(d.Desired)); err != nil {
			return err
		}
	}
	return nil
}
