package webhook

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
)

// Pod labels and annotations the webhook reads.
const (
	LabelInject          = "kvmesh.io/inject"
	LabelRoleKind        = "kvmesh.io/role-kind"
	AnnotationModel      = "kvmesh.io/model"
	AnnotationEnginePort = "kvmesh.io/engine-port"
	AnnotationEventsPort = "kvmesh.io/kv-events-port"
	AnnotationReplayPort = "kvmesh.io/replay-port"
	AnnotationInjected   = "kvmesh.io/sidecar-injected"
	// LabelPDGroup is the pod label naming the engine's P/D group (the
	// ModelDeployment's default pdGroupLabel); AnnotationPDGroupLabel names
	// another label key when the ModelDeployment sets one.
	LabelPDGroup           = "kvmesh.io/pd-group"
	AnnotationPDGroupLabel = "kvmesh.io/pd-group-label"
	// AnnotationPDProtocol is the engine's P/D wire protocol: nixl (vLLM's
	// NixlConnector, the default) or sglang (--disaggregation-mode), with
	// AnnotationBootstrapPort the SGLang prefill engine's bootstrap port.
	AnnotationPDProtocol    = "kvmesh.io/pd-protocol"
	AnnotationBootstrapPort = "kvmesh.io/bootstrap-port"
	// AnnotationTokenizerDir names the model directory (as the engine
	// container mounts it) whose tokenizer files the sidecar publishes to
	// NATS for the ingresses; the sidecar gets the same volume, read-only.
	AnnotationTokenizerDir = "kvmesh.io/tokenizer-dir"
	// LabelModel is read when AnnotationModel is absent (a model name that
	// fits in a label value).
	LabelModel = "kvmesh.io/model"
	// ContainerName is the injected container's name.
	ContainerName = "kvmesh-sidecar"
)

// SidecarConfig is what every injected sidecar shares.
type SidecarConfig struct {
	// Image of kvmesh (default DefaultImage).
	Image string
	// NATS is the NATS URL list (empty: the sidecar's default).
	NATS string
	// NATSPrefix is the installation's NATS subject prefix (--nats-prefix;
	// empty: the sidecar's default, "kvmesh").
	NATSPrefix string
	// GossipJoin is the gossip seed address (empty: no gossip).
	GossipJoin string
	// GossipPort is the sidecar's gossip port (7946).
	GossipPort int
	// AdminPort serves /health, /ready and /metrics (9101).
	AdminPort int
	// NATSUser and NATSSecret: the sidecar connects as NATSUser with the
	// password in key "sidecar-password" of the Secret NATSSecret in the
	// pod's namespace (manifests/base/nats.yaml, kvmesh bootstrap). Empty
	// NATSSecret: no credentials.
	NATSUser, NATSSecret string
	// GossipSecret holds the gossip key (key "key") in the pod's namespace.
	// Empty: unencrypted gossip.
	GossipSecret string
}

// EngineAPIKeySecret is the optional Secret holding the engines' own API key
// (key "key"), as manifests/base names it.
const EngineAPIKeySecret = "kvmesh-engine-api-key"

// The kvmesh image this tree's manifests name, and the injected sidecar's
// when the orchestrator cannot read its own (out of a pod) and
// --sidecar-image is not given. One explicit tag, never :latest: a floating
// tag lets a node pull a different build than its neighbours (and a
// sidecar a different one than the orchestrator and ingresses it speaks
// to). manifests/images_test.go checks that every kvmesh image the
// manifests name is exactly DefaultImage; docs/INSTALL.md says how to pin
// another (kustomize edit set image, --sidecar-image).
const (
	ImageRepository = "ghcr.io/kvmesh/kvmesh"
	ImageTag        = "v0.1.0"
	DefaultImage    = ImageRepository + ":" + ImageTag
)

