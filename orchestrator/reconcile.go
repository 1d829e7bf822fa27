package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"
	"sync"
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
	if n := totalPods(md); n > v1alpha1.MaxPods {
		if slices.Contains(md.Finalizers, Finalizer) {
			// Set up before (scaled up since): a RoleScaler scale, the
			// documented way to size a role, is still taken, and may make
			// the deployment valid again.
			if changed, _, err := c.syncScalers(ctx, md, pods); err != nil || changed {
				return 0, err // the deployment changed: its event brings us back
			}
		}
		return 0, c.refuse(ctx, u, md, reasonTooManyPods, fmt.Sprintf("nothing is created or changed: %d pods (groups × replicas × (1 + workers), over every role) is more than the %d a deployment may have",
			n, v1alpha1.MaxPods))
	}
	if !slices.Contains(md.Finalizers, Finalizer) {
		return 0, c.setFinalizers(ctx, md, append(slices.Clone(md.Finalizers), Finalizer))
	}
	// A Service that cannot be created or repaired (a missing RBAC verb, a
	// quota) is reported (condition ServiceReady False, a Warning event)
	// and retried, and blocks nothing else: the pods, their scaling and
	// status go on (their DNS names need the Service, their engines do not).
	svcConflict, svcErr := c.ensureService(ctx, md)
	// A RoleScaler scale the deployment refuses is reported and undone
	// inside syncScalers: the step goes on with the deployment as it is.
	changed, conflicts, err := c.syncScalers(ctx, md, pods)
	if err != nil || changed {
		return 0, errors.Join(err, svcErr) // the deployment changed: its event brings us back
	}
	p := computePlan(md, pods)
	if len(p.Delete) > 0 || len(p.Create) > 0 || len(p.Gang) > 0 {
		// The step may take minutes (the client's rate limit): the status
		// says it progresses, at this generation, before it starts.
		if u, err = c.startStatus(ctx, u, md, pods, p, svcErr, svcConflict, conflicts); err != nil {
			return 0, errors.Join(err, svcErr)
		}
	}
	held, gangErr := c.execute(ctx, md, p)
	if errors.Is(gangErr, errSuperseded) {
		return 0, nil // deleted or edited meanwhile: its event brings the next step
	}
	if c.volcano && hasGroupAbove(pods, int(*md.Spec.Groups)) {
		if err := c.deletePodGroups(ctx, md, int(*md.Spec.Groups)); err != nil {
			return 0, err
		}
	}
	if err := c.updateStatus(ctx, u, md, pods, gangErr, svcErr, svcConflict, conflicts, held); err != nil {
		return 0, errors.Join(err, svcErr)
	}
	if svcErr != nil {
		return 0, errors.Join(svcErr, gangErr)
	}
	if (len(held) > 0 || svcConflict) && gangErr == nil {
		// The pod holding a slot's name, or the user's Service holding
		// the deployment's, goes without an event the controller sees
		// (neither is labelled as md's): look again, with a read
		// (createPod, ensureService).
		return c.heldRequeue, nil
	}
	return 0, gangErr
}

// nameHeldRequeue is how often a deployment looks again at a slot whose
// pod name another pod holds (Controller.heldRequeue; a test shortens it).
const nameHeldRequeue = 10 * time.Second

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
	reasonTooManyPods     = "TooManyPods"
)

// totalPods is how many pods md's spec asks for (defaulted).
func totalPods(md *v1alpha1.ModelDeployment) int {
	per := 0
	for i := range md.Spec.Roles {
		per += int(*md.Spec.Roles[i].Replicas) * members(&md.Spec.Roles[i])
	}
	return int(*md.Spec.Groups) * per
}

// errSuperseded stops a step whose deployment was deleted or edited since
// it was read: creating a large deployment takes minutes (the client's
// rate limit), and the rest of the step would act on a spec that is gone.
var errSuperseded = errors.New("deployment deleted or changed during the step")

