package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
	"github.com/kvmesh/kvmesh/orchestrator/autoscale"
)

// The adoption mode: an AutoscalingPolicy without a target ModelDeployment
// names, per role, an existing Deployment, StatefulSet or LeaderWorkerSet
// (by name, or by a label selector that selects exactly one), and scales it
// through its /scale subresource as an HPA would. The role's engines are
// the pods the workload's scale selector selects; the mesh knows them by pod
// name (the injected sidecar's engine id), and the router knows their role
// from the pod label kvmesh.io/role-kind, which the webhook hands to the
// sidecar as --role.
//
// Workloads and pods are read each step with a label-selected List served
// from the API server's watch cache (resourceVersion 0) and a GET of /scale,
// the HPA controller's pattern: watching every Deployment and StatefulSet
// of the cluster for the few adopted ones would cost the controller memory
// and RBAC on objects it never changes otherwise.

// Workload resources by kind.
var workloadResources = map[string]schema.GroupVersionResource{
	v1alpha1.WorkloadDeployment:      {Group: "apps", Version: "v1", Resource: "deployments"},
	v1alpha1.WorkloadStatefulSet:     {Group: "apps", Version: "v1", Resource: "statefulsets"},
	v1alpha1.WorkloadLeaderWorkerSet: {Group: "leaderworkerset.x-k8s.io", Version: "v1", Resource: "leaderworkersets"},
}

// targetError is a target the policy cannot scale: reported as the
// ScalingActive condition (False) with its reason, never retried faster
// than the autoscale interval.
type targetError struct {
	reason, msg string
	err         error // what errors.Is finds (errScaleConflict), or nil
}

func (e *targetError) Error() string { return e.reason + ": " + e.msg }

func (e *targetError) Unwrap() error { return e.err }

// errScaleConflict: a write of a /scale did not happen because the object
// changed under it (409 Conflict on every attempt, or its replicas are no
// longer those the step decided from: another writer scaled it). Nothing was
// scaled; the next step decides again from what is there.
var errScaleConflict = errors.New("the /scale changed while it was written")

// Reasons of a policy whose target cannot be scaled.
const (
	reasonTargetNotFound  = "TargetNotFound"
	reasonInvalidTarget   = "InvalidTarget"
	reasonAmbiguous       = "AmbiguousTarget"
	reasonKindUnavailable = "WorkloadKindUnavailable"
	reasonForbidden       = "Forbidden"
	// reasonRoleNotFound: the policy names a role its ModelDeployment lacks.
	reasonRoleNotFound = "RoleNotFound"
	// reasonScaleFailed: reading or writing the target's /scale failed
	// (the API server did not answer, a webhook refused it).
	reasonScaleFailed = "ScaleFailed"
	// reasonScaleConflict: the target's /scale was not written, it changed
	// under the write (errScaleConflict); retried at the next step.
	reasonScaleConflict = "ScaleConflict"
)

func badTarget(reason, format string, a ...any) *targetError {
	return &targetError{reason: reason, msg: fmt.Sprintf(format, a...)}
}

// roleTarget is what a policy scales for one role, wherever it lives.
type roleTarget struct {
	current int32
	// engines are the engine ids (leader pod names) of the role.
	engines []string
	// groups divides the mesh's totals (a ModelDeployment's groups; 1).
	groups float64
	// workload is "Kind/name" of an adopted workload ("" otherwise).
	workload string
	// deployment is the ModelDeployment of the role ("" when adopted), and
	// podsPerReplica what one more replica costs of its pod budget
	// (v1alpha1.MaxPods): groups × (1 + workers).
	deployment     string
	podsPerReplica int64
	// scale writes the role's replicas; an error wrapping errScaleConflict
	// when it did not because the target changed under it.
	scale func(ctx context.Context, n int32) error
}

// podBudget is the pod budget a policy's step keeps its targets in
// (Autoscaler.StepWithin): a ModelDeployment's controller refuses, and
// freezes, a deployment above v1alpha1.MaxPods pods, so a role is never
// scaled past what the deployment can hold beside its other roles. Adopted
// workloads have none (nil).
func podBudget(targets map[string]roleTarget) *autoscale.PodBudget {
	var b *autoscale.PodBudget
	for name, t := range targets {
		if t.podsPerReplica <= 0 {
			continue
		}
		if b == nil {
			b = &autoscale.PodBudget{Limit: v1alpha1.MaxPods, PerReplica: map[string]int64{}, Of: "ModelDeployment " + t.deployment}
		}
		b.PerReplica[name] = t.podsPerReplica
	}
	return b
}

