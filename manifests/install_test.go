package manifests

import (
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// TestInstallRendersNoEngine: the one-command install is the platform only
// (docs/INSTALL.md's table): no workload asks for a GPU or mounts a
// PersistentVolumeClaim it does not make itself, and its workloads are exactly
// the ones the docs list. The example engine (4 GPUs, a model PVC nothing
// creates) is overlays/injected's, applied on purpose.
func TestInstallRendersNoEngine(t *testing.T) {
	kc := kubectl(t)
	objs := render(t, kc, "install")
	var workloads []string
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment", "StatefulSet", "DaemonSet", "Job":
		default:
			continue
		}
		workloads = append(workloads, o.GetKind()+"/"+o.GetName())
		pod, _, _ := unstructured.NestedMap(o.Object, "spec", "template", "spec")
		cs, _, _ := unstructured.NestedSlice(pod, "containers")
		ics, _, _ := unstructured.NestedSlice(pod, "initContainers")
		for _, c := range slices.Concat(cs, ics) {
			for _, k := range []string{"limits", "requests"} {
				res, _, _ := unstructured.NestedMap(c.(map[string]any), "resources", k)
				for r := range res {
					if r == "nvidia.com/gpu" || r == "amd.com/gpu" {
						t.Errorf("%s %s: a container asks for %s", o.GetKind(), o.GetName(), r)
					}
				}
			}
		}
		vols, _, _ := unstructured.NestedSlice(pod, "volumes")
		for _, v := range vols {
			if _, ok := v.(map[string]any)["persistentVolumeClaim"]; ok {
				t.Errorf("%s %s: mounts a PersistentVolumeClaim the install does not make", o.GetKind(), o.GetName())
			}
		}
	}
	slices.Sort(workloads)
	want := []string{"Deployment/kvmesh-ingress", "Deployment/kvmesh-orchestrator", "Job/kvmesh-bootstrap", "StatefulSet/nats"}
	if !slices.Equal(workloads, want) {
		t.Errorf("the install's workloads are %v, want %v (docs/INSTALL.md, section 2)", workloads, want)
	}
	// The example engine is still there to apply on purpose.
	find(t, render(t, kc, "overlays/injected"), "Deployment", "vllm-llama3-8b")
}

// TestInstallWorkloadsSurviveDisruption: every long-running workload of the
// install with more than one replica (or an HPA) has a PodDisruptionBudget
// that keeps at least one of its pods through a drain and spreads its pods
// across nodes, and every pod, the gateway's picker's too, meets Pod Security
// "restricted" hardened as the ingress (checkRestricted). The orchestrator
// serves a failurePolicy Fail webhook: losing both replicas at once rejects
// every injected pod.
func TestInstallWorkloadsSurviveDisruption(t *testing.T) {
	kc := kubectl(t)
	objs := render(t, kc, "install")
	// The picker (gateway/base) is applied with the install; the engine that overlay brings is the user's.
	checkRestricted(t, "Deployment kvmesh-epp", templatePod(t, find(t, render(t, kc, "gateway/base"), "Deployment", "kvmesh-epp"), "kvmesh"))
	hpa := map[string]bool{}
	for _, o := range objs {
		if o.GetKind() == "HorizontalPodAutoscaler" {
			name, _, _ := unstructured.NestedString(o.Object, "spec", "scaleTargetRef", "name")
			hpa[name] = true
		}
	}
	for _, o := range objs {
		switch o.GetKind() {
		case "Deployment", "StatefulSet", "DaemonSet", "Job":
		default:
			continue
		}
		name := o.GetKind() + " " + o.GetName()
		pod := templatePod(t, o, "kvmesh")
		checkRestricted(t, name, pod)
		var spec struct {
			Spec struct {
				Replicas *int32 `json:"replicas"`
			} `json:"spec"`
		}
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &spec); err != nil {
			t.Fatal(err)
		}
		replicas := int32(1)
		if spec.Spec.Replicas != nil {
			replicas = *spec.Spec.Replicas
		}
		if o.GetKind() == "Job" || o.GetKind() == "DaemonSet" || (!hpa[o.GetName()] && replicas < 2) {
			continue
		}
		pdb := false
		for _, p := range objs {
			if p.GetKind() != "PodDisruptionBudget" {
				continue
			}
			var b policyv1.PodDisruptionBudget
			if err := runtime.DefaultUnstructuredConverter.FromUnstructured(p.Object, &b); err != nil {
				t.Fatal(err)
			}
			if b.Spec.Selector == nil || !selects(b.Spec.Selector, pod.Labels) {
				continue
			}
			if m := b.Spec.MinAvailable; m != nil && m.IntValue() >= 1 {
				pdb = true
			}
			if m := b.Spec.MaxUnavailable; m != nil && m.Type == intstr.Int && m.IntValue() >= 1 && int32(m.IntValue()) < replicas {
				pdb = true
			}
		}
		if !pdb {
			t.Errorf("%s: no PodDisruptionBudget keeping one of its pods through a drain", name)
		}
		spread := slices.ContainsFunc(pod.Spec.TopologySpreadConstraints, func(c corev1.TopologySpreadConstraint) bool {
			return c.TopologyKey == "kubernetes.io/hostname" && c.LabelSelector != nil && selects(c.LabelSelector, pod.Labels)
		})
		if a := pod.Spec.Affinity; a != nil && a.PodAntiAffinity != nil {
			for _, w := range a.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution {
				spread = spread || (w.PodAffinityTerm.TopologyKey == "kubernetes.io/hostname" && selects(w.PodAffinityTerm.LabelSelector, pod.Labels))
			}
			for _, term := range a.PodAntiAffinity.RequiredDuringSchedulingIgnoredDuringExecution {
				spread = spread || (term.TopologyKey == "kubernetes.io/hostname" && selects(term.LabelSelector, pod.Labels))
			}
		}
		if !spread {
			t.Errorf("%s: its pods are not spread across nodes (topologySpreadConstraints or podAntiAffinity on kubernetes.io/hostname)", name)
		}
	}
}

