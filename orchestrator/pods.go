package orchestrator

import (
	"fmt"
	"maps"
	"strconv"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/kvmesh/kvmesh/orchestrator/api/v1alpha1"
)

// Environment given to every engine container.
const (
	EnvLeaderAddress = "KVMESH_LEADER_ADDRESS"
	EnvGroupSize     = "KVMESH_GROUP_SIZE"
	EnvWorkerIndex   = "KVMESH_WORKER_INDEX"
	EnvRole          = "KVMESH_ROLE"
	EnvModel         = "KVMESH_MODEL"
	EnvPDGroup       = "KVMESH_PD_GROUP"
	// LeaderWorkerSet's names, for engines' launch scripts written for it.
	envLWSLeaderAddress = "LWS_LEADER_ADDRESS"
	envLWSGroupSize     = "LWS_GROUP_SIZE"
	envLWSWorkerIndex   = "LWS_WORKER_INDEX"
	// AnnotationModel carries the model name (not a valid label value).
	AnnotationModel = "kvmesh.io/model"
	// AnnotationPDGroupLabel and AnnotationPDProtocol tell the sidecar
	// webhook which label holds the P/D group and which P/D wire protocol
	// the engine speaks (orchestrator/webhook reads them).
	AnnotationPDGroupLabel = "kvmesh.io/pd-group-label"
	AnnotationPDProtocol   = "kvmesh.io/pd-protocol"
)

// selectorFor is the label selector of a deployment's pods.
func selectorFor(md string) string { return v1alpha1.LabelDeployment + "=" + md }

// pdGroup is the P/D pairing value of a group.
func pdGroup(md string, g int) string { return md + "-" + strconv.Itoa(g) }

// buildPod makes the pod of slot s of md. The deployment is defaulted.
func buildPod(md *v1alpha1.ModelDeployment, r *v1alpha1.Role, s slot) *corev1.Pod {
	tmpl := r.Template
	if s.Member > 0 {
		tmpl = r.Workers.Template
	}
	tmpl = *tmpl.DeepCopy()
	name := podName(md.Name, s)
	leader := podName(md.Name, slot{s.Group, s.Role, s.Replica, 0})
	labels := maps.Clone(tmpl.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	maps.Copy(labels, map[string]string{
		v1alpha1.LabelDeployment: md.Name,
		v1alpha1.LabelGroup:      strconv.Itoa(s.Group),
		v1alpha1.LabelRole:       r.Name,
		v1alpha1.LabelRoleKind:   string(r.Kind),
		v1alpha1.LabelReplica:    strconv.Itoa(s.Replica),
		v1alpha1.LabelWorker:     strconv.Itoa(s.Member),
		v1alpha1.LabelRevision:   revision(md, r),
		md.Spec.PDGroupLabel:     pdGroup(md.Name, s.Group),
	})
	if md.Spec.Sidecar.Mode == v1alpha1.SidecarInjected && s.Member == 0 {
		labels[v1alpha1.LabelInject] = "true"
	}
	ann := maps.Clone(tmpl.Annotations)
	if ann == nil {
		ann = map[string]string{}
	}
	ann[AnnotationModel] = md.Spec.Model
	if md.Spec.PDGroupLabel != v1alpha1.DefaultPDGroupLabel {
		ann[AnnotationPDGroupLabel] = md.Spec.PDGroupLabel // the webhook reads the group from this label
	}
	if md.Spec.Engine == v1alpha1.EngineSGLang {
		ann[AnnotationPDProtocol] = "sglang" // the sidecar gossips it: the ingress sends both legs at once
	}
	spec := tmpl.Spec
	spec.Hostname = name
	spec.Subdomain = md.Name
	leaderAddr := fmt.Sprintf("%s.%s.%s.svc", leader, md.Name, md.Namespace)
	env := []corev1.EnvVar{
		{Name: EnvLeaderAddress, Value: leaderAddr},
		{Name: envLWSLeaderAddress, Value: leaderAddr},
		{Name: EnvGroupSize, Value: strconv.Itoa(members(r))},
		{Name: envLWSGroupSize, Value: strconv.Itoa(members(r))},
		{Name: EnvWorkerIndex, Value: strconv.Itoa(s.Member)},
		{Name: envLWSWorkerIndex, Value: strconv.Itoa(s.Member)},
		{Name: EnvRole, Value: string(r.Kind)},
		{Name: EnvModel, Value: md.Spec.Model},
		{Name: EnvPDGroup, Value: pdGroup(md.Name, s.Group)},
	}
	for i := range spec.Containers {
		spec.Containers[i].Env = append(spec.Containers[i].Env, env...)
	}
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: md.Namespace, Labels: labels, Annotations: ann,
			OwnerReferences: []metav1.OwnerReference{ownerRef(md)},
		},
		Spec: spec,
	}
}

func ownerRef(md *v1alpha1.ModelDeployment) metav1.OwnerReference {
	t := true
	return metav1.OwnerReference{
		APIVersion: v1alpha1.SchemeGroupVersion.String(), Kind: "ModelDeployment",
		Name: md.Name, UID: md.UID, Controller: &t, BlockOwnerDeletion: &t,
	}
}

// headlessService gives every pod a DNS name (<pod>.<deployment>.<ns>.svc)
// so workers reach their leader.
func headlessService(md *v1alpha1.ModelDeployment) *corev1.Service {
	return &corev1.Service{
		ObjectMeta: metav1.ObjectMeta{
			Name: md.Name, Namespace: md.Namespace,
			Labels:          map[string]string{v1alpha1.LabelDeployment: md.Name},
			OwnerReferences: []metav1.OwnerReference{ownerRef(md)},
		},
		Spec: corev1.ServiceSpec{
			ClusterIP:                corev1.ClusterIPNone,
			Selector:                 map[string]string{v1alpha1.LabelDeployment: md.Name},
			PublishNotReadyAddresses: true,
		},
	}
}
