package v1alpha1

import (
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// EngineKind is the inference engine a ModelDeployment runs.
type EngineKind string

// Engine kinds.
const (
	EngineVLLM   EngineKind = "vllm"
	EngineSGLang EngineKind = "sglang"
)

// RoleKind is what a role's engines do for the router.
type RoleKind string

// Role kinds.
const (
	RolePrefill RoleKind = "prefill"
	RoleDecode  RoleKind = "decode"
	RoleMixed   RoleKind = "mixed"
)

// RecoveryPolicy says what is recreated when one pod of a group fails.
type RecoveryPolicy string

// Recovery policies (Kthena's names).
const (
	// RecoverGroup recreates every pod of the group (a P/D group whose
	// engines exchanged KV state restarts together).
	RecoverGroup RecoveryPolicy = "GroupRecreate"
	// RecoverRole recreates the failed role replica: its leader and workers.
	RecoverRole RecoveryPolicy = "RoleRecreate"
	// RecoverNone replaces only the failed pod.
	RecoverNone RecoveryPolicy = "None"
)

// SidecarMode is how the kvmesh sidecar reaches the engines.
type SidecarMode string

// Sidecar modes.
const (
	SidecarInjected  SidecarMode = "injected"
	SidecarDaemonSet SidecarMode = "daemonset"
)

// ModelDeployment runs one model as `groups` copies of a topology of roles
// (e.g. prefill + decode), each role a set of engine pods, optionally with
// workers for multi-node engines.
type ModelDeployment struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   ModelDeploymentSpec   `json:"spec"`
	Status ModelDeploymentStatus `json:"status,omitempty"`
}

// ModelDeploymentSpec is the desired topology.
type ModelDeploymentSpec struct {
	// Model is the served model name (the router routes by it).
	Model string `json:"model"`
	// Engine is vllm or sglang.
	Engine EngineKind `json:"engine"`
	// Groups is the number of copies of the whole topology (the /scale
	// subresource of the ModelDeployment). Default 1.
	Groups *int32 `json:"groups,omitempty"`
	// Roles are the engine roles of one group; names are unique. The CRD makes
	// it a map list keyed by name (x-kubernetes-list-type: map), so server-side
	// apply merges roles by name instead of owning the list as a whole.
	// +listType=map
	// +listMapKey=name
	Roles []Role `json:"roles"`
	// RecoveryPolicy: GroupRecreate, RoleRecreate (default) or None.
	RecoveryPolicy RecoveryPolicy `json:"recoveryPolicy,omitempty"`
	// Sidecar configures the kvmesh sidecar.
	Sidecar SidecarSpec `json:"sidecar,omitempty"`
	// PDGroupLabel is the pod label key whose value names a group's P/D
	// pairing domain for the router (default kvmesh.io/pd-group; the value
	// is <deployment>-<group index>). No other key under kvmesh.io/: the
	// controller's own pod labels are there.
	PDGroupLabel string `json:"pdGroupLabel,omitempty"`
}

// Role is one kind of engine in a group.
type Role struct {
	// Name is unique within the deployment (DNS label).
	Name string `json:"name"`
	// Kind is prefill, decode or mixed.
	Kind RoleKind `json:"kind"`
	// Replicas per group (default 1). Scaled through the role's RoleScaler.
	Replicas *int32 `json:"replicas,omitempty"`
	// Template is the engine (leader) pod.
	Template corev1.PodTemplateSpec `json:"template"`
	// Workers, for engines spanning several pods.
	Workers *Workers `json:"workers,omitempty"`
	// GangMinimum is the number of this role's replicas a group needs
	// before it is created at all (default: all replicas).
	GangMinimum *int32 `json:"gangMinimum,omitempty"`
	// Rollout bounds template updates of this role.
	Rollout RolloutSpec `json:"rollout,omitempty"`
}

