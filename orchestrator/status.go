package orchestrator

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// computeStatus derives the status from the pods the controller saw.
// conflicts names the roles whose RoleScaler name another object holds,
// held the pods whose names another pod holds.
func computeStatus(md *v1alpha1.ModelDeployment, pods []*corev1.Pod, old v1alpha1.ModelDeploymentStatus, gangErr error, conflicts, held []string) v1alpha1.ModelDeploymentStatus {
	st, _ := newState(pods)
	groups := int(*md.Spec.Groups)
	out := v1alpha1.ModelDeploymentStatus{
		ObservedGeneration: md.Generation,
		Selector:           selectorFor(md.Name),
		Conditions:         append([]metav1.Condition(nil), old.Conditions...),
	}
	for g := range st.groups {
		if g < groups {
			out.Groups++
		}
	}
	complete, partitioned := true, 0
	revs := make([]string, len(md.Spec.Roles))
	for i := range md.Spec.Roles {
		r := &md.Spec.Roles[i]
		rev := revision(md, r)
		revs[i] = rev
		rs := v1alpha1.RoleStatus{Name: r.Name, Revision: rev}
		var roleHeld int32 // outdated replicas below the partition: the rollout leaves them
		for s := range st.bySlot {
			if s.Role != r.Name || s.Member != 0 || s.Group >= groups || s.Replica >= int(*r.Replicas) {
				continue
			}
			rs.Replicas++
			// Updated: every member is at the current revision (a leader
			// alone says nothing of its workers).
			rep := st.replica(s.Group, r, s.Replica, rev, nil)
			if rep.Ready {
				rs.ReadyReplicas++
			}
			switch {
			case !rep.Old && !rep.Lost:
				rs.UpdatedReplicas++
			case rep.Old && !rep.Lost && !rep.Mixed && s.Replica < int(*r.Rollout.Partition):
				roleHeld++
			}
		}
		want := int32(groups) * *r.Replicas
		if rs.Replicas != want || rs.UpdatedReplicas+roleHeld != want {
			complete = false
		}
		partitioned += int(roleHeld)
		out.Roles = append(out.Roles, rs)
	}
	for g := range groups {
		if groupReady(md, st, g, revs) {
			out.ReadyGroups++
		}
	}
	out.Ready = strconv.Itoa(int(out.ReadyGroups)) + "/" + strconv.Itoa(groups)
	setConditions(&out, md, groups, complete, partitioned, gangErr, conflicts, held)
	return out
}

// setConditions: complete means every replica exists at the current
// revision, or, for held of them, at the old one below rollout.partition.
func setConditions(out *v1alpha1.ModelDeploymentStatus, md *v1alpha1.ModelDeployment, groups int, complete bool, held int, gangErr error, conflicts, namesHeld []string) {
	cond := func(t string, ok bool, reason, msg string) {
		s := metav1.ConditionFalse
		if ok {
			s = metav1.ConditionTrue
		}
		meta.SetStatusCondition(&out.Conditions, metav1.Condition{
			Type: t, Status: s, Reason: reason, Message: msg, ObservedGeneration: md.Generation,
		})
	}
	if int(out.ReadyGroups) == groups {
		cond(v1alpha1.ConditionAvailable, true, "AllGroupsReady", fmt.Sprintf("%d/%d groups ready", out.ReadyGroups, groups))
	} else {
		cond(v1alpha1.ConditionAvailable, false, "GroupsNotReady", fmt.Sprintf("%d/%d groups ready", out.ReadyGroups, groups))
	}
	switch {
	case complete && held > 0:
		// Settled as a Deployment paused mid-rollout: nothing more happens
		// until the partition is lowered.
		cond(v1alpha1.ConditionProgressing, false, reasonPartitionHeld,
			fmt.Sprintf("every replica exists; %d below rollout.partition keep the old revision until it is lowered", held))
	case complete:
		cond(v1alpha1.ConditionProgressing, false, "Complete", "every replica exists at the current revision")
	case len(namesHeld) > 0 && (gangErr == nil || onlyHeld(gangErr)):
		// Stuck, not progressing: only deleting the holders helps.
		cond(v1alpha1.ConditionProgressing, false, reasonPodNameConflict, podNameConflictMessage(namesHeld))
	default:
		cond(v1alpha1.ConditionProgressing, true, "Reconciling", "creating, deleting or rolling replicas")
	}
	if gangErr != nil && errors.Is(gangErr, errGang) {
		cond(v1alpha1.ConditionGangBlocked, true, "GangCreateFailed", gangErr.Error())
	} else {
		cond(v1alpha1.ConditionGangBlocked, false, "GangsComplete", "every group was created whole")
	}
	if len(namesHeld) > 0 {
		cond(v1alpha1.ConditionPodNameConflict, true, reasonPodNameConflict, podNameConflictMessage(namesHeld))
	} else {
		cond(v1alpha1.ConditionPodNameConflict, false, "PodNamesFree", "no pod holds the name of one of this deployment's slots")
	}
	if len(conflicts) > 0 {
		cond(v1alpha1.ConditionRoleScalerConflict, true, reasonRoleScalerConflict, scalerConflictMessage(md, conflicts))
	} else {
		cond(v1alpha1.ConditionRoleScalerConflict, false, "RoleScalersControlled", "every role has its RoleScaler")
	}
}

