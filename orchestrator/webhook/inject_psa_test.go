package webhook

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// serveInjection serves h over TLS on loopback and registers it with the API
// server (by URL and CA bundle) until the test ends.
func serveInjection(t *testing.T, ctx context.Context, kube kubernetes.Interface, h http.Handler) {
	t.Helper()
	certs, err := GenerateCerts("127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	srv, err := Listen("127.0.0.1:0", certs.Cert, h)
	if err != nil {
		t.Fatal(err)
	}
	sctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(sctx) }()
	t.Cleanup(func() { stop(); <-done })
	if err := Ensure(ctx, kube, Target{URL: "https://" + srv.Addr() + Path}, certs.CABundle); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = kube.AdmissionregistrationV1().MutatingWebhookConfigurations().Delete(context.Background(), ConfigName, metav1.DeleteOptions{})
	})
}

// restrictedEnginePod is an engine pod that meets Pod Security "restricted"
// itself, labelled for injection.
func restrictedEnginePod(name string) *corev1.Pod {
	p := enginePod(name, map[string]string{LabelInject: "true"}, map[string]string{AnnotationModel: "m"})
	p.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsNonRoot: new(true), RunAsUser: new(int64(1000)),
		SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}}
	p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{AllowPrivilegeEscalation: new(false),
		Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}}
	return p
}

// TestInjectedPodPassesRestrictedPodSecurity: in a namespace that enforces
// Pod Security "restricted", an engine pod that meets it is admitted with
// the sidecar injected (the API server's PodSecurity admission runs after
// the mutating webhook, on the injected pod), and the sidecar has its memory
// limit and GOMEMLIMIT. A pod whose own engine does not meet it is still
// refused (the namespace does enforce).
func TestInjectedPodPassesRestrictedPodSecurity(t *testing.T) {
	s := kubetest.Shared(t)
	plain, restricted := s.Namespace(t), s.Namespace(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kube := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := kube.CoreV1().Namespaces().Patch(ctx, restricted, types.MergePatchType,
		[]byte(`{"metadata":{"labels":{"pod-security.kubernetes.io/enforce":"restricted"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	serveInjection(t, ctx, kube, &Handler{Sidecar: DefaultSidecarConfig()})
	// The API server loads webhook configurations asynchronously: probe
	// with dry runs where Pod Security enforces nothing.
	testutil.WaitFor(t, time.Minute, "the API server to call the webhook", func() bool {
		p, err := kube.CoreV1().Pods(plain).Create(ctx, restrictedEnginePod("probe"), metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}})
		return err == nil && len(p.Spec.InitContainers) == 1
	})

	p, err := kube.CoreV1().Pods(restricted).Create(ctx, restrictedEnginePod("engine"), metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("an injected restricted engine pod in a restricted namespace: %v", err)
	}
	if len(p.Spec.InitContainers) != 1 || p.Spec.InitContainers[0].Name != ContainerName {
		t.Fatalf("stored pod has init containers %+v", p.Spec.InitContainers)
	}
	sc := p.Spec.InitContainers[0]
	if sc.SecurityContext == nil || sc.SecurityContext.RunAsUser == nil || *sc.SecurityContext.RunAsUser != SidecarUID ||
		sc.SecurityContext.ReadOnlyRootFilesystem == nil || !*sc.SecurityContext.ReadOnlyRootFilesystem {
		t.Errorf("sidecar securityContext %+v: want runAsUser %d and a read-only root filesystem", sc.SecurityContext, SidecarUID)
	}
	lim, ok := sc.Resources.Limits[corev1.ResourceMemory]
	if !ok {
		t.Fatalf("sidecar resources %+v: no memory limit", sc.Resources)
	}
	var gml string
	for _, e := range sc.Env {
		if e.Name == "GOMEMLIMIT" {
			gml = e.Value
		}
	}
	q, err := resource.ParseQuantity(strings.Replace(gml, "MiB", "Mi", 1))
	if err != nil {
		t.Fatalf("GOMEMLIMIT %q: %v", gml, err)
	}
	if r := float64(q.Value()) / float64(lim.Value()); r < 0.85 || r > 0.95 {
		t.Errorf("GOMEMLIMIT %s is %.0f %% of the memory limit %s; want about 90 %%", gml, 100*r, lim.String())
	}

	// The namespace enforces: an engine that is itself not hardened is refused.
	loose := restrictedEnginePod("loose")
	loose.Spec.Containers[0].SecurityContext = nil
	if _, err := kube.CoreV1().Pods(restricted).Create(ctx, loose, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}); !apierrors.IsForbidden(err) || !strings.Contains(err.Error(), `container "engine"`) {
		t.Errorf("an unhardened engine in a restricted namespace: got %v, want Forbidden naming the engine", err)
	}
}

// The sidecar runs as the image's non-root user even in a pod whose engine
// runs as root: its own runAsUser overrides the pod's.
func TestSidecarNotRootInARootPod(t *testing.T) {
	pod := enginePod("root", map[string]string{LabelInject: "true"}, map[string]string{AnnotationModel: "m"})
	pod.Spec.SecurityContext = &corev1.PodSecurityContext{RunAsUser: new(int64(0))}
	c, err := DefaultSidecarConfig().sidecar(pod)
	if err != nil {
		t.Fatal(err)
	}
	sc := c.SecurityContext
	if sc == nil || sc.RunAsUser == nil || *sc.RunAsUser != SidecarUID || sc.RunAsNonRoot == nil || !*sc.RunAsNonRoot ||
		sc.AllowPrivilegeEscalation == nil || *sc.AllowPrivilegeEscalation || sc.Capabilities == nil || len(sc.Capabilities.Drop) != 1 || sc.Capabilities.Drop[0] != "ALL" ||
		sc.SeccompProfile == nil || sc.SeccompProfile.Type != corev1.SeccompProfileTypeRuntimeDefault {
		t.Errorf("sidecar securityContext %+v", sc)
	}
}