// superseded reports, from the informer cache, whether md was deleted,
// marked for deletion or edited since the step read it.
func (c *Controller) superseded(md *v1alpha1.ModelDeployment) bool {
	obj, err := c.mds.ByNamespace(md.Namespace).Get(md.Name)
	if err != nil {
		return apierrors.IsNotFound(err)
	}
	m, ok := obj.(metav1.Object)
	return !ok || m.GetUID() != md.UID || m.GetDeletionTimestamp() != nil || m.GetGeneration() != md.Generation
}

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
// a gang (all of its minimum or none). held names the slots not created
// because another pod holds their names (errNameHeld).
func (c *Controller) execute(ctx context.Context, md *v1alpha1.ModelDeployment, p *plan) (held []string, err error) {
	var errs []error
	for _, d := range p.Delete {
		if err := c.deletePod(ctx, d.Pod, d.Reason); err != nil {
			errs = append(errs, err)
		}
	}
	for _, r := range p.Recovered {
		c.recorder.Eventf(md, corev1.EventTypeWarning, "Recovering", "%s: recreating %s", md.Spec.RecoveryPolicy, r)
	}
	for _, pod := range p.Complete {
		if err := c.markComplete(ctx, pod); err != nil {
			errs = append(errs, err)
		}
	}
	for role, n := range p.Rolled {
		c.recorder.Eventf(md, corev1.EventTypeNormal, "RollingUpdate", "role %s: replacing %d outdated replica(s)", role, n)
	}
	for _, s := range p.Create {
		if c.superseded(md) {
			return held, errors.Join(append(errs, errSuperseded)...)
		}
		_, err := c.createPod(ctx, md, s)
		switch {
		case errors.Is(err, errNameHeld):
			held = append(held, podName(md.Name, s))
		case err != nil:
			errs = append(errs, err)
		}
	}
	groups := make([]int, 0, len(p.Gang))
	for g := range p.Gang {
		groups = append(groups, g)
	}
	slices.Sort(groups)
	for _, g := range groups {
		name, err := c.createGang(ctx, md, g, p.Gang[g])
		if name != "" {
			held = append(held, name) // the gang is blocked, and the conditions say by what
		}
		if err != nil {
			errs = append(errs, err)
			if errors.Is(err, errSuperseded) {
				break
			}
		}
	}
	return held, errors.Join(errs...)
}

// onlyHeld reports whether every error execute joined in err is a slot's
// held pod name (errNameHeld): nothing but deleting the holders moves the
// deployment on.
func onlyHeld(err error) bool {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok { // errors.Join's
		errs = j.Unwrap()
	}
	for _, e := range errs {
		if !errors.Is(e, errNameHeld) {
			return false
		}
	}
	return len(errs) > 0
}

// errGang marks a group whose gang could not be created.
var errGang = errors.New("gang not created")

// createGang creates group g's slots, all or none. held is the name of the
// slot whose pod name another pod holds, when that stopped it.
func (c *Controller) createGang(ctx context.Context, md *v1alpha1.ModelDeployment, g int, slots []slot) (held string, _ error) {
	if c.volcano {
		if err := c.ensurePodGroup(ctx, md, g); err != nil {
			return "", fmt.Errorf("group %d: %w: %w", g, errGang, err)
		}
	}
	var made []*corev1.Pod
	for _, s := range slots {
		if c.superseded(md) {
			// A gang is all or none: the part made goes (the next step
			// deletes it anyway when the deployment is gone or smaller).
			for _, p := range made {
				_ = c.deletePod(ctx, p, "GangRollback")
			}
			return "", errSuperseded
		}
		pod, err := c.createPod(ctx, md, s)
		if err != nil {
			for _, p := range made {
				_ = c.deletePod(ctx, p, "GangRollback")
			}
			c.recorder.Eventf(md, corev1.EventTypeWarning, "GangFailed", "group %d: %v; rolled back %d pod(s)", g, err, len(made))
			if errors.Is(err, errNameHeld) {
				held = podName(md.Name, s)
			}
			return held, fmt.Errorf("group %d: %w: %w", g, errGang, err)
		}
		made = append(made, pod)
	}
	c.recorder.Eventf(md, corev1.EventTypeNormal, "GroupCreated", "group %d: created %d pod(s) as a gang", g, len(made))
	return "", nil
}