// adoptedTargets resolves every role's workload; the first bad one fails
// the policy (a ratio band or the SLO mode needs all roles).
func (c *Controller) adoptedTargets(ctx context.Context, ap *v1alpha1.AutoscalingPolicy) (map[string]roleTarget, error) {
	out := map[string]roleTarget{}
	for _, r := range ap.Spec.Roles {
		if r.Workload == nil {
			return nil, badTarget(reasonInvalidTarget, "role %s: no workload and the policy has no target", r.Name)
		}
		t, err := c.adoptWorkload(ctx, ap.Namespace, r.Name, r.Workload)
		if err != nil {
			return nil, err
		}
		out[r.Name] = t
	}
	return out, nil
}

// adoptWorkload finds one role's workload, reads its /scale and lists the
// pods its scale selector selects.
func (c *Controller) adoptWorkload(ctx context.Context, ns, role string, w *v1alpha1.WorkloadRef) (roleTarget, error) {
	gvr, ok := workloadResources[w.Kind]
	if !ok {
		return roleTarget{}, badTarget(reasonInvalidTarget, "role %s: workload kind %q (want Deployment, StatefulSet or LeaderWorkerSet)", role, w.Kind)
	}
	rc := c.dyn.Resource(gvr).Namespace(ns)
	name := w.Name
	switch {
	case name != "" && w.Selector != nil, name == "" && w.Selector == nil:
		return roleTarget{}, badTarget(reasonInvalidTarget, "role %s: a workload is named by exactly one of name or selector", role)
	case w.Selector != nil:
		sel, err := metav1.LabelSelectorAsSelector(w.Selector)
		if err != nil {
			return roleTarget{}, badTarget(reasonInvalidTarget, "role %s: selector: %v", role, err)
		}
		if sel.Empty() {
			return roleTarget{}, badTarget(reasonInvalidTarget, "role %s: an empty selector would adopt every %s", role, w.Kind)
		}
		l, err := rc.List(ctx, metav1.ListOptions{LabelSelector: sel.String(), ResourceVersion: "0"})
		if err != nil {
			return roleTarget{}, listError(role, w.Kind, err)
		}
		switch len(l.Items) {
		case 0:
			return roleTarget{}, badTarget(reasonTargetNotFound, "role %s: no %s matches %s", role, w.Kind, sel)
		case 1:
			name = l.Items[0].GetName()
		default:
			return roleTarget{}, badTarget(reasonAmbiguous, "role %s: %d %ss match %s (want exactly one)", role, len(l.Items), w.Kind, sel)
		}
	}
	s, err := rc.Get(ctx, name, metav1.GetOptions{}, "scale")
	if err != nil {
		return roleTarget{}, listError(role, w.Kind+" "+name, err)
	}
	replicas, _, _ := unstructured.NestedInt64(s.Object, "spec", "replicas")
	selStr, _, _ := unstructured.NestedString(s.Object, "status", "selector")
	t := roleTarget{current: int32(replicas), groups: 1, workload: w.Kind + "/" + name}
	if selStr != "" {
		podSel, err := labels.Parse(selStr)
		if err != nil {
			return roleTarget{}, badTarget(reasonInvalidTarget, "role %s: %s/%s scale selector %q: %v", role, w.Kind, name, selStr, err)
		}
		pods, err := c.kube.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{LabelSelector: podSel.String(), ResourceVersion: "0"})
		if err != nil {
			return roleTarget{}, fmt.Errorf("role %s: list pods: %w", role, err)
		}
		for _, p := range pods.Items {
			if p.DeletionTimestamp == nil {
				t.engines = append(t.engines, p.Name)
			}
		}
	}
	from := t.current
	t.scale = func(ctx context.Context, n int32) error { return scaleWorkload(ctx, c, gvr, ns, name, from, n) }
	return t, nil
}

// listError maps API errors on a workload: an unserved kind (a
// LeaderWorkerSet without its CRD) and a missing object are conditions, the
// rest (API server unavailable, forbidden) are errors that are logged.
func listError(role, what string, err error) error {
	var st apierrors.APIStatus
	switch {
	case apierrors.IsNotFound(err) && errors.As(err, &st) && st.Status().Details != nil && st.Status().Details.Name != "":
		return badTarget(reasonTargetNotFound, "role %s: %s: %v", role, what, err)
	case apierrors.IsNotFound(err):
		return badTarget(reasonKindUnavailable, "role %s: %s is not served by this cluster (is its CRD installed?): %v", role, what, err)
	case apierrors.IsForbidden(err):
		return badTarget(reasonForbidden, "role %s: %s: %v (see the RBAC in manifests/orchestrator/rbac.yaml)", role, what, err)
	}
	return fmt.Errorf("role %s: %s: %w", role, what, err)
}

// scaleAttempts bounds the writes of one /scale at a step: a 409 from a
// change that left the replicas alone (the workload controller's status
// write, a label) is retried on a fresh read.
const scaleAttempts = 3