// DefaultSidecarConfig matches manifests/base.
func DefaultSidecarConfig() SidecarConfig {
	return SidecarConfig{
		Image: DefaultImage, NATS: "nats://nats.kvmesh.svc:4222",
		GossipJoin: "kvmesh-gossip.kvmesh.svc:7946", GossipPort: 7946, AdminPort: 9101,
		NATSUser: "sidecar", NATSSecret: "kvmesh-nats", GossipSecret: "kvmesh-gossip",
	}
}

// ErrBadPort is a port annotation that is not a port number.
var ErrBadPort = errors.New("bad port annotation")

func port(ann map[string]string, key string, def int) (int, error) {
	v, ok := ann[key]
	if !ok {
		return def, nil
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("%w: %s=%q", ErrBadPort, key, v)
	}
	return n, nil
}

// ErrNoModel is a pod asking for the sidecar without naming its model.
var ErrNoModel = errors.New("no kvmesh.io/model")

// ErrBadPDProtocol is a kvmesh.io/pd-protocol annotation other than nixl or sglang.
var ErrBadPDProtocol = errors.New("bad P/D protocol annotation")

// ErrBadRoleKind is a kvmesh.io/role-kind label the sidecar's --role
// refuses (prefill, decode or mixed).
var ErrBadRoleKind = errors.New("bad role-kind label")

// pdArgs are the sidecar's P/D flags from the pod's group label and protocol
// annotations: the injected container does not see the engine containers'
// KVMESH_PD_GROUP, so the group is passed explicitly.
func pdArgs(pod *corev1.Pod, bootstrapPort int) []string {
	key := LabelPDGroup
	if k := pod.Annotations[AnnotationPDGroupLabel]; k != "" {
		key = k
	}
	var args []string
	if g := pod.Labels[key]; g != "" {
		args = append(args, "--pd-group="+g)
	}
	if p := pod.Annotations[AnnotationPDProtocol]; p != "" {
		args = append(args, "--pd-protocol="+p)
	}
	if bootstrapPort != 0 {
		args = append(args, "--bootstrap-port="+strconv.Itoa(bootstrapPort))
	}
	return args
}