func (c *Controller) createPod(ctx context.Context, md *v1alpha1.ModelDeployment, s slot) (*corev1.Pod, error) {
	var role *v1alpha1.Role
	for i := range md.Spec.Roles {
		if md.Spec.Roles[i].Name == s.Role {
			role = &md.Spec.Roles[i]
		}
	}
	name := podName(md.Name, s)
	if c.held.has(heldKey{md.UID, "pod", name}) {
		// Held on an earlier pass: read whether it still is rather than
		// POST to find out (no write for a slot that stays held).
		if free, err := c.nameTaken(ctx, md, name); !free {
			return nil, err
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
		_, err := c.nameTaken(ctx, md, name)
		return nil, err
	}
	if err != nil {
		return nil, fmt.Errorf("create pod %s: %w", name, err)
	}
	podActions.WithLabelValues("create", "").Inc()
	return pod, nil
}

// errNameHeld: a slot's pod name is held by a pod that is not md's (a
// user's, or one md released).
var errNameHeld = errors.New("pod name held by another pod")

// nameTaken looks at the pod holding a slot's name; free reports that none
// does (gone meanwhile: the slot is created). One md controls that is
// labelled as md's is a stale cache (nil). One md controls whose labels no
// longer say so (kubectl label pod ... kvmesh.io/deployment-) is released
// as a ReplicaSet releases a pod whose labels stop matching: md's owner
// reference is removed, so neither md's deletion nor the garbage collector
// deletes it. Then, and for any other pod of the name, the slot stays empty
// until that pod goes (errNameHeld): a Warning event says so once per
// holder, and the PodNameConflict condition while it lasts.
func (c *Controller) nameTaken(ctx context.Context, md *v1alpha1.ModelDeployment, name string) (free bool, err error) {
	pods := c.kube.CoreV1().Pods(md.Namespace)
	k := heldKey{md.UID, "pod", name}
	p, err := pods.Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		c.held.forget(k)
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("get pod %s: %w", name, err)
	}
	ours := p.Labels[v1alpha1.LabelDeployment] == md.Name
	if ours && metav1.IsControlledBy(p, md) {
		c.held.forget(k)
		return false, nil // a stale cache: the pod is there
	}
	if metav1.IsControlledBy(p, md) {
		refs := slices.DeleteFunc(slices.Clone(p.OwnerReferences), func(r metav1.OwnerReference) bool { return r.UID == md.UID })
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
			"ownerReferences": refs, "uid": p.UID, "resourceVersion": p.ResourceVersion,
		}})
		if _, err := pods.Patch(ctx, name, types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
			return false, fmt.Errorf("release pod %s: %w", name, err) // changed meanwhile (Conflict) or failed: retried
		}
		podActions.WithLabelValues("release", "").Inc()
		c.held.set(k, p.UID)
		c.recorder.Eventf(md, corev1.EventTypeWarning, "PodReleased",
			"pod %s is no longer labelled %s=%s: released (owner reference removed; it stays when the deployment goes) and not replaced while it holds the name; delete it to have the slot recreated",
			name, v1alpha1.LabelDeployment, md.Name)
		return false, errNameHeld
	}
	if c.held.set(k, p.UID) {
		c.recorder.Eventf(md, corev1.EventTypeWarning, reasonPodNameConflict,
			"pod %s exists and is not this deployment's: its slot stays empty until that pod is deleted", name)
	}
	return false, errNameHeld
}

// heldNames remembers, for one term, which object (UID) holds a name a
// deployment's child needs: a held pod slot is read on the next passes
// rather than POSTed again to learn it is still held, and a conflict's
// Warning event is recorded when its holder changes, not on every pass.
type heldNames struct {
	mu sync.Mutex // guards m; workers of different deployments share it
	m  map[heldKey]types.UID
}

type heldKey struct {
	md         types.UID
	kind, name string // "pod" or "service", and the name held
}

func (h *heldNames) has(k heldKey) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.m[k]
	return ok
}

// set records holder for k and reports whether that is news.
func (h *heldNames) set(k heldKey, holder types.UID) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.m == nil {
		h.m = map[heldKey]types.UID{}
	}
	if old, ok := h.m[k]; ok && old == holder {
		return false
	}
	h.m[k] = holder
	return true
}

func (h *heldNames) forget(k heldKey) {
	h.mu.Lock()
	defer h.mu.Unlock()
	delete(h.m, k)
}

// forgetDeployment drops what is remembered for a deployment that went.
func (h *heldNames) forgetDeployment(md types.UID) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for k := range h.m {
		if k.md == md {
			delete(h.m, k)
		}
	}
}

// markComplete marks pod a member of a replica seen whole and Running
// (v1alpha1.AnnotationReplicaComplete), once in its life.
func (c *Controller) markComplete(ctx context.Context, p *corev1.Pod) error {
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{
		"annotations": map[string]string{v1alpha1.AnnotationReplicaComplete: "true"}, "uid": p.UID,
	}})
	_, err := c.kube.CoreV1().Pods(p.Namespace).Patch(ctx, p.Name, types.MergePatchType, patch, metav1.PatchOptions{})
	if apierrors.IsNotFound(err) || apierrors.IsConflict(err) {
		return nil // gone, or another pod of the name: the next pass sees it
	}
	if err != nil {
		return fmt.Errorf("mark pod %s complete: %w", p.Name, err)
	}
	podActions.WithLabelValues("mark_complete", "").Inc()
	return nil
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

