package orchestrator

import (
	"context"
	"fmt"
	"reflect"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/gossip"
	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// LoadSource reports the live state of every engine in the mesh; a
// *gossip.Node is one (the orchestrator joins the mesh as a member).
// Engines must be safe to call from any goroutine.
type LoadSource interface {
	Engines() []gossip.EngineView
}

var _ LoadSource = (*gossip.Node)(nil)

// policyEntry is the autoscaler kept for one policy generation: a spec
// change starts its windows afresh.
type policyEntry struct {
	generation int64
	uid        types.UID
	a          *autoscale.Autoscaler
	p          autoscale.Policy
}

// runAutoscaler steps every AutoscalingPolicy each interval until ctx ends.
// Autoscaling is periodic by nature (load changes without API events); it
// reads the informer caches and the mesh, never polls the API server.
func (c *Controller) runAutoscaler(ctx context.Context) {
	t := time.NewTicker(c.cfg.AutoscaleInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.stepPolicies(ctx, now)
		}
	}
}

func (c *Controller) stepPolicies(ctx context.Context, now time.Time) {
	objs, err := c.policies.List(labels.Everything())
	if err != nil {
		return
	}
	seen := map[types.UID]bool{}
	for _, o := range objs {
		u := o.(*unstructured.Unstructured)
		ap := &v1alpha1.AutoscalingPolicy{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, ap); err != nil {
			continue
		}
		seen[ap.UID] = true
		if err := c.stepPolicy(ctx, now, u, ap); err != nil {
			c.log.Warn("autoscale", "policy", ap.Namespace+"/"+ap.Name, "err", err)
		}
	}
	for uid := range c.autoscalers {
		if !seen[uid] {
			delete(c.autoscalers, uid)
		}
	}
}

// policyFromSpec resolves an AutoscalingPolicy with its defaults.
func policyFromSpec(s *v1alpha1.AutoscalingPolicySpec) autoscale.Policy {
	p := autoscale.DefaultPolicy()
	i32 := func(v *int32, d *time.Duration) {
		if v != nil {
			*d = time.Duration(*v) * time.Second
		}
	}
	if s.TolerancePercent != nil {
		p.Tolerance = float64(*s.TolerancePercent) / 100
	}
	i32(s.StableWindowSeconds, &p.StableWindow)
	i32(s.PanicWindowSeconds, &p.PanicWindow)
	i32(s.ScaleDownCooldownSeconds, &p.DownCooldown)
	if s.PanicThresholdPercent != nil {
		p.PanicThreshold = float64(*s.PanicThresholdPercent) / 100
	}
	if s.MaxScaleUpRate != nil {
		p.MaxUpRate = *s.MaxScaleUpRate
	}
	if s.MaxScaleDownRate != nil {
		p.MaxDownRate = *s.MaxScaleDownRate
	}
	for _, r := range s.Roles {
		rp := autoscale.RolePolicy{Bounds: autoscale.Bounds{Min: r.MinReplicas, Max: r.MaxReplicas}}
		for _, m := range r.Metrics {
			if m.Source == "" || m.Source == "mesh" {
				rp.Targets = append(rp.Targets, autoscale.Target{Name: m.Name, Target: m.Target})
			}
		}
		p.Roles[r.Name] = rp
	}
	if s.Ratio != nil {
		p.Ratio = &autoscale.Ratio{Numerator: s.Ratio.NumeratorRole, Denominator: s.Ratio.DenominatorRole, Min: s.Ratio.MinRatio, Max: s.Ratio.MaxRatio}
	}
	if s.SLO != nil {
		p.SLO = &autoscale.SLO{
			TTFTSeconds: float64(max(s.SLO.TTFTMilliseconds, 1)) / 1000, TPOTSeconds: float64(max(s.SLO.TPOTMilliseconds, 1)) / 1000,
			PrefillTokensPerSecond: s.SLO.PrefillTokensPerSecond, DecodeStreamsPerReplica: s.SLO.DecodeStreamsPerReplica,
		}
		p.SLOPrefill, p.SLODecode = s.SLO.PrefillRole, s.SLO.DecodeRole
	}
	return p
}

// observe sums the mesh's load over a role's leader pods (engine id = pod
// name, as the injected sidecar reports it), per group.
func (c *Controller) observe(md *v1alpha1.ModelDeployment, engines map[string]gossip.EngineView) (map[string]autoscale.Observation, error) {
	pods, err := c.pods.Pods(md.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelWorker: "0"}))
	if err != nil {
		return nil, err
	}
	groups := float64(max(*md.Spec.Groups, 1))
	obs := map[string]autoscale.Observation{}
	for _, r := range md.Spec.Roles {
		var waiting, running, queued, kv float64
		n := 0
		for _, p := range pods {
			e, ok := engines[p.Name]
			if p.Labels[v1alpha1.LabelRole] != r.Name || !ok {
				continue
			}
			waiting += float64(e.Waiting)
			running += float64(e.Running)
			queued += float64(e.QueuedPrefill)
			kv += e.KVUsage
			n++
		}
		o := autoscale.Observation{Current: *r.Replicas, Metrics: map[string]float64{}}
		if n > 0 {
			o.Metrics[autoscale.WaitingRequests] = waiting / groups
			o.Metrics[autoscale.RunningRequests] = running / groups
			o.Metrics[autoscale.PrefillQueueTokens] = queued / groups
			o.Metrics[autoscale.KVUsage] = kv / float64(n)
		}
		obs[r.Name] = o
	}
	return obs, nil
}

