package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// scalerName is the RoleScaler of one role.
func scalerName(md, role string) string { return md + "-" + role }

func roleSelector(md, role string) string {
	return labels.Set{v1alpha1.LabelDeployment: md, v1alpha1.LabelRole: role, v1alpha1.LabelWorker: "0"}.String()
}

// ownedScalers are the RoleScalers md controls (a controller owner
// reference with its UID). A RoleScaler anyone else made, whatever its spec
// names, is never driven, written or deleted by md's reconcile.
func (c *Controller) ownedScalers(md *v1alpha1.ModelDeployment) ([]*v1alpha1.RoleScaler, error) {
	objs, err := c.scalers.ByNamespace(md.Namespace).List(labels.Everything())
	if err != nil {
		return nil, err
	}
	var out []*v1alpha1.RoleScaler
	for _, o := range objs {
		s := &v1alpha1.RoleScaler{}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.(*unstructured.Unstructured).Object, s); err != nil {
			continue
		}
		if metav1.IsControlledBy(s, md) {
			out = append(out, s)
		}
	}
	return out, nil
}

// syncScalers keeps one RoleScaler per role, <md>-<role>, and its replicas
// equal to the role's: a scaler whose spec changed since the controller
// last saw it (generation > observedGeneration) was scaled by someone (HPA,
// KEDA, a user) and its value is copied into the deployment; otherwise the
// deployment's value is copied into the scaler. changed reports that the
// deployment was written (its event brings the next reconcile). conflicts
// names the roles whose <md>-<role> exists and is not md's: such a role
// runs at the deployment's replicas and has no RoleScaler.
func (c *Controller) syncScalers(ctx context.Context, md *v1alpha1.ModelDeployment, pods []*corev1.Pod) (changed bool, conflicts []string, err error) {
	existing, err := c.ownedScalers(md)
	if err != nil {
		return false, nil, err
	}
	byName := map[string]*v1alpha1.RoleScaler{}
	for _, s := range existing {
		byName[s.Name] = s
	}
	rc := c.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(md.Namespace)
	for i := range md.Spec.Roles {
		r := &md.Spec.Roles[i]
		name := scalerName(md.Name, r.Name)
		s := byName[name]
		delete(byName, name)
		if s == nil {
			if _, err := c.scalers.ByNamespace(md.Namespace).Get(name); err == nil {
				conflicts = append(conflicts, r.Name) // there, and not md's
				continue
			}
			mine, err := c.createScaler(ctx, md, r, pods)
			if err != nil {
				return false, nil, err
			}
			if !mine {
				conflicts = append(conflicts, r.Name)
			}
			continue
		}
		// Scaled by someone else: a generation the scaler's status has not
		// observed, and not the one the controller's own spec write made.
		c.scalerGens.forget(s.UID, s.Status.ObservedGeneration)
		external := s.Generation != s.Status.ObservedGeneration && !c.scalerGens.ours(s.UID, s.Generation)
		switch {
		case external && s.Spec.Replicas != *r.Replicas:
			err := c.patchRoleReplicas(ctx, md, i, s.Spec.Replicas)
			if apierrors.IsInvalid(err) {
				// The deployment cannot take the value (replicas below
				// the role's gangMinimum): the scale is refused, said once,
				// and the RoleScaler set back to the role's replicas; the
				// rest of the step goes on with the deployment as it is.
				msg := fmt.Sprintf("role %s: RoleScaler %s asked for %d replicas per group, which ModelDeployment %s refuses (%v); the RoleScaler is set back to %d",
					r.Name, s.Name, s.Spec.Replicas, md.Name, errors.Unwrap(err), *r.Replicas)
				c.recorder.Event(md, corev1.EventTypeWarning, reasonScaleRefused, msg)
				c.recorder.Event(s, corev1.EventTypeWarning, reasonScaleRefused, msg)
				if err := c.setScalerSpec(ctx, md, s, *r.Replicas, pods); err != nil {
					return false, nil, err
				}
				continue
			}
			if err != nil {
				return false, nil, err
			}
			c.recorder.Eventf(md, corev1.EventTypeNormal, "ScaledRole", "role %s: %d -> %d replicas per group (RoleScaler %s)",
				r.Name, *r.Replicas, s.Spec.Replicas, s.Name)
			changed = true
		case !external && s.Spec.Replicas != *r.Replicas:
			if err := c.setScalerSpec(ctx, md, s, *r.Replicas, pods); err != nil {
				return false, nil, err
			}
			continue
		}
		st := scalerStatus(md, r.Name, s.Generation, pods)
		if !reflect.DeepEqual(st, s.Status) {
			s.Status = st
			if err := c.writeScaler(ctx, s, true); err != nil {
				return false, nil, err
			}
		}
	}
	for _, s := range byName { // md's scalers of roles that were removed: only that object (UID)
		err := rc.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &s.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return false, nil, err
		}
	}
	return changed, conflicts, nil
}

// currentReplicas is the role's replicas per group as the /scale status
// reports them: existing leaders over existing groups.
func currentReplicas(md *v1alpha1.ModelDeployment, role string, pods []*corev1.Pod) int32 {
	groups := map[string]bool{}
	leaders := 0
	for _, p := range pods {
		groups[p.Labels[v1alpha1.LabelGroup]] = true
		if p.Labels[v1alpha1.LabelRole] == role && p.Labels[v1alpha1.LabelWorker] == "0" && p.DeletionTimestamp == nil {
			leaders++
		}
	}
	if len(groups) == 0 {
		return 0
	}
	return int32(leaders / len(groups))
}