// scaleWorkload writes n replicas through the workload's /scale if it is
// still at from, the replicas the step decided from. A 409 is retried on a
// fresh read; replicas another writer changed, or a 409 on every attempt,
// return an error wrapping errScaleConflict (reason ScaleConflict) and
// nothing is written: the step did not scale, the next one decides again.
func scaleWorkload(ctx context.Context, c *Controller, gvr schema.GroupVersionResource, ns, name string, from, n int32) error {
	rc := c.dyn.Resource(gvr).Namespace(ns)
	for range scaleAttempts {
		s, err := rc.Get(ctx, name, metav1.GetOptions{}, "scale")
		if err != nil {
			return fmt.Errorf("get scale of %s %s: %w", gvr.Resource, name, err)
		}
		if cur, _, _ := unstructured.NestedInt64(s.Object, "spec", "replicas"); cur != int64(from) {
			return &targetError{reason: reasonScaleConflict, err: errScaleConflict,
				msg: fmt.Sprintf("%s %s: /scale is at %d replicas, not the %d this step decided %d from (another writer scales it?); decided again at the next step", gvr.Resource, name, cur, from, n)}
		}
		if err := unstructured.SetNestedField(s.Object, int64(n), "spec", "replicas"); err != nil {
			return err
		}
		_, err = rc.Update(ctx, s, metav1.UpdateOptions{}, "scale")
		if err == nil {
			return nil
		}
		if !apierrors.IsConflict(err) {
			return fmt.Errorf("scale %s %s: %w", gvr.Resource, name, err)
		}
	}
	return &targetError{reason: reasonScaleConflict, err: errScaleConflict,
		msg: fmt.Sprintf("%s %s: /scale to %d: 409 Conflict %d times (the object changes under every write); retried at the next step", gvr.Resource, name, n, scaleAttempts)}
}

// modelDeploymentTargets are the roles of the policy's ModelDeployment:
// engines are the role's leader pods, scaled through the RoleScalers.
func (c *Controller) modelDeploymentTargets(ap *v1alpha1.AutoscalingPolicy) (map[string]roleTarget, error) {
	obj, err := c.mds.ByNamespace(ap.Namespace).Get(ap.Spec.Target)
	if err != nil {
		return nil, badTarget(reasonTargetNotFound, "ModelDeployment %q: %v", ap.Spec.Target, err)
	}
	md := &v1alpha1.ModelDeployment{}
	if err := runtimeFromUnstructured(obj, md); err != nil {
		return nil, badTarget(reasonInvalidTarget, "ModelDeployment %q: %v", ap.Spec.Target, err)
	}
	md.Defaults()
	pods, err := c.pods.Pods(md.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelWorker: "0"}))
	if err != nil {
		return nil, err
	}
	groups := float64(max(*md.Spec.Groups, 1))
	out := map[string]roleTarget{}
	for _, r := range md.Spec.Roles {
		t := roleTarget{current: *r.Replicas, groups: groups, deployment: md.Name, podsPerReplica: int64(groups) * int64(members(&r))}
		for _, p := range pods {
			if p.Labels[v1alpha1.LabelRole] == r.Name && metav1.IsControlledBy(p, md) {
				t.engines = append(t.engines, p.Name)
			}
		}
		role := r.Name
		t.scale = func(ctx context.Context, n int32) error { return c.scaleRole(ctx, md, role, n) }
		out[r.Name] = t
	}
	// A policy role the deployment lacks would show as scaling while
	// nothing is scaled: the policy is wrong, as with a ratio's unknown role.
	var missing []string
	for _, r := range ap.Spec.Roles {
		if _, ok := out[r.Name]; !ok {
			missing = append(missing, r.Name)
		}
	}
	if len(missing) > 0 {
		have := make([]string, len(md.Spec.Roles))
		for i, r := range md.Spec.Roles {
			have[i] = r.Name
		}
		return nil, badTarget(reasonRoleNotFound, "ModelDeployment %s has no role %s (its roles: %s)", md.Name, strings.Join(missing, ", "), strings.Join(have, ", "))
	}
	if err := aggregateEngine(ap, md); err != nil {
		return nil, err
	}
	return out, nil
}

// aggregateEngine refuses slo.aggregateBelow for a ModelDeployment whose
// decode servers cannot serve whole requests: an SGLang decode server
// takes a request only with a prefill server's bootstrap, so with the
// prefill role at zero every request would fail.
func aggregateEngine(ap *v1alpha1.AutoscalingPolicy, md *v1alpha1.ModelDeployment) *targetError {
	if s := ap.Spec.SLO; s != nil && s.AggregateBelow > 0 && md.Spec.Engine == v1alpha1.EngineSGLang {
		return badTarget(reasonInvalidPolicy, "slo.aggregateBelow %v: ModelDeployment %s runs sglang, whose decode servers cannot serve whole requests "+
			"(each needs a prefill server's bootstrap), so the prefill role cannot go to zero; remove aggregateBelow", s.AggregateBelow, md.Name)
	}
	return nil
}