func (c *Controller) stepPolicy(ctx context.Context, now time.Time, u *unstructured.Unstructured, ap *v1alpha1.AutoscalingPolicy) error {
	st := v1alpha1.AutoscalingPolicyStatus{ObservedGeneration: ap.Generation, LastScaleTime: ap.Status.LastScaleTime,
		Conditions: append([]metav1.Condition(nil), ap.Status.Conditions...)}
	cond := func(t string, s metav1.ConditionStatus, reason, msg string) {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: ap.Generation})
	}
	obj, err := c.mds.ByNamespace(ap.Namespace).Get(ap.Spec.Target)
	if err != nil {
		cond(v1alpha1.ConditionScalingActive, metav1.ConditionFalse, "TargetNotFound", fmt.Sprintf("ModelDeployment %q: %v", ap.Spec.Target, err))
		return c.writePolicyStatus(ctx, u, ap, st)
	}
	md := &v1alpha1.ModelDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(obj.(*unstructured.Unstructured).Object, md); err != nil {
		return err
	}
	md.Defaults()
	e := c.autoscalers[ap.UID]
	if e == nil || e.generation != ap.Generation {
		p := policyFromSpec(&ap.Spec)
		a, err := autoscale.New(p)
		if err != nil {
			cond(v1alpha1.ConditionScalingActive, metav1.ConditionFalse, "InvalidPolicy", err.Error())
			return c.writePolicyStatus(ctx, u, ap, st)
		}
		e = &policyEntry{generation: ap.Generation, uid: ap.UID, a: a, p: p}
		c.autoscalers[ap.UID] = e
	}
	engines := map[string]gossip.EngineView{}
	for _, v := range c.cfg.Load.Engines() {
		engines[v.ID] = v
	}
	obs, err := c.observe(md, engines)
	if err != nil {
		return err
	}
	res := e.a.Step(now, obs, nil)
	scaled := false
	for _, r := range ap.Spec.Roles {
		d, ok := res.Roles[r.Name]
		if !ok {
			continue
		}
		st.Roles = append(st.Roles, v1alpha1.RoleAutoscalingStatus{Name: r.Name, CurrentReplicas: d.Current, DesiredReplicas: d.Desired, Reason: d.Reason})
		if d.Desired != d.Current {
			if err := c.scaleRole(ctx, md, r.Name, d.Desired); err != nil {
				return err
			}
			c.recorder.Eventf(ap, corev1.EventTypeNormal, "Scaled", "role %s: %d -> %d (%s)", r.Name, d.Current, d.Desired, d.Reason)
			scaled = true
		}
	}
	if scaled {
		t := metav1.NewTime(now)
		st.LastScaleTime = &t
	}
	cond(v1alpha1.ConditionScalingActive, metav1.ConditionTrue, "Observing", fmt.Sprintf("%d engines in the mesh", len(engines)))
	switch {
	case res.Ratio == nil:
	case res.Ratio.Infeasible:
		cond(v1alpha1.ConditionRatioConstraintActive, metav1.ConditionTrue, "Infeasible", res.Ratio.Reason)
	case res.Ratio.Adjusted:
		cond(v1alpha1.ConditionRatioConstraintActive, metav1.ConditionTrue, "Adjusted", res.Ratio.Reason)
	default:
		cond(v1alpha1.ConditionRatioConstraintActive, metav1.ConditionFalse, "WithinBand", res.Ratio.Reason)
	}
	if ap.Spec.SLO != nil {
		// The mesh gossips queues and KV usage but not yet prompt tokens/s
		// or latency percentiles: the SLO mode's sizing (autoscale.SizeSLO)
		// has no live input here, which the condition says.
		cond(v1alpha1.ConditionSLOAtRisk, metav1.ConditionUnknown, "NoLatencySignal", "the mesh does not gossip TTFT/TPOT percentiles yet")
	}
	return c.writePolicyStatus(ctx, u, ap, st)
}

// scaleRole writes the role's RoleScaler through its /scale subresource,
// the same path an HPA takes; the controller copies it into the deployment.
func (c *Controller) scaleRole(ctx context.Context, md *v1alpha1.ModelDeployment, role string, n int32) error {
	rc := c.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(md.Namespace)
	s, err := rc.Get(ctx, scalerName(md.Name, role), metav1.GetOptions{}, "scale")
	if err != nil {
		return fmt.Errorf("get scale of role %s: %w", role, err)
	}
	if err := unstructured.SetNestedField(s.Object, int64(n), "spec", "replicas"); err != nil {
		return err
	}
	if _, err := rc.Update(ctx, s, metav1.UpdateOptions{}, "scale"); err != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("scale role %s: %w", role, err)
	}
	return nil
}

func (c *Controller) writePolicyStatus(ctx context.Context, u *unstructured.Unstructured, ap *v1alpha1.AutoscalingPolicy, st v1alpha1.AutoscalingPolicyStatus) error {
	if reflect.DeepEqual(st, ap.Status) {
		return nil
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&st)
	if err != nil {
		return err
	}
	u = u.DeepCopy()
	u.Object["status"] = obj
	_, err = c.dyn.Resource(v1alpha1.AutoscalingPoliciesResource).Namespace(ap.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil
	}
	return err
}
