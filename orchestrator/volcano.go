package orchestrator

import (
	"context"
	"fmt"
	"strconv"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Volcano's gang: when the PodGroup CRD is served, each group gets a
// PodGroup whose minMember is the group's gang (every role's gangMinimum
// replicas with their workers), and its pods name it and the volcano
// scheduler, so the group is scheduled all or nothing. Without Volcano the
// controller's own all-or-none creation is the gang.
var podGroupsResource = schema.GroupVersionResource{Group: "scheduling.volcano.sh", Version: "v1beta1", Resource: "podgroups"}

// Pod annotation naming a pod's PodGroup (Volcano's key).
const annotationPodGroup = "scheduling.k8s.io/group-name"

// detectVolcano reports whether the API server serves Volcano's PodGroups.
// It is checked once at start: installing Volcano later needs a restart.
func (c *Controller) detectVolcano() bool {
	rl, err := c.kube.Discovery().ServerResourcesForGroupVersion(podGroupsResource.GroupVersion().String())
	if err != nil {
		return false
	}
	for _, r := range rl.APIResources {
		if r.Name == podGroupsResource.Resource {
			return true
		}
	}
	return false
}

func podGroupName(md string, g int) string { return md + "-" + strconv.Itoa(g) }

// gangSize is the pods of one group's gang.
func gangSize(md *v1alpha1.ModelDeployment) int64 {
	n := 0
	for i := range md.Spec.Roles {
		n += int(*md.Spec.Roles[i].GangMinimum) * members(&md.Spec.Roles[i])
	}
	return int64(n)
}

// ensurePodGroup creates group g's PodGroup (before its pods).
func (c *Controller) ensurePodGroup(ctx context.Context, md *v1alpha1.ModelDeployment, g int) error {
	ref := ownerRef(md)
	pg := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "scheduling.volcano.sh/v1beta1", "kind": "PodGroup",
		"metadata": map[string]any{
			"name": podGroupName(md.Name, g), "namespace": md.Namespace,
			"labels": map[string]any{v1alpha1.LabelDeployment: md.Name, v1alpha1.LabelGroup: strconv.Itoa(g)},
			"ownerReferences": []any{map[string]any{
				"apiVersion": ref.APIVersion, "kind": ref.Kind, "name": ref.Name, "uid": string(ref.UID),
				"controller": true, "blockOwnerDeletion": true,
			}},
		},
		"spec": map[string]any{"minMember": gangSize(md)},
	}}
	_, err := c.dyn.Resource(podGroupsResource).Namespace(md.Namespace).Create(ctx, pg, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create PodGroup %s: %w", pg.GetName(), err)
	}
	return nil
}

// deletePodGroups removes md's PodGroups (controlled by it, not merely
// labelled) of groups ≥ from.
func (c *Controller) deletePodGroups(ctx context.Context, md *v1alpha1.ModelDeployment, from int) error {
	l, err := c.dyn.Resource(podGroupsResource).Namespace(md.Namespace).List(ctx, metav1.ListOptions{LabelSelector: v1alpha1.LabelDeployment + "=" + md.Name})
	if err != nil {
		return err
	}
	for _, pg := range l.Items {
		g, err := strconv.Atoi(pg.GetLabels()[v1alpha1.LabelGroup])
		if err != nil || g < from || !metav1.IsControlledBy(&pg, md) {
			continue
		}
		uid := pg.GetUID()
		err = c.dyn.Resource(podGroupsResource).Namespace(md.Namespace).Delete(ctx, pg.GetName(), metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
	}
	return nil
}
