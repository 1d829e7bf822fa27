package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Finalizer makes the controller delete a deployment's children before the
// deployment goes (no garbage collector is assumed).
const Finalizer = "kvmesh.io/cleanup"

// staleRequeue retries a deployment whose cached copy predates the
// controller's own write, in case that write's event is missed.
const staleRequeue = time.Second

// reconcile takes one step for the deployment named by key. It returns a
// delay after which to look again even without an event.
func (c *Controller) reconcile(ctx context.Context, key string) (time.Duration, error) {
	ns, name, err := cache.SplitMetaNamespaceKey(key)
	if err != nil {
		return 0, nil // malformed key: nothing to retry
	}
	obj, err := c.mds.ByNamespace(ns).Get(name)
	if apierrors.IsNotFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	u := obj.(*unstructured.Unstructured)
	md := &v1alpha1.ModelDeployment{}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, md); err != nil {
		return c.undecodable(ctx, u, err)
	}
	md.Defaults()
	if c.mdGens.stale(md.UID, md.Generation) {
		return staleRequeue, nil // our own write is on its way: its event brings us back
	}
	pods, err := c.ownedPods(md)
	if err != nil {
		return 0, err
	}
	if md.DeletionTimestamp != nil {
		return c.finalize(ctx, md, pods)
	}
	if probs := nameProblems(md); probs != nil {
		return 0, c.refuseNames(ctx, u, md, probs) // not retried: only an edit of the spec can help
	}
	if !slices.Contains(md.Finalizers, Finalizer) {
		return 0, c.setFinalizers(ctx, md, append(slices.Clone(md.Finalizers), Finalizer))
	}
	if err := c.ensureService(ctx, md); err != nil {
		return 0, err
	}
	changed, conflicts, err := c.syncScalers(ctx, md, pods)
	if err != nil || changed {
		return 0, err // the deployment changed: its event brings us back
	}
	p := computePlan(md, pods)
	gangErr := c.execute(ctx, md, p)
	if c.volcano && hasGroupAbove(pods, int(*md.Spec.Groups)) {
		if err := c.deletePodGroups(ctx, md, int(*md.Spec.Groups)); err != nil {
			return 0, err
		}
	}
	if err := c.updateStatus(ctx, u, md, pods, gangErr, conflicts); err != nil {
		return 0, err
	}
	return 0, gangErr
}

// ownedPods are the pods md controls (a controller owner reference with its
// UID) among those labelled with its name: a pod someone else labelled so is
// neither counted nor deleted.
func (c *Controller) ownedPods(md *v1alpha1.ModelDeployment) ([]*corev1.Pod, error) {
	all, err := c.pods.Pods(md.Namespace).List(labels.SelectorFromSet(labels.Set{v1alpha1.LabelDeployment: md.Name}))
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(all, func(p *corev1.Pod) bool { return !metav1.IsControlledBy(p, md) }), nil
}

// Condition reasons and events of a deployment the controller makes
// nothing from: names it cannot make objects from, or a spec that does not
// decode (a role template that is no PodTemplateSpec: the schema keeps a
// template's unknown fields, so the API server admits it).
const (
	reasonInvalidName     = "InvalidName"
	reasonInvalidTemplate = "InvalidTemplate"
)

// refuseNames refuses a deployment whose names make no valid objects.
func (c *Controller) refuseNames(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, probs []string) error {
	return c.refuse(ctx, u, md, reasonInvalidName, "nothing is created: "+strings.Join(probs, "; "))
}

// refuse says, once, on the status (Available and Progressing false with
// the reason) and in a warning event, why nothing is created.
func (c *Controller) refuse(ctx context.Context, u *unstructured.Unstructured, md *v1alpha1.ModelDeployment, reason, msg string) error {
	st := md.Status
	st.Conditions = slices.Clone(st.Conditions)
	st.ObservedGeneration = md.Generation
	for _, t := range []string{v1alpha1.ConditionAvailable, v1alpha1.ConditionProgressing} {
		meta.SetStatusCondition(&st.Conditions, metav1.Condition{Type: t, Status: metav1.ConditionFalse,
			Reason: reason, Message: msg, ObservedGeneration: md.Generation})
	}
	if reflect.DeepEqual(st, md.Status) {
		return nil // said already
	}
	c.recorder.Event(md, corev1.EventTypeWarning, reason, msg)
	return c.writeStatus(ctx, u, md, &st)
}