// checkRestricted: pod meets Pod Security "restricted" (non-root, no
// privilege escalation, every capability dropped, the RuntimeDefault seccomp
// profile; no host namespaces, ports or paths) and the ingress's hardening
// beyond it: a read-only root filesystem, and kvmesh's containers as the
// image's user, 65532.
func checkRestricted(t *testing.T, name string, pod *corev1.Pod) {
	t.Helper()
	psc := pod.Spec.SecurityContext
	if psc == nil {
		psc = &corev1.PodSecurityContext{}
	}
	if pod.Spec.HostNetwork || pod.Spec.HostPID || pod.Spec.HostIPC {
		t.Errorf("%s: shares a host namespace", name)
	}
	for _, v := range pod.Spec.Volumes {
		if v.HostPath != nil {
			t.Errorf("%s: mounts the host path %s", name, v.HostPath.Path)
		}
	}
	for _, c := range slices.Concat(pod.Spec.InitContainers, pod.Spec.Containers) {
		cname := name + "/" + c.Name
		sc := c.SecurityContext
		if sc == nil {
			sc = &corev1.SecurityContext{}
		}
		seccomp := sc.SeccompProfile
		if seccomp == nil {
			seccomp = psc.SeccompProfile
		}
		if seccomp == nil || seccomp.Type != corev1.SeccompProfileTypeRuntimeDefault {
			t.Errorf("%s: no seccompProfile RuntimeDefault", cname)
		}
		nonRoot, uid := sc.RunAsNonRoot, sc.RunAsUser
		if nonRoot == nil {
			nonRoot = psc.RunAsNonRoot
		}
		if uid == nil {
			uid = psc.RunAsUser
		}
		if nonRoot == nil || !*nonRoot || (uid != nil && *uid == 0) {
			t.Errorf("%s: not runAsNonRoot (or runs as uid 0)", cname)
		}
		if strings.Contains(c.Image, "kvmesh/kvmesh") && (uid == nil || *uid != 65532) {
			t.Errorf("%s: kvmesh runs as uid %v, want the image's 65532", cname, uid)
		}
		if sc.Privileged != nil && *sc.Privileged {
			t.Errorf("%s: privileged", cname)
		}
		if sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation {
			t.Errorf("%s: allowPrivilegeEscalation is not false", cname)
		}
		if sc.Capabilities == nil || !slices.Contains(sc.Capabilities.Drop, "ALL") || len(sc.Capabilities.Add) > 0 {
			t.Errorf("%s: capabilities not dropped (drop [ALL], add none)", cname)
		}
		if sc.ReadOnlyRootFilesystem == nil || !*sc.ReadOnlyRootFilesystem {
			t.Errorf("%s: root filesystem not read-only", cname)
		}
		for _, p := range c.Ports {
			if p.HostPort != 0 {
				t.Errorf("%s: host port %d", cname, p.HostPort)
			}
		}
	}
}

// TestInstallObjectsArePartOfKvmesh: every object the install applies,
// cluster-scoped ones included (CRDs, ClusterRole and its binding, the
// webhook configuration, the Namespace), carries app.kubernetes.io/part-of:
// kvmesh, so `kubectl get ... -l app.kubernetes.io/part-of=kvmesh` finds them
// all.
func TestInstallObjectsArePartOfKvmesh(t *testing.T) {
	kc := kubectl(t)
	for _, o := range render(t, kc, "install") {
		if o.GetLabels()["app.kubernetes.io/part-of"] != "kvmesh" {
			t.Errorf("%s %s: no label app.kubernetes.io/part-of=kvmesh", o.GetKind(), o.GetName())
		}
	}
}