// sidecar builds the native sidecar container for pod.
func (c SidecarConfig) sidecar(pod *corev1.Pod) (corev1.Container, error) {
	enginePort, err1 := port(pod.Annotations, AnnotationEnginePort, 8000)
	eventsPort, err2 := port(pod.Annotations, AnnotationEventsPort, 5557)
	replayPort, err3 := port(pod.Annotations, AnnotationReplayPort, 5558)
	bootstrapPort, err4 := port(pod.Annotations, AnnotationBootstrapPort, 0)
	if err := errors.Join(err1, err2, err3, err4); err != nil {
		return corev1.Container{}, err
	}
	switch p := pod.Annotations[AnnotationPDProtocol]; p {
	case "", "nixl", "sglang":
	default:
		return corev1.Container{}, fmt.Errorf("%w: %s=%q (want nixl or sglang)", ErrBadPDProtocol, AnnotationPDProtocol, p)
	}
	model := pod.Annotations[AnnotationModel]
	if model == "" {
		model = pod.Labels[LabelModel]
	}
	if model == "" {
		// The sidecar refuses to start without it: reject the pod with the
		// reason instead of admitting one whose sidecar crash-loops.
		return corev1.Container{}, fmt.Errorf("%w: annotate the pod with %s (the served model name)", ErrNoModel, AnnotationModel)
	}
	role := pod.Labels[LabelRoleKind]
	switch role {
	case "":
		role = "mixed"
	case "prefill", "decode", "mixed":
	default:
		// The sidecar would refuse --role and crash-loop: say so at admission.
		return corev1.Container{}, fmt.Errorf("%w: %s=%q (want prefill, decode or mixed)", ErrBadRoleKind, LabelRoleKind, role)
	}
	args := []string{
		"sidecar",
		"--engine-id=$(POD_NAME)",
		// Host and port, not http://$(POD_IP):port: an IPv6 pod IP needs
		// brackets in a URL, which Kubernetes' $(VAR) expansion cannot add.
		"--engine-host=$(POD_IP)",
		"--engine-port=" + strconv.Itoa(enginePort),
		"--events=tcp://127.0.0.1:" + strconv.Itoa(eventsPort),
		"--replay=tcp://127.0.0.1:" + strconv.Itoa(replayPort),
		"--role=" + role,
		"--admin=0.0.0.0:" + strconv.Itoa(c.AdminPort),
	}
	args = append(args, "--model="+model)
	args = append(args, pdArgs(pod, bootstrapPort)...)
	if c.NATS != "" {
		args = append(args, "--nats="+c.NATS)
	}
	if c.NATSPrefix != "" {
		args = append(args, "--nats-prefix="+c.NATSPrefix)
	}
	if c.GossipJoin != "" {
		// The pod IP alone is advertised with the bind port: $(POD_IP):port
		// is no address when the pod IP is IPv6.
		gp := strconv.Itoa(c.GossipPort)
		args = append(args, "--gossip-bind=0.0.0.0:"+gp, "--gossip-advertise=$(POD_IP)", "--join="+c.GossipJoin)
	}
	env := []corev1.EnvVar{
		{Name: "POD_NAME", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
		{Name: "POD_IP", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "status.podIP"}}},
		{Name: "GOMEMLIMIT", Value: sidecarGOMEMLIMIT},
	}
	secret := func(name, secretName, key string) corev1.EnvVar {
		return corev1.EnvVar{Name: name, ValueFrom: &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{
			LocalObjectReference: corev1.LocalObjectReference{Name: secretName}, Key: key}}}
	}
	if c.NATS != "" && c.NATSSecret != "" { // credentials for the server named (kvmesh sidecar refuses them without one)
		args = append(args, "--nats-user="+c.NATSUser)
		env = append(env, secret("KVMESH_NATS_PASSWORD", c.NATSSecret, "sidecar-password"))
	}
	if c.GossipSecret != "" && c.GossipJoin != "" {
		env = append(env, secret("KVMESH_GOSSIP_KEY", c.GossipSecret, "key"))
	}
	// The engines' own key (vllm --api-key), when the installation has one:
	// the sidecar reads the engine's /v1/models with it (the ingress
	// manifests read the same Secret).
	apiKey := secret("KVMESH_ENGINE_API_KEY", EngineAPIKeySecret, "key")
	apiKey.ValueFrom.SecretKeyRef.Optional = new(true)
	env = append(env, apiKey)
	var mounts []corev1.VolumeMount
	if dir := pod.Annotations[AnnotationTokenizerDir]; dir != "" {
		m, ok := mountOf(pod, dir)
		if !ok {
			return corev1.Container{}, fmt.Errorf("%w: %s=%q is under no volume mount of the pod's containers", ErrBadTokenizerDir, AnnotationTokenizerDir, dir)
		}
		m.ReadOnly = true
		mounts = append(mounts, m)
		args = append(args, "--tokenizer-dir="+dir)
	}
	always := corev1.ContainerRestartPolicyAlways
	return corev1.Container{
		Name:          ContainerName,
		Image:         c.Image,
		Args:          args,
		RestartPolicy: &always,
		Env:           env,
		VolumeMounts:  mounts,
		Ports: []corev1.ContainerPort{
			{Name: "kvmesh-admin", ContainerPort: int32(c.AdminPort)},
			{Name: "gossip-tcp", ContainerPort: int32(c.GossipPort), Protocol: corev1.ProtocolTCP},
			{Name: "gossip-udp", ContainerPort: int32(c.GossipPort), Protocol: corev1.ProtocolUDP},
		},
		// The sidecar's readiness is the pod's: /health (it answers), not
		// /ready (NATS connected), or a NATS outage would take every engine
		// out of its Service and the gateway's pool while it can serve.
		ReadinessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/health", Port: intstrPort(c.AdminPort)}}},
		LivenessProbe: &corev1.Probe{ProbeHandler: corev1.ProbeHandler{HTTPGet: &corev1.HTTPGetAction{
			Path: "/health", Port: intstrPort(c.AdminPort)}}},
		// As manifests/overlays/sidecar-container's sidecar (one engine).
		Resources: corev1.ResourceRequirements{
			Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("100m"), corev1.ResourceMemory: resource.MustParse("128Mi")},
			Limits:   corev1.ResourceList{corev1.ResourceMemory: resource.MustParse(sidecarMemoryLimit)},
		},
		SecurityContext: sidecarSecurityContext(),
	}, nil
}