// groupReady: every replica of group g is ready, every member it was made
// with existing and ready (a worker slot added to an outdated replica's
// role never existed); revs holds the roles' revisions.
func groupReady(md *v1alpha1.ModelDeployment, st *state, g int, revs []string) bool {
	for i := range md.Spec.Roles {
		r := &md.Spec.Roles[i]
		for rep := range int(*r.Replicas) {
			if !st.replica(g, r, rep, revs[i], nil).Ready {
				return false
			}
		}
	}
	return true
}

// reasonPartitionHeld: the rollout is as far as rollout.partition lets it go.
const reasonPartitionHeld = "PartitionHeld"

// reasonRoleScalerConflict is the event and condition reason of a role
// whose RoleScaler's name another object holds.
const reasonRoleScalerConflict = "RoleScalerConflict"

// reasonPodNameConflict is the event and condition reason of a slot whose
// pod name a pod the deployment does not control holds.
const reasonPodNameConflict = "PodNameConflict"

func podNameConflictMessage(names []string) string {
	return fmt.Sprintf("pod %s exists and is not this deployment's: its slot stays empty until it is deleted", strings.Join(names, ", "))
}

func scalerConflictMessage(md *v1alpha1.ModelDeployment, roles []string) string {
	names := make([]string, len(roles))
	for i, r := range roles {
		names[i] = scalerName(md.Name, r)
	}
	return fmt.Sprintf("RoleScaler %s exists and is not this deployment's: role %s is not scaled through it (it keeps the deployment's replicas); delete or rename it",
		strings.Join(names, ", "), strings.Join(roles, ", "))
}

// updateStatus writes the status subresource when it changed, with a
// Warning event when a RoleScaler conflict is new.
func (c *Controller) updateStatus(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, pods []*corev1.Pod, gangErr, svcErr error, svcConflict bool, conflicts, held []string) error {
	st := computeStatus(md, pods, md.Status, gangErr, conflicts, held)
	setServiceCondition(&st, md, svcErr, svcConflict)
	_, err := c.putStatus(ctx, u, md, st)
	return err
}

