package webhook

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// The API server authorizes with RBAC so the tests can act as the
// orchestrator's ServiceAccount with rbac.yaml's rules; the admin is in
// system:masters.
func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{RBAC: true})) }

func enginePod(name string, labels, ann map[string]string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta:   metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels, Annotations: ann},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "engine", Image: "vllm"}}},
	}
}

func review(t testing.TB, pod *corev1.Pod) []byte {
	t.Helper()
	raw, _ := json.Marshal(pod)
	b, _ := json.Marshal(admissionv1.AdmissionReview{
		TypeMeta: metav1.TypeMeta{APIVersion: "admission.k8s.io/v1", Kind: "AdmissionReview"},
		Request: &admissionv1.AdmissionRequest{UID: "u1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"},
			Object: runtime.RawExtension{Raw: raw}},
	})
	return b
}

func TestReview(t *testing.T) {
	h := &Handler{Sidecar: DefaultSidecarConfig()}
	inject := map[string]string{LabelInject: "true", LabelRoleKind: "decode"}
	cases := []struct {
		name    string
		pod     *corev1.Pod
		allowed bool
		patched bool
		want    []string // substrings of the patch
	}{
		{"unlabelled", enginePod("a", nil, nil), true, false, nil},
		{"labelled", enginePod("b", inject, map[string]string{AnnotationEventsPort: "6000", AnnotationModel: "m"}), true, true,
			[]string{`"restartPolicy":"Always"`, `--events=tcp://127.0.0.1:6000`, `--replay=tcp://127.0.0.1:5558`,
				`--engine-host=$(POD_IP)`, `--engine-port=8000`, `--role=decode`, `--model=m`, `/spec/initContainers`}},
		{"bad port", enginePod("c", inject, map[string]string{AnnotationEnginePort: "http", AnnotationModel: "m"}), false, false, nil},
		// The sidecar refuses to start without a model: say so at admission.
		{"no model", enginePod("e", inject, nil), false, false, nil},
		{"model as a label", enginePod("f", map[string]string{LabelInject: "true", LabelModel: "llama3"}, nil), true, true,
			[]string{`--model=llama3`}},
		{"model but no inject label", enginePod("g", map[string]string{LabelModel: "llama3"}, map[string]string{AnnotationModel: "m"}), true, false, nil},
		// The sidecar refuses --role=encode: say so at admission.
		{"bad role kind", enginePod("h", map[string]string{LabelInject: "true", LabelRoleKind: "encode"}, map[string]string{AnnotationModel: "m"}), false, false, nil},
		{"prefill role kind", enginePod("i", map[string]string{LabelInject: "true", LabelRoleKind: "prefill"}, map[string]string{AnnotationModel: "m"}), true, true,
			[]string{`--role=prefill`}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out, err := h.Review(review(t, c.pod))
			if err != nil {
				t.Fatal(err)
			}
			if out.Response.UID != "u1" || out.Response.Allowed != c.allowed || (out.Response.Patch != nil) != c.patched {
				t.Fatalf("response %+v", out.Response)
			}
			for _, w := range c.want {
				if !strings.Contains(string(out.Response.Patch), w) {
					t.Errorf("patch lacks %s: %s", w, out.Response.Patch)
				}
			}
		})
	}
	// Reinvocation: a pod that has the sidecar is left alone.
	p := enginePod("d", inject, nil)
	p.Spec.InitContainers = []corev1.Container{{Name: ContainerName}}
	if out, _ := h.Review(review(t, p)); out.Response.Patch != nil {
		t.Errorf("injected twice: %s", out.Response.Patch)
	}
	// A pod running its own sidecar as a regular container is left alone:
	// a second container of that name would be refused.
	p = enginePod("d2", inject, map[string]string{AnnotationModel: "m"})
	p.Spec.Containers = append(p.Spec.Containers, corev1.Container{Name: ContainerName, Image: "kvmesh"})
	if out, _ := h.Review(review(t, p)); !out.Response.Allowed || out.Response.Patch != nil {
		t.Errorf("a pod with its own %s container: allowed %v, patch %s", ContainerName, out.Response.Allowed, out.Response.Patch)
	}
	for _, bad := range []string{"", "{", `{"request":null}`, `{"request":{"kind":{"kind":"Pod"},"object":"x"}}`} {
		if _, err := h.Review([]byte(bad)); !errors.Is(err, ErrBadReview) {
			t.Errorf("%q: %v, want ErrBadReview", bad, err)
		}
	}
}