// undecodable handles a deployment whose spec does not decode. Cleanup needs
// only its metadata, so a deleted one still releases its children and its
// finalizer; otherwise it is refused (InvalidTemplate) and not retried: only
// an edit of the spec can help, and the edit's event brings it back. Its
// existing pods are left as they are.
func (c *Controller) undecodable(ctx context.Context, u *unstructured.Unstructured, derr error) (time.Duration, error) {
	md := &v1alpha1.ModelDeployment{}
	rest := u.DeepCopy()
	delete(rest.Object, "spec")
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rest.Object, md); err != nil {
		delete(rest.Object, "status") // a status some other writer broke is rewritten
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(rest.Object, md); err != nil {
			return 0, fmt.Errorf("decode %s/%s: %w", u.GetNamespace(), u.GetName(), err)
		}
	}
	if md.DeletionTimestamp != nil {
		pods, err := c.ownedPods(md)
		if err != nil {
			return 0, err
		}
		return c.finalize(ctx, md, pods)
	}
	return 0, c.refuse(ctx, u, md, reasonInvalidTemplate, fmt.Sprintf("nothing is created or changed: the spec does not decode (is every role's template a pod template?): %v", derr))
}

// execute carries out a plan: deletions, creations, then each new group as
// a gang (all of its minimum or none).
func (c *Controller) execute(ctx context.Context, md *v1alpha1.ModelDeployment, p *plan) error {
	var errs []error
	for _, d := range p.Delete {
		if err := c.deletePod(ctx, d.Pod, d.Reason); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range p.Recovered {
		c.recorder.Eventf(md, corev1.EventTypeWarning, "Recovering", "%s: recreating %s", md.Spec.RecoveryPolicy, r)
	}
	for role, n := range p.Rolled {
		c.recorder.Eventf(md, corev1.EventTypeNormal, "RollingUpdate", "role %s: replacing %d outdated replica(s)", role, n)
	}
	for _, s := range p.Create {
		if _, err := c.createPod(ctx, md, s); err != nil {
			errs = append(errs, err)
		}
	}
	groups := make([]int, 0, len(p.Gang))
	for g := range p.Gang {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		if err := c.createGang(ctx, md, g, p.Gang[g]); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// errGang marks a group whose gang could not be created.
var errGang = errors.New("gang not created")

func (c *Controller) createGang(ctx context.Context, md *v1alpha1.ModelDeployment, g int, slots []slot) error {
	if c.volcano {
		if err := c.ensurePodGroup(ctx, md, g); err != nil {
			return fmt.Errorf("group %d: %w: %w", g, errGang, err)
		}
	}
	var made []*corev1.Pod
	for _, s := range slots {
		pod, err := c.createPod(ctx, md, s)
		if err != nil {
			for _, p := range made {
				_ = c.deletePod(ctx, p, "GangRollback")
			}
			c.recorder.Eventf(md, corev1.EventTypeWarning, "GangFailed", "group %d: %v; rolled back %d pod(s)", g, err, len(made))
			return fmt.Errorf("group %d: %w: %w", g, errGang, err)
		}
		made = append(made, pod)
	}
	c.recorder.Eventf(md, corev1.EventTypeNormal, "GroupCreated", "group %d: created %d pod(s) as a gang", g, len(made))
	return nil
}

func (c *Controller) createPod(ctx context.Context, md *v1alpha1.ModelDeployment, s slot) (*corev1.Pod, error) {
	var role *v1alpha1.Role
	for i := range md.Spec.Roles {
		if md.Spec.Roles[i].Name == s.Role {
			role = &md.Spec.Roles[i]
		}
	}
	pod := buildPod(md, role, s)
	if c.volcano {
		pod.Annotations[annotationPodGroup] = podGroupName(md.Name, s.Group)
		if pod.Spec.SchedulerName == "" {
			pod.Spec.SchedulerName = "volcano"
		}
	}
	pod, err := c.kube.CoreV1().Pods(md.Namespace).Create(ctx, pod, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, nil // a stale cache: the pod is there
	}
	if err != nil {
		return nil, fmt.Errorf("create pod %s: %w", podName(md.Name, s), err)
	}
	podActions.WithLabelValues("create", "").Inc()
	return pod, nil
}

func (c *Controller) deletePod(ctx context.Context, p *corev1.Pod, reason string) error {
	if p == nil {
		return nil
	}
	err := c.kube.CoreV1().Pods(p.Namespace).Delete(ctx, p.Name, metav1.DeleteOptions{
		Preconditions: &metav1.Preconditions{UID: &p.UID},
	})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone already, or replaced since the cache saw it
	}
	if err != nil {
		return fmt.Errorf("delete pod %s: %w", p.Name, err)
	}
	podActions.WithLabelValues("delete", reason).Inc()
	return nil
}

func (c *Controller) ensureService(ctx context.Context, md *v1alpha1.ModelDeployment) error {
	_, err := c.kube.CoreV1().Services(md.Namespace).Create(ctx, headlessService(md), metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		// Ours from an earlier pass, or someone else's of the same name:
		// that one is left alone (and never deleted with the deployment),
		// and said once per pass, since the pods' DNS names go through it.
		svc, gerr := c.kube.CoreV1().Services(md.Namespace).Get(ctx, md.Name, metav1.GetOptions{})
		if gerr == nil && !metav1.IsControlledBy(svc, md) {
			c.recorder.Eventf(md, corev1.EventTypeWarning, "ServiceConflict",
				"service %s exists and is not this deployment's: the pods' names (subdomain %s) resolve only if it is headless and selects them", md.Name, md.Name)
		}
		return nil
	}
	if err != nil {
		return fmt.Errorf("create service: %w", err)
	}
	return nil
}

// setFinalizers writes the finalizer list, guarded by the resourceVersion.
func (c *Controller) setFinalizers(ctx context.Context, md *v1alpha1.ModelDeployment, fin []string) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers": fin, "resourceVersion": md.ResourceVersion,
	}})
	_, err := c.dyn.Resource(v1alpha1.ModelDeploymentsResource).Namespace(md.Namespace).
		Patch(ctx, md.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) {
		return nil
	}
	return err
}