// startStatus writes, before a step that creates or deletes pods, the
// status as the step starts: this generation observed, the groups and
// replicas as they are, Progressing True. Creating a large deployment
// takes minutes at the client's rate limit, and the status written after
// the step said the previous generation (Complete, its group count) all
// along. What only the step's end knows (a gang that failed, a pod name
// held) is said as the last step found it: GangBlocked as it was, and
// the slots whose names were held then. As the Deployment controller, it
// writes once as the work starts and once as it ends, not per pod. It
// returns md as written (u and md.Status updated), or as it was when
// nothing changed.
func (c *Controller) startStatus(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, pods []*corev1.Pod, p *plan, svcErr error, svcConflict bool, conflicts []string) (*unstructured.Unstructured, error) {
	old := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionGangBlocked)
	var held []string
	slots := slices.Clone(p.Create) // in execute's order: its held names are said in it
	for _, g := range slices.Sorted(maps.Keys(p.Gang)) {
		slots = append(slots, p.Gang[g]...)
	}
	for _, s := range slots {
		if name := podName(md.Name, s); c.held.has(heldKey{md.UID, "pod", name}) {
			held = append(held, name)
		}
	}
	// No gang error: with names held, Progressing is False for them, as
	// the last step's end said unless a gang also failed otherwise.
	st := computeStatus(md, pods, md.Status, nil, conflicts, held)
	setServiceCondition(&st, md, svcErr, svcConflict)
	if old != nil {
		meta.SetStatusCondition(&st.Conditions, *old)
	} else {
		meta.RemoveStatusCondition(&st.Conditions, v1alpha1.ConditionGangBlocked) // said once a gang was tried
	}
	return c.putStatus(ctx, u, md, st)
}

// putStatus writes st unless md has it already, and returns md as written
// (u, with md.Status set to st), or u when nothing was written.
func (c *Controller) putStatus(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, st v1alpha1.ModelDeploymentStatus) (*unstructured.Unstructured, error) {
	if reflect.DeepEqual(st, md.Status) {
		return u, nil
	}
	if now := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionRoleScalerConflict); now.Status == metav1.ConditionTrue {
		if old := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionRoleScalerConflict); old == nil || old.Status != now.Status || old.Message != now.Message {
			c.recorder.Event(md, corev1.EventTypeWarning, reasonRoleScalerConflict, now.Message)
		}
	}
	if now := meta.FindStatusCondition(st.Conditions, v1alpha1.ConditionServiceReady); now.Status == metav1.ConditionFalse {
		if old := meta.FindStatusCondition(md.Status.Conditions, v1alpha1.ConditionServiceReady); old == nil || old.Status != now.Status || old.Message != now.Message {
			c.recorder.Event(md, corev1.EventTypeWarning, reasonServiceError, now.Message)
		}
	}
	got, err := c.writeStatusObject(ctx, u, md, &st)
	if err != nil || got == nil {
		return u, err
	}
	md.Status = st
	return got, nil
}

// reasonServiceError is the event and condition reason of a deployment
// whose headless Service could not be created or repaired.
const reasonServiceError = "ServiceError"

// setServiceCondition sets ServiceReady from the last attempt to create or
// repair md's headless Service (svcErr), or from a Service of its name
// that is not md's (conflict: left alone).
func setServiceCondition(st *v1alpha1.ModelDeploymentStatus, md *v1alpha1.ModelDeployment, svcErr error, conflict bool) {
	c := metav1.Condition{Type: v1alpha1.ConditionServiceReady, Status: metav1.ConditionTrue, Reason: "ServiceReconciled",
		Message: "the headless Service " + md.Name + " selects the deployment's pods", ObservedGeneration: md.Generation}
	switch {
	case conflict:
		c.Status, c.Reason, c.Message = metav1.ConditionFalse, reasonServiceConflict, serviceConflictMessage(md)
	case svcErr != nil:
		c.Status, c.Reason = metav1.ConditionFalse, reasonServiceError
		c.Message = fmt.Sprintf("the headless Service %s could not be set up (the pods' DNS names resolve through it; retried): %v", md.Name, svcErr)
	}
	meta.SetStatusCondition(&st.Conditions, c)
}

// writeStatus writes st as md's status subresource (u is md as read).
func (c *Controller) writeStatus(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, st *v1alpha1.ModelDeploymentStatus) error {
	_, err := c.writeStatusObject(ctx, u, md, st)
	return err
}

// writeStatusObject is writeStatus returning md as written (nil, with no
// error, when a newer version is on its way through the informer).
func (c *Controller) writeStatusObject(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, st *v1alpha1.ModelDeploymentStatus) (*unstructured.Unstructured, error) {
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(st)
	if err != nil {
		return nil, err
	}
	u = u.DeepCopy()
	u.Object["status"] = obj
	got, err := c.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(md.Namespace).UpdateStatus(ctx, u, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		return nil, nil // a newer version is on its way through the informer
	}
	return got, err
}