// ensureService creates md's headless Service unless the informer cache
// (Services labelled as a deployment's) shows it, so a steady deployment
// makes no request for it. A Service of md's name missing from the cache
// is read from the API server before anything is created: a user's (not
// labelled, so never cached) is left alone (and never deleted with the
// deployment), and said once per holder, since the pods' DNS names go
// through it (conflict true).
func (c *Controller) ensureService(ctx context.Context, md *v1alpha1.ModelDeployment) (conflict bool, err error) {
	if svc, err := c.services.Services(md.Namespace).Get(md.Name); err == nil && metav1.IsControlledBy(svc, md) {
		return false, c.repairService(ctx, md, svc)
	}
	svcs := c.kube.CoreV1().Services(md.Namespace)
	k := heldKey{md.UID, "service", md.Name}
	svc, err := svcs.Get(ctx, md.Name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		c.held.forget(k)
		_, err := svcs.Create(ctx, headlessService(md), metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) { // AlreadyExists: made meanwhile, looked at next pass
			return false, fmt.Errorf("create service: %w", err)
		}
	case err != nil:
		return false, fmt.Errorf("get service: %w", err)
	case !metav1.IsControlledBy(svc, md):
		if c.held.set(k, svc.UID) {
			c.recorder.Event(md, corev1.EventTypeWarning, reasonServiceConflict, serviceConflictMessage(md))
		}
		return true, nil
	default: // ours, out of the cache: its label was removed (the informer lists by it)
		return false, c.repairService(ctx, md, svc)
	}
	return false, nil
}

// reasonServiceConflict is the event and condition reason of a deployment
// whose Service name a Service it does not control holds.
const reasonServiceConflict = "ServiceConflict"

func serviceConflictMessage(md *v1alpha1.ModelDeployment) string {
	return fmt.Sprintf("service %s exists and is not this deployment's: the pods' names (subdomain %s) resolve only if it is headless and selects them", md.Name, md.Name)
}

// repairService sets back what the pods' DNS names need of md's own
// Service, the selector, publishNotReadyAddresses and the deployment label
// (which also keeps it in the controller's cache), when an edit changed
// them; before, a Service the controller owned was only checked to exist,
// and a changed selector left every pod's name unresolved with nothing said.
func (c *Controller) repairService(ctx context.Context, md *v1alpha1.ModelDeployment, svc *corev1.Service) error {
	want := headlessService(md)
	if maps.Equal(svc.Spec.Selector, want.Spec.Selector) && svc.Spec.PublishNotReadyAddresses &&
		svc.Labels[v1alpha1.LabelDeployment] == md.Name {
		return nil
	}
	fixed := svc.DeepCopy()
	fixed.Spec.Selector, fixed.Spec.PublishNotReadyAddresses = want.Spec.Selector, true
	if fixed.Labels == nil {
		fixed.Labels = map[string]string{}
	}
	fixed.Labels[v1alpha1.LabelDeployment] = md.Name
	if _, err := c.kube.CoreV1().Services(md.Namespace).Update(ctx, fixed, metav1.UpdateOptions{}); err != nil {
		if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
			return nil // changed or gone meanwhile: its event brings the next pass
		}
		return fmt.Errorf("repair service: %w", err)
	}
	c.recorder.Eventf(md, corev1.EventTypeWarning, "ServiceRepaired",
		"service %s: selector, publishNotReadyAddresses and label set back (the pods' names resolve through them)", md.Name)
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

// finalize deletes every child, then releases the deployment; one deleted
// with the orphan finalizer is released with its children left.
func (c *Controller) finalize(ctx context.Context, md *v1alpha1.ModelDeployment, pods []*corev1.Pod) (time.Duration, error) {
	if !slices.Contains(md.Finalizers, Finalizer) {
		return 0, nil
	}
	release := func() error {
		return c.setFinalizers(ctx, md, slices.DeleteFunc(slices.Clone(md.Finalizers), func(f string) bool { return f == Finalizer }))
	}
	if slices.Contains(md.Finalizers, metav1.FinalizerOrphanDependents) {
		// Deleted with propagationPolicy Orphan (kubectl delete
		// --cascade=orphan): the children stay, and the garbage collector
		// removes their owner references.
		c.recorder.Eventf(md, corev1.EventTypeNormal, "Orphaned", "deleted with propagation Orphan: its %d pod(s), role scalers and service are left as they are", len(pods))
		return 0, release()
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
	c.held.forgetDeployment(md.UID)
	c.recorder.Eventf(md, corev1.EventTypeNormal, "CleanedUp", "deleted every pod, role scaler and the service")
	return 0, release()
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