// finalize deletes every child, then releases the deployment.
func (c *Controller) finalize(ctx context.Context, md *v1alpha1.ModelDeployment, pods []*corev1.Pod) (time.Duration, error) {
	if !slices.Contains(md.Finalizers, Finalizer) {
		return 0, nil
	}
	var errs []error
	for _, p := range pods {
		if p.DeletionTimestamp == nil {
			errs = append(errs, c.deletePod(ctx, p, "Cleanup"))
		}
	}
	scalers, err := c.ownedScalers(md)
	if err != nil {
		return 0, err
	}
	for _, s := range scalers {
		err := c.dyn.Resource(v1alpha1.RoleScalersResource).Namespace(md.Namespace).Delete(ctx, s.Name, metav1.DeleteOptions{})
		if err != nil && !apierrors.IsNotFound(err) {
			errs = append(errs, err)
		}
	}
	if c.volcano {
		errs = append(errs, c.deletePodGroups(ctx, md, 0))
	}
	// The headless service, only when it is this deployment's (a user's
	// service of the same name stays), and only that object (UID).
	if svc, err := c.kube.CoreV1().Services(md.Namespace).Get(ctx, md.Name, metav1.GetOptions{}); err == nil && metav1.IsControlledBy(svc, md) {
		err = c.kube.CoreV1().Services(md.Namespace).Delete(ctx, md.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &svc.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			errs = append(errs, err)
		}
	} else if err != nil && !apierrors.IsNotFound(err) {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return 0, err
	}
	if len(pods) > 0 || len(scalers) > 0 {
		return time.Second, nil // wait until the cache shows them gone
	}
	c.recorder.Eventf(md, corev1.EventTypeNormal, "CleanedUp", "deleted every pod, role scaler and the service")
	return 0, c.setFinalizers(ctx, md, slices.DeleteFunc(slices.Clone(md.Finalizers), func(f string) bool { return f == Finalizer }))
}

// hasGroupAbove reports a pod of a group ≥ groups (a group scale-down).
func hasGroupAbove(pods []*corev1.Pod, groups int) bool {
	for _, p := range pods {
		if s, ok := slotOf(p); ok && s.Group >= groups {
			return true
		}
	}
	return false
}