// createScaler creates the role's RoleScaler. mine is false when one of
// that name exists and md does not control it (a user's, or one left by an
// earlier deployment of the same name): it is left alone.
func (c *Controller) createScaler(ctx context.Context, md *v1alpha1.ModelDeployment, r *v1alpha1.Role, pods []*corev1.Pod) (mine bool, err error) {
	s := &v1alpha1.RoleScaler{
		TypeMeta: metav1.TypeMeta{APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "RoleScaler"},
		ObjectMeta: metav1.ObjectMeta{
			Name: scalerName(md.Name, r.Name), Namespace: md.Namespace,
			Labels:          map[string]string{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelRole: r.Name},
			OwnerReferences: []metav1.OwnerReference{ownerRef(md)},
		},
		Spec: v1alpha1.RoleScalerSpec{Deployment: md.Name, Role: r.Name, Replicas: *r.Replicas},
	}
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		return false, err
	}
	rc := c.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(md.Namespace)
	out, err := rc.Create(ctx, &unstructured.Unstructured{Object: obj}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Ours, which the cache has not shown yet, or someone else's.
		got, gerr := rc.Get(ctx, s.Name, metav1.GetOptions{})
		if gerr != nil {
			return false, fmt.Errorf("get role scaler %s: %w", s.Name, gerr)
		}
		return metav1.IsControlledBy(got, md), nil
	}
	if err != nil {
		return false, fmt.Errorf("create role scaler %s: %w", s.Name, err)
	}
	// Its first generation is the controller's own write too (see
	// setScalerSpec): remembered, and observed in the status at once.
	c.scalerGens.expect(out.GetUID(), out.GetGeneration())
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out.Object, s); err != nil {
		return true, err
	}
	s.Status = scalerStatus(md, r.Name, s.Generation, pods)
	return true, c.writeScaler(ctx, s, true)
}

// reasonScaleRefused is the Warning event of a RoleScaler scale the
// deployment cannot take (the API server refuses it as invalid).
const reasonScaleRefused = "ScaleRefused"

func scalerStatus(md *v1alpha1.ModelDeployment, role string, gen int64, pods []*corev1.Pod) v1alpha1.RoleScalerStatus {
	return v1alpha1.RoleScalerStatus{
		ObservedGeneration: gen,
		Replicas:           currentReplicas(md, role, pods),
		Selector:           roleSelector(md.Name, role),
	}
}

// setScalerSpec is the controller's own write of a RoleScaler's
// spec.replicas. The generation it makes is remembered (scalerGens) and at
// once written as the status's observedGeneration, so that neither a later
// pass, reading the scaler before that status, nor another controller after
// a restart takes the controller's own write for someone else's scale and
// copies its (by then maybe stale) value back over a newer edit of the
// deployment.
func (c *Controller) setScalerSpec(ctx context.Context, md *v1alpha1.ModelDeployment, s *v1alpha1.RoleScaler, n int32, pods []*corev1.Pod) error {
	s = s.DeepCopy()
	s.Spec.Replicas = n
	out, err := c.updateScaler(ctx, s, false)
	if out == nil || err != nil {
		return err // nil, nil: a newer version exists; its event brings us back
	}
	c.scalerGens.expect(out.GetUID(), out.GetGeneration())
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(out.Object, s); err != nil {
		return err
	}
	s.Status = scalerStatus(md, s.Spec.Role, s.Generation, pods)
	return c.writeScaler(ctx, s, true)
}

func (c *Controller) writeScaler(ctx context.Context, s *v1alpha1.RoleScaler, status bool) error {
	_, err := c.updateScaler(ctx, s, status)
	return err
}

// updateScaler writes s (its status when status is set) and returns the
// object written; nil and no error when a newer version exists (its event
// brings us back).
func (c *Controller) updateScaler(ctx context.Context, s *v1alpha1.RoleScaler, status bool) (*unstructured.Unstructured, error) {
	s.APIVersion, s.Kind = v1alpha1.SchemeGroupVersion.String(), "RoleScaler"
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(s)
	if err != nil {
		return nil, err
	}
	rc := c.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(s.Namespace)
	u := &unstructured.Unstructured{Object: obj}
	var out *unstructured.Unstructured
	if status {
		out, err = rc.UpdateStatus(ctx, u, metav1.UpdateOptions{})
	} else {
		out, err = rc.Update(ctx, u, metav1.UpdateOptions{})
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, nil
	}
	return out, err
}

// patchRoleReplicas sets roles[i].replicas, checking the index still names
// the same role.
func (c *Controller) patchRoleReplicas(ctx context.Context, md *v1alpha1.ModelDeployment, i int, n int32) error {
	patch, _ := json.Marshal([]map[string]any{
		{"op": "test", "path": fmt.Sprintf("/spec/roles/%d/name", i), "value": md.Spec.Roles[i].Name},
		{"op": "add", "path": fmt.Sprintf("/spec/roles/%d/replicas", i), "value": n},
	})
	out, err := c.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(md.Namespace).
		Patch(ctx, md.Name, types.JSONPatchType, patch, metav1.PatchOptions{})
	if err != nil {
		return fmt.Errorf("scale role %s: %w", md.Spec.Roles[i].Name, err)
	}
	c.mdGens.expect(md.UID, out.GetGeneration())
	return nil
}