// Workers are the extra pods of a multi-node engine. Each worker gets the
// leader's address in KVMESH_LEADER_ADDRESS (and LWS_LEADER_ADDRESS),
// the size in KVMESH_GROUP_SIZE and its index in KVMESH_WORKER_INDEX.
type Workers struct {
	Count    int32                  `json:"count"`
	Template corev1.PodTemplateSpec `json:"template"`
}

// RolloutSpec bounds a template rollout of one role.
type RolloutSpec struct {
	// MaxUnavailable replicas of the role (per group) during a rollout; default 1.
	MaxUnavailable *int32 `json:"maxUnavailable,omitempty"`
	// Partition: replicas with an index below it keep the old template.
	Partition *int32 `json:"partition,omitempty"`
}

// SidecarSpec configures the kvmesh sidecar of the engines.
type SidecarSpec struct {
	// Mode is injected (native sidecar added by the webhook; default) or
	// daemonset (one sidecar per node, for clusters without webhooks).
	Mode SidecarMode `json:"mode,omitempty"`
}

// ModelDeploymentStatus is what the controller observed.
type ModelDeploymentStatus struct {
	ObservedGeneration int64 `json:"observedGeneration,omitempty"`
	// Groups that exist; ReadyGroups have every role at its replicas, ready.
	Groups      int32 `json:"groups"`
	ReadyGroups int32 `json:"readyGroups"`
	// Selector selects every engine pod (for the /scale subresource).
	Selector string `json:"selector,omitempty"`
	// Ready is "readyGroups/groups" for the printer column.
	Ready      string             `json:"ready,omitempty"`
	Roles      []RoleStatus       `json:"roles,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
}

// RoleStatus counts one role's replicas over all groups.
type RoleStatus struct {
	Name            string `json:"name"`
	Replicas        int32  `json:"replicas"`
	ReadyReplicas   int32  `json:"readyReplicas"`
	UpdatedReplicas int32  `json:"updatedReplicas"`
	// Revision is the hash of the role's current template.
	Revision string `json:"revision,omitempty"`
}

// ModelDeploymentList is a list of ModelDeployments.
type ModelDeploymentList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []ModelDeployment `json:"items"`
}

// RoleScaler is one role's scaling handle: its /scale subresource lets an
// HPA or KEDA scale the role alone. The controller creates one per role
// (named <deployment>-<role>) and keeps spec.replicas and the role's
// replicas equal; a change to either wins over the older value.
type RoleScaler struct {
	metav1.TypeMeta   `json:",inline"`
	metav1.ObjectMeta `json:"metadata,omitempty"`

	Spec   RoleScalerSpec   `json:"spec"`
	Status RoleScalerStatus `json:"status,omitempty"`
}

// RoleScalerSpec names the role and its desired replicas per group.
type RoleScalerSpec struct {
	Deployment string `json:"deployment"`
	Role       string `json:"role"`
	Replicas   int32  `json:"replicas"`
}

// RoleScalerStatus is the role's observed size.
type RoleScalerStatus struct {
	// ObservedGeneration is the scaler generation copied into the deployment.
	ObservedGeneration int64  `json:"observedGeneration,omitempty"`
	Replicas           int32  `json:"replicas"`
	Selector           string `json:"selector,omitempty"`
}

// RoleScalerList is a list of RoleScalers.
type RoleScalerList struct {
	metav1.TypeMeta `json:",inline"`
	metav1.ListMeta `json:"metadata,omitempty"`
	Items           []RoleScaler `json:"items"`
}

// Labels the controller puts on every pod it creates. All are under
// LabelPrefix, which pdGroupLabel may not use (but for its default).
const (
	LabelPrefix     = "kvmesh.io/"
	LabelDeployment = "kvmesh.io/deployment"
	LabelGroup      = "kvmesh.io/group"
	LabelRole       = "kvmesh.io/role"
	LabelRoleKind   = "kvmesh.io/role-kind"
	LabelReplica    = "kvmesh.io/replica"
	LabelWorker     = "kvmesh.io/worker"
	LabelRevision   = "kvmesh.io/revision"
	LabelModel      = "kvmesh.io/model"
	// LabelInject asks the webhook for the sidecar.
	LabelInject = "kvmesh.io/inject"
	// AnnotationReplicaComplete marks the members of a replica the
	// controller saw whole and Running: one that then loses a member lost
	// it after it ran, and is recovered per the recovery policy (a replica
	// never complete, such as one a quota cut short, is completed instead).
	AnnotationReplicaComplete = "kvmesh.io/replica-complete"
	// DefaultPDGroupLabel is the default PDGroupLabel.
	DefaultPDGroupLabel = "kvmesh.io/pd-group"
)

// Bounds of the CRD's schema (manifests/crds/kvmesh.io_modeldeployments.yaml),
// and what they leave for names.
const (
	MaxGroups   = 1000 // spec.groups
	MaxReplicas = 1000 // a role's replicas
	MaxWorkers  = 64   // a role's workers.count
	// MaxNamesLength bounds a deployment's name plus any of its role's: the
	// controller names each pod <deployment>-<group>-<role>-<replica>[-w<worker>]
	// and makes that its hostname, a DNS label of at most 63 characters, 13 of
	// which the separators and indexes take at the bounds above. The
	// deployment's name must also be a DNS-1035 label: it names the headless
	// Service, is the pods' subdomain and a label value of every pod.
	MaxNamesLength = 50
	// MaxPods bounds a deployment's pods, groups × Σ roles' replicas ×
	// (1 + workers): the schema's bounds alone admit millions (1000 groups
	// of 1000 replicas), which the controller would create for hours. The
	// controller refuses a deployment above it (reason TooManyPods).
	MaxPods = 10000
)

// Condition types of a ModelDeployment.
const (
	ConditionAvailable   = "Available"
	ConditionProgressing = "Progressing"
	ConditionGangBlocked = "GangBlocked"
	// ConditionRoleScalerConflict is True while a role's RoleScaler name
	// (<deployment>-<role>) is held by an object the deployment does not
	// control: that role cannot be scaled alone.
	ConditionRoleScalerConflict = "RoleScalerConflict"
	// ConditionPodNameConflict is True while a slot's pod name
	// (<deployment>-<group>-<role>-<replica>[-w<member>]) is held by a pod
	// the deployment does not control (a user's, or one it released): that
	// slot stays empty until the pod is deleted.
	ConditionPodNameConflict = "PodNameConflict"
	// ConditionServiceReady is False while the deployment's headless
	// Service (its pods' DNS subdomain) cannot be created or set back (an
	// RBAC verb missing, a quota): the message holds the error. The pods
	// are reconciled all the same.
	ConditionServiceReady = "ServiceReady"
)

// Defaults fills the optional fields with their defaults in place.
func (md *ModelDeployment) Defaults() {
	if md.Spec.Groups == nil {
		md.Spec.Groups = ptr(int32(1))
	}
	if md.Spec.RecoveryPolicy == "" {
		md.Spec.RecoveryPolicy = RecoverRole
	}
	if md.Spec.Sidecar.Mode == "" {
		md.Spec.Sidecar.Mode = SidecarInjected
	}
	if md.Spec.PDGroupLabel == "" {
		md.Spec.PDGroupLabel = DefaultPDGroupLabel
	}
	for i := range md.Spec.Roles {
		r := &md.Spec.Roles[i]
		if r.Replicas == nil {
			r.Replicas = ptr(int32(1))
		}
		if r.GangMinimum == nil || *r.GangMinimum > *r.Replicas {
			r.GangMinimum = ptr(*r.Replicas)
		}
		if r.Rollout.MaxUnavailable == nil {
			r.Rollout.MaxUnavailable = ptr(int32(1))
		}
		if r.Rollout.Partition == nil {
			r.Rollout.Partition = ptr(int32(0))
		}
	}
}

func ptr[T any](v T) *T { return &v }