// The sidecar's memory limit and the Go GC's soft limit, 90 % of it: the
// heap is collected harder as it nears the limit instead of growing into the
// OOM killer. Change both together.
const (
	sidecarMemoryLimit = "512Mi"
	sidecarGOMEMLIMIT  = "460MiB"
)

// SidecarUID is the kvmesh image's user (Dockerfile: USER 65532:65532).
const SidecarUID = 65532

// sidecarSecurityContext meets Pod Security "restricted" whatever the pod
// sets: the container's own fields override the pod's, so an engine that
// runs as root (many vLLM images) or in a pod with no security context at
// all still gets a sidecar that is not root, cannot gain privileges, holds
// no capabilities, writes nothing to its image and runs under the runtime's
// default seccomp profile. runAsUser is set, not left to the image, because
// a pod-level runAsUser (0 for a root engine) would otherwise apply.
func sidecarSecurityContext() *corev1.SecurityContext {
	return &corev1.SecurityContext{
		RunAsNonRoot:             new(true),
		RunAsUser:                new(int64(SidecarUID)),
		AllowPrivilegeEscalation: new(false),
		ReadOnlyRootFilesystem:   new(true),
		Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		SeccompProfile:           &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
	}
}

// ErrBadTokenizerDir is a tokenizer-dir annotation no volume mount covers.
var ErrBadTokenizerDir = errors.New("bad tokenizer-dir annotation")

// mountOf finds the volume mount of the pod's containers that holds dir (the
// longest mount path that is dir or a parent of it).
func mountOf(pod *corev1.Pod, dir string) (corev1.VolumeMount, bool) {
	var best corev1.VolumeMount
	found := false
	for _, ct := range pod.Spec.Containers {
		for _, m := range ct.VolumeMounts {
			p := strings.TrimSuffix(m.MountPath, "/")
			if (dir == p || strings.HasPrefix(dir, p+"/")) && (!found || len(p) > len(best.MountPath)) {
				best, found = m, true
			}
		}
	}
	return best, found
}

// patchFor returns the JSON patch that injects the sidecar, or nil when the
// pod does not ask for it or already has it (the webhook may be reinvoked),
// as an init container or a regular one of that name (a pod that runs its
// own: a second container of the name would be refused).
func (c SidecarConfig) patchFor(pod *corev1.Pod) ([]byte, error) {
	if pod.Labels[LabelInject] != "true" {
		return nil, nil
	}
	named := func(ct corev1.Container) bool { return ct.Name == ContainerName }
	if slices.ContainsFunc(pod.Spec.InitContainers, named) || slices.ContainsFunc(pod.Spec.Containers, named) {
		return nil, nil
	}
	sc, err := c.sidecar(pod)
	if err != nil {
		return nil, err
	}
	var ops []map[string]any
	if len(pod.Spec.InitContainers) == 0 {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/initContainers", "value": []corev1.Container{sc}})
	} else {
		ops = append(ops, map[string]any{"op": "add", "path": "/spec/initContainers/-", "value": sc})
	}
	if pod.Annotations == nil {
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations", "value": map[string]string{AnnotationInjected: "true"}})
	} else {
		ops = append(ops, map[string]any{"op": "add", "path": "/metadata/annotations/kvmesh.io~1sidecar-injected", "value": "true"})
	}
	return json.Marshal(ops)
}