func FuzzReview(f *testing.F) {
	f.Add(review(f, enginePod("b", map[string]string{LabelInject: "true"}, map[string]string{AnnotationEnginePort: "1"})))
	f.Add([]byte(`{"request":{"uid":"x","kind":{"kind":"Pod"},"object":{"metadata":{"labels":{"kvmesh.io/inject":"true"}}}}}`))
	f.Add([]byte(`{}`))
	h := &Handler{Sidecar: DefaultSidecarConfig()}
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := h.Review(b)
		if err == nil && (out == nil || out.Response == nil) {
			t.Fatal("no response and no error")
		}
	})
}

// TestInjectionThroughAdmissionChain registers the webhook by URL and CA
// bundle with a real API server, which calls it over TLS on loopback when a
// labelled pod is created.
func TestInjectionThroughAdmissionChain(t *testing.T) {
	s := kubetest.Shared(t)
	ns := s.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var calls atomic.Int64
	h := &Handler{Sidecar: DefaultSidecarConfig()}
	kube := kubernetes.NewForConfigOrDie(s.Config)
	serveInjection(t, ctx, kube, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		h.ServeHTTP(w, r)
	}))
	inject := map[string]string{LabelInject: "true"}
	// The API server loads webhook configurations asynchronously: probe with dry runs.
	testutil.WaitFor(t, time.Minute, "the API server to call the webhook", func() bool {
		p, err := kube.CoreV1().Pods(ns).Create(ctx, enginePod("probe", inject, map[string]string{AnnotationModel: "m"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(p.Spec.InitContainers) == 1
	})
	p, err := kube.CoreV1().Pods(ns).Create(ctx, enginePod("engine", inject, map[string]string{AnnotationModel: "m"}), metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != ContainerName ||
		p.Spec.InitContainers[0].RestartPolicy == nil || *p.Spec.InitContainers[0].RestartPolicy != corev1.ContainerRestartPolicyAlways {
		t.Fatalf("stored pod has init containers %+v", p.Spec.InitContainers)
	}
	if p.Annotations[AnnotationInjected] != "true" {
		t.Errorf("annotations %v", p.Annotations)
	}
	// Pods that are not kvmesh engines never reach the webhook (objectSelector),
	// even with a model label or annotation.
	before := calls.Load()
	for i, labels := range []map[string]string{nil, {LabelModel: "llama3"}, {LabelInject: "false"}} {
		plain, err := kube.CoreV1().Pods(ns).Create(ctx, enginePod(fmt.Sprintf("plain-%d", i), labels, map[string]string{AnnotationModel: "m"}), metav1.CreateOptions{})
		if err != nil || len(plain.Spec.InitContainers) != 0 || plain.Annotations[AnnotationInjected] != "" {
			t.Fatalf("pod labelled %v: %v %v", labels, plain.Spec.InitContainers, err)
		}
	}
	if n := calls.Load() - before; n != 0 {
		t.Errorf("the API server called the webhook %d times for pods without %s=true", n, LabelInject)
	}
	_, err = kube.CoreV1().Pods(ns).Create(ctx, enginePod("nomodel", inject, nil), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "kvmesh.io/model") {
		t.Fatalf("an engine pod without a model admitted: %v", err)
	}
	_, err = kube.CoreV1().Pods(ns).Create(ctx, enginePod("badport", inject, map[string]string{AnnotationReplayPort: "99999", AnnotationModel: "m"}), metav1.CreateOptions{})
	if err == nil || !strings.Contains(err.Error(), "bad port annotation") {
		t.Fatalf("bad port annotation admitted: %v", err)
	}
	var se *apierrors.StatusError
	if !errors.As(err, &se) {
		t.Errorf("error %T is not an API status", err)
	}
}

// The injected sidecar connects to NATS as its role's user with the password
// and gossip key from the namespace's Secrets, and, given the annotation,
// publishes the model's tokenizer from the engine's own model volume.
func TestSidecarCredentialsAndTokenizerDir(t *testing.T) {
	pod := &corev1.Pod{}
	pod.Labels = map[string]string{LabelInject: "true"}
	pod.Annotations = map[string]string{AnnotationModel: "m", AnnotationTokenizerDir: "/models/llama/snapshot"}
	pod.Spec.Containers = []corev1.Container{{Name: "vllm", VolumeMounts: []corev1.VolumeMount{
		{Name: "shm", MountPath: "/dev/shm"}, {Name: "models", MountPath: "/models"}, {Name: "llama", MountPath: "/models/llama"}}}}
	c, err := DefaultSidecarConfig().sidecar(pod)
	if err != nil {
		t.Fatal(err)
	}
	args := strings.Join(c.Args, " ")
	for _, want := range []string{"--nats-user=sidecar", "--tokenizer-dir=/models/llama/snapshot", "--model=m"} {
		if !strings.Contains(args, want) {
			t.Errorf("args %q lack %s", args, want)
		}
	}
	if len(c.VolumeMounts) != 1 || c.VolumeMounts[0].Name != "llama" || !c.VolumeMounts[0].ReadOnly {
		t.Errorf("volume mounts %+v: want the engine's innermost mount holding the directory, read-only", c.VolumeMounts)
	}
	secrets := map[string]string{}
	for _, e := range c.Env {
		if e.ValueFrom != nil && e.ValueFrom.SecretKeyRef != nil {
			secrets[e.Name] = e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
		}
	}
	if secrets["KVMESH_NATS_PASSWORD"] != "kvmesh-nats/sidecar-password" || secrets["KVMESH_GOSSIP_KEY"] != "kvmesh-gossip/key" {
		t.Errorf("secret env %v", secrets)
	}

	// The installation's subject prefix, when one is set; none by default.
	if strings.Contains(args, "--nats-prefix") {
		t.Errorf("default config, yet %q", args)
	}
	prefixed := DefaultSidecarConfig()
	prefixed.NATSPrefix = "team-a"
	cp, err := prefixed.sidecar(pod)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(cp.Args, "--nats-prefix=team-a") {
		t.Errorf("args %q lack --nats-prefix=team-a", cp.Args)
	}

	// No NATS server named (the sidecar's embedded one): no credentials,
	// which kvmesh sidecar would refuse without --nats.
	noNATS := DefaultSidecarConfig()
	noNATS.NATS = ""
	c2, err := noNATS.sidecar(pod)
	if err != nil {
		t.Fatal(err)
	}
	for _, a := range c2.Args {
		if strings.HasPrefix(a, "--nats") {
			t.Errorf("no NATS server, yet %s", a)
		}
	}
	for _, e := range c2.Env {
		if e.Name == "KVMESH_NATS_PASSWORD" {
			t.Error("no NATS server, yet a NATS password")
		}
	}
	if c.LivenessProbe == nil || c.ReadinessProbe == nil {
		t.Error("the sidecar has no liveness or readiness probe")
	} else if c.ReadinessProbe.HTTPGet.Path == "/ready" {
		t.Error("the engine pod's readiness waits on NATS (the sidecar's /ready)")
	}
	pod.Annotations[AnnotationTokenizerDir] = "/elsewhere"
	if _, err := DefaultSidecarConfig().sidecar(pod); !errors.Is(err, ErrBadTokenizerDir) {
		t.Errorf("a tokenizer directory on no volume: err %v, want ErrBadTokenizerDir", err)
	}
}

func TestSidecarPDFlags(t *testing.T) {
	cases := []struct {
		name   string
		labels map[string]string
		ann    map[string]string
		want   []string
		absent []string
		err    error
	}{
		{name: "no P/D labels", absent: []string{"--pd-group", "--pd-protocol", "--bootstrap-port"}},
		{name: "default group label", labels: map[string]string{LabelPDGroup: "llama-pd-0"}, want: []string{"--pd-group=llama-pd-0"}},
		{name: "custom group label", labels: map[string]string{LabelPDGroup: "ignored", "team/pairs": "g7"},
			ann: map[string]string{AnnotationPDGroupLabel: "team/pairs"}, want: []string{"--pd-group=g7"}, absent: []string{"ignored"}},
		{name: "sglang", ann: map[string]string{AnnotationPDProtocol: "sglang", AnnotationBootstrapPort: "9000"},
			want: []string{"--pd-protocol=sglang", "--bootstrap-port=9000"}},
		{name: "bad protocol", ann: map[string]string{AnnotationPDProtocol: "rdma"}, err: ErrBadPDProtocol},
		{name: "bad bootstrap port", ann: map[string]string{AnnotationBootstrapPort: "0"}, err: ErrBadPort},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pod := &corev1.Pod{}
			pod.Labels = map[string]string{LabelInject: "true"}
			maps.Copy(pod.Labels, tc.labels)
			pod.Annotations = map[string]string{AnnotationModel: "m"}
			maps.Copy(pod.Annotations, tc.ann)
			pod.Spec.Containers = []corev1.Container{{Name: "engine"}}
			c, err := DefaultSidecarConfig().sidecar(pod)
			if tc.err != nil {
				if !errors.Is(err, tc.err) {
					t.Fatalf("err %v, want %v", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			args := strings.Join(c.Args, " ")
			for _, w := range tc.want {
				if !strings.Contains(args, w) {
					t.Errorf("args %q lack %s", args, w)
				}
			}
			for _, a := range tc.absent {
				if strings.Contains(args, a) {
					t.Errorf("args %q hold %s", args, a)
				}
			}
		})
	}
}

// With the webhook down (failurePolicy Fail), pods asking for the sidecar
// are rejected (an engine without it is invisible to the router) and every
// other pod is created as if there were no webhook.
func TestOutageRejectsOnlyEnginePods(t *testing.T) {
	s := kubetest.Shared(t)
	ns := s.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(s.Config)
	certs, err := GenerateCerts("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close() // nothing listens there: the orchestrator is down
	if err := Ensure(ctx, kube, Target{URL: "https://" + dead + Path}, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), ConfigName, metav1.DeleteOptions{})
	})
	inject := map[string]string{LabelInject: "true"}
	testutil.WaitFor(t, time.Minute, "the API server to load the configuration and fail engine pods", func() bool {
		_, err := kube.CoreV1().Pods(ns).Create(ctx, enginePod("probe", inject, map[string]string{AnnotationModel: "m"}), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err != nil && strings.Contains(err.Error(), "sidecar.kvmesh.io")
	})
	for i, labels := range []map[string]string{nil, {"app": "web"}, {LabelModel: "llama3"}} {
		if _, err := kube.CoreV1().Pods(ns).Create(ctx, enginePod(fmt.Sprintf("other-%d", i), labels, nil), metav1.CreateOptions{}); err != nil {
			t.Errorf("pod labelled %v blocked by the webhook outage: %v", labels, err)
		}
	}
}

// manifests/orchestrator/webhook.yaml is the configuration the orchestrator
// writes for the install's Service, caBundle aside: after
// `kubectl apply --server-side` and the orchestrator's write, the
// orchestrator owns caBundle alone, and applying the manifest again (an
// upgrade) neither conflicts nor drops the CA; nor does applying it over a
// configuration the orchestrator created (an upgrade from a release that
// did not ship webhook.yaml).
func TestWebhookManifest(t *testing.T) {
	s := kubetest.Shared(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	admin := kubernetes.NewForConfigOrDie(s.Config)
	api := admin.AdmissionregistrationV1().MutatingWebhookConfigurations()
	_ = api.Delete(ctx, ConfigName, metav1.DeleteOptions{})
	t.Cleanup(func() { _ = api.Delete(context.Background(), ConfigName, metav1.DeleteOptions{}) })
	manifest := manifestObjects(t, "webhook.yaml")[0]
	apply := func() error {
		_, err := api.Patch(ctx, ConfigName, types.ApplyPatchType, manifest, metav1.PatchOptions{FieldManager: "kubectl"})
		return err
	}
	if err := apply(); err != nil {
		t.Fatal(err)
	}
	applied, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	certs, err := GenerateCerts("kvmesh-orchestrator.kvmesh.svc")
	if err != nil {
		t.Fatal(err)
	}
	install := Target{ServiceNamespace: "kvmesh", Service: "kvmesh-orchestrator", ServicePort: 443}
	if err := Ensure(ctx, admin, install, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	got, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// Everything but the bundle is as applied (both defaulted by the API server).
	w := got.Webhooks[0].DeepCopy()
	w.ClientConfig.CABundle = nil
	if !equality(w, &applied.Webhooks[0]) {
		t.Errorf("the orchestrator's configuration differs from webhook.yaml's:\n%+v\nvs\n%+v", w, applied.Webhooks[0])
	}
	for _, mf := range got.ManagedFields {
		if mf.Manager == "kubectl" || mf.FieldsV1 == nil {
			continue
		}
		if f := mf.FieldsV1.GetRawString(); strings.Count(f, `"f:`) != strings.Count(f, `"f:caBundle"`)+strings.Count(f, `"f:clientConfig"`)+strings.Count(f, `"f:webhooks"`) {
			t.Errorf("manager %s owns more than caBundle: %s", mf.Manager, f)
		}
	}
	if err := apply(); err != nil {
		t.Fatalf("re-applying webhook.yaml after the orchestrator's write: %v", err)
	}
	if b := registeredBundle(ctx, admin); !bytes.Equal(b, certs.CABundle) {
		t.Error("re-applying webhook.yaml dropped the CA bundle")
	}

	// The other order: the orchestrator wrote the configuration first (a
	// release before webhook.yaml was part of the install created it), so
	// its manager owns every field, the atomic rules list included; the
	// upgrade's server-side apply (no --force-conflicts) must not conflict.
	// It did on rules, which the API server had stored with the defaulted
	// scope "*" the manifest lacked.
	if err := api.Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := Ensure(ctx, admin, install, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	created, err := api.Get(ctx, ConfigName, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// The API server defaults nothing in what the orchestrator writes:
	// every field a manifest may set already holds the stored value.
	if want := Configuration(install, certs.CABundle).Webhooks[0]; !equality(&created.Webhooks[0], &want) {
		t.Errorf("the API server defaulted fields of the orchestrator's configuration:\nstored %+v\nwritten %+v", created.Webhooks[0], want)
	}
	if err := apply(); err != nil {
		t.Fatalf("applying webhook.yaml over the orchestrator's own configuration (an upgrade): %v", err)
	}
	if b := registeredBundle(ctx, admin); !bytes.Equal(b, certs.CABundle) {
		t.Error("applying webhook.yaml over the orchestrator's configuration dropped the CA bundle")
	}

	// Out of cluster the orchestrator registers a URL: the manifest's
	// service then joins it and the API server refuses the object (one of
	// url or service). docs/INSTALL.md says to delete the configuration
	// before applying; the apply then creates it and the orchestrator
	// fills in the bundle.
	if err := Ensure(ctx, admin, Target{URL: "https://127.0.0.1:9443" + Path}, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	if err := apply(); err == nil || !strings.Contains(err.Error(), "exactly one of url or service") {
		t.Errorf("applying webhook.yaml over a URL registration: %v, want the API server's one-of-url-or-service refusal (docs/INSTALL.md)", err)
	}
	if err := api.Delete(ctx, ConfigName, metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := apply(); err != nil {
		t.Fatalf("applying webhook.yaml once the URL registration is deleted: %v", err)
	}
}

func equality(a, b any) bool {
	x, _ := json.Marshal(a)
	y, _ := json.Marshal(b)
	return bytes.Equal(x, y)
}