// TestOnlyAPIClientsGetAToken: a pod that never calls the Kubernetes API
// (NATS, the ingress, the sidecars, the example engines) mounts no
// ServiceAccount token; only the orchestrator and the bootstrap Job do.
func TestOnlyAPIClientsGetAToken(t *testing.T) {
	kc := kubectl(t)
	apiClients := map[string]bool{"kvmesh-orchestrator": true, "kvmesh-bootstrap": true}
	for _, dir := range []string{"install", "overlays/injected", "overlays/sidecar-container", "overlays/daemonset"} {
		objs := render(t, kc, dir)
		noToken := map[string]bool{}
		for _, o := range objs {
			if o.GetKind() == "ServiceAccount" {
				if v, ok, _ := unstructured.NestedBool(o.Object, "automountServiceAccountToken"); ok && !v {
					noToken[o.GetName()] = true
				}
			}
		}
		for _, o := range objs {
			switch o.GetKind() {
			case "Deployment", "StatefulSet", "DaemonSet", "Job":
			default:
				continue
			}
			if apiClients[o.GetName()] {
				continue
			}
			pod := templatePod(t, o, "kvmesh")
			if a := pod.Spec.AutomountServiceAccountToken; a != nil && !*a {
				continue
			}
			if a := pod.Spec.AutomountServiceAccountToken; a == nil && noToken[pod.Spec.ServiceAccountName] {
				continue
			}
			t.Errorf("%s: %s %s mounts a ServiceAccount token it has no use for", dir, o.GetKind(), o.GetName())
		}
	}
}

// TestWebhookOnlyWhereInjected: the install and overlays/injected carry the
// sidecar webhook (its MutatingWebhookConfiguration, the orchestrator run
// with --webhook-*, ready once it is registered); the overlays for clusters
// that forbid admission webhooks (sidecar-container, daemonset) and
// orchestrator-no-webhook install no webhook configuration and run the
// orchestrator with the full one's arguments less --webhook-*, ready on
// /healthz of its metrics port (k8s tester 2: they installed the webhook
// and their readiness waited on it).
func TestWebhookOnlyWhereInjected(t *testing.T) {
	kc := kubectl(t)
	orchestrator := func(objs []*unstructured.Unstructured) corev1.Container {
		t.Helper()
		var pod corev1.PodTemplateSpec
		tmpl, _, _ := unstructured.NestedMap(find(t, objs, "Deployment", "kvmesh-orchestrator").Object, "spec", "template")
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(tmpl, &pod); err != nil {
			t.Fatal(err)
		}
		return pod.Spec.Containers[0]
	}
	full := orchestrator(render(t, kc, "orchestrator"))
	if !slices.ContainsFunc(full.Args, func(a string) bool { return strings.HasPrefix(a, "--webhook-listen=") }) {
		t.Fatalf("manifests/orchestrator runs without --webhook-listen: %v", full.Args)
	}
	lessWebhook := slices.DeleteFunc(slices.Clone(full.Args), func(a string) bool { return strings.HasPrefix(a, "--webhook-") })
	for _, dir := range []string{"orchestrator", "install", "overlays/injected", "orchestrator-no-webhook", "overlays/sidecar-container", "overlays/daemonset"} {
		t.Run(dir, func(t *testing.T) {
			objs := render(t, kc, dir)
			webhook := dir == "orchestrator" || dir == "install" || dir == "overlays/injected"
			var mwc []string
			for _, o := range objs {
				if o.GetKind() == "MutatingWebhookConfiguration" || o.GetKind() == "ValidatingWebhookConfiguration" {
					mwc = append(mwc, o.GetName())
				}
			}
			c := orchestrator(objs)
			probe := c.ReadinessProbe
			if probe == nil || probe.HTTPGet == nil {
				t.Fatalf("the orchestrator has no HTTP readiness probe: %+v", probe)
			}
			if webhook {
				if !slices.Equal(mwc, []string{"kvmesh-sidecar-injector"}) {
					t.Errorf("webhook configurations %v, want kvmesh-sidecar-injector", mwc)
				}
				if !slices.Equal(c.Args, full.Args) {
					t.Errorf("orchestrator args %v, want %v", c.Args, full.Args)
				}
				return
			}
			if len(mwc) > 0 {
				t.Errorf("renders webhook configurations %v for a cluster that forbids webhooks", mwc)
			}
			if !slices.Equal(c.Args, lessWebhook) {
				t.Errorf("orchestrator args %v, want the full orchestrator's less --webhook-*: %v", c.Args, lessWebhook)
			}
			if probe.HTTPGet.Path != "/healthz" || probe.HTTPGet.Port.String() != "metrics" || probe.HTTPGet.Scheme == corev1.URISchemeHTTPS {
				t.Errorf("readiness probe %+v, want HTTP /healthz on the metrics port (served without the webhook)", probe.HTTPGet)
			}
			for _, p := range c.Ports {
				if p.Name == "webhook" {
					t.Errorf("the orchestrator still exposes the webhook port %d", p.ContainerPort)
				}
			}
			for _, o := range objs {
				if o.GetKind() == "Role" && strings.Contains(o.GetName(), "webhook") {
					t.Errorf("Role %s rendered without a webhook", o.GetName())
				}
			}
		})
	}
}
