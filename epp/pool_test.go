package epp

import (
	"context"
	"errors"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	extprocfilter "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

func TestParsePoolSpec(t *testing.T) {
	good := map[string]any{"spec": map[string]any{
		"selector":          map[string]any{"matchLabels": map[string]any{"app": "llama"}},
		"targetPorts":       []any{map[string]any{"number": int64(8000)}},
		"endpointPickerRef": map[string]any{"name": "kvmesh-epp", "failureMode": "FailOpen"},
	}}
	ps, err := parsePoolSpec(good)
	if err != nil || ps.Selector["app"] != "llama" || len(ps.TargetPorts) != 1 || ps.TargetPorts[0] != 8000 || ps.EndpointPicker != "kvmesh-epp" || ps.FailureMode != "FailOpen" {
		t.Fatalf("%+v %v", ps, err)
	}
	bad := map[string]any{"spec": map[string]any{"targetPorts": []any{map[string]any{"number": int64(0)}, "x"}}}
	_, err = parsePoolSpec(bad)
	if !errors.Is(err, ErrBadPool) || !strings.Contains(err.Error(), "matchLabels is empty") || !strings.Contains(err.Error(), "targetPorts[0]") || !strings.Contains(err.Error(), "targetPorts[1]") {
		t.Fatalf("every problem listed: %v", err)
	}
}

func TestPodEndpoints(t *testing.T) {
	ready := corev1.PodCondition{Type: corev1.PodReady, Status: corev1.ConditionTrue}
	pod := &corev1.Pod{Status: corev1.PodStatus{PodIP: "10.1.2.3", Conditions: []corev1.PodCondition{ready}}}
	if got := podEndpoints(nil, pod, []int{8000, 8001}); strings.Join(got, ",") != "10.1.2.3:8000,10.1.2.3:8001" {
		t.Fatalf("ready pod: %v", got)
	}
	notReady := pod.DeepCopy()
	notReady.Status.Conditions[0].Status = corev1.ConditionFalse
	deleting := pod.DeepCopy()
	deleting.DeletionTimestamp = &metav1.Time{Time: time.Now()}
	noIP := pod.DeepCopy()
	noIP.Status.PodIP = ""
	for _, p := range []*corev1.Pod{notReady, deleting, noIP} {
		if got := podEndpoints(nil, p, []int{8000}); len(got) != 0 {
			t.Fatalf("%+v: %v", p.Status, got)
		}
	}
}

// TestInferencePoolNarrowsCandidates runs the picker against a real
// kube-apiserver: the InferencePool v1 CRD from manifests/crds/third-party,
// a pool selecting one pod (its status written as a kubelet would: there is
// none), and the real mesh. Only the pool's ready endpoints are candidates;
// the cache state still comes from the mesh.
func TestInferencePoolNarrowsCandidates(t *testing.T) {
	srv := kubetest.StartT(t, kubetest.Options{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	crd, err := filepath.Abs(filepath.Join("..", "manifests", "crds", "third-party", "inference.networking.k8s.io_inferencepools.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{}, crd); err != nil {
		t.Fatal(err)
	}
	ns := srv.Namespace(t)
	// The shipped pool manifest is valid against the CRD (server-side dry run).
	if _, err := kubetest.ApplyFiles(ctx, srv.Config, kubetest.ApplyOptions{Namespace: ns, DryRun: true},
		filepath.Join("..", "manifests", "gateway", "base", "inferencepool.yaml")); err != nil {
		t.Fatalf("manifests/gateway/base/inferencepool.yaml: %v", err)
	}
	kube := kubernetes.NewForConfigOrDie(srv.Config)
	dyn := dynamic.NewForConfigOrDie(srv.Config)
	pools := dyn.Resource(InferencePoolGVR).Namespace(ns)

	// The API server enforces the CRD's schema.
	for _, spec := range []map[string]any{
		{"selector": map[string]any{"matchLabels": map[string]any{"app": "llama"}}, "targetPorts": []any{}, "endpointPickerRef": map[string]any{"name": "e", "port": map[string]any{"number": int64(9002)}}},
		{"selector": map[string]any{"matchLabels": map[string]any{"app": "llama"}}, "targetPorts": []any{map[string]any{"number": int64(8000)}}, "endpointPickerRef": map[string]any{"name": "e"}},
	} {
		if _, err := pools.Create(ctx, poolObject("bad", spec), metav1.CreateOptions{}); err == nil {
			t.Fatalf("the API server accepted an invalid pool %v", spec)
		}
	}

	m := newMesh(t)
	pool, err := NewPool(srv.Config, ns, "llama-pool", quiet)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- pool.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	s, r := m.startEPP("epp-pool", DefaultConfig(), Deps{Pool: pool}, nil)
	m.addEngine("eng-a", "", 1)
	m.addEngine("eng-b", "", 2)
	portOf := func(id string) int64 {
		_, p, _ := strings.Cut(m.ep[id], ":")
		n, _ := strconv.Atoi(p)
		return int64(n)
	}

	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "model-0", Labels: map[string]string{"app": "llama"}},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "vllm", Image: "vllm/vllm-openai"}}}}
	if _, err = kube.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	setReady := func(ready corev1.ConditionStatus) {
		t.Helper()
		p, err := kube.CoreV1().Pods(ns).Get(ctx, "model-0", metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		p.Status.PodIP = "127.0.0.1"
		p.Status.PodIPs = []corev1.PodIP{{IP: "127.0.0.1"}}
		p.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodReady, Status: ready, LastTransitionTime: metav1.Now()}}
		if _, err := kube.CoreV1().Pods(ns).UpdateStatus(ctx, p, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	setReady(corev1.ConditionTrue)
	spec := map[string]any{
		"selector":          map[string]any{"matchLabels": map[string]any{"app": "llama"}},
		"targetPorts":       []any{map[string]any{"number": portOf("eng-a")}},
		"endpointPickerRef": map[string]any{"name": "kvmesh-epp", "port": map[string]any{"number": int64(9002)}, "failureMode": "FailClose"},
	}
	if _, err := pools.Create(ctx, poolObject("llama-pool", spec), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "the pool's one ready endpoint", func() bool {
		return strings.Join(pool.Endpoints(), ",") == m.ep["eng-a"]
	})
	m.waitEngines(r, 1) // the mesh has two engines; the pool admits one

	// eng-b holds the chat prefix, but only eng-a is in the pool.
	m.warm(r, "eng-b", "/v1/chat/completions", chatBody(words("pool-system", 300), "warm", false), chatPrefix(t, m, words("pool-system", 300)))
	env := newEnvoy(t, s.Addr(), extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED, extprocfilter.ProcessingMode_FULL_DUPLEX_STREAMED)
	body := []byte(chatBody(words("pool-system", 300), "a question", false))
	res, err := env.do(ctx, httpRequest{method: "POST", path: "/v1/chat/completions", body: body}, true)
	if err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-a"], 1)

	// The pool grows to both ports: the cache decides again.
	u, err := pools.Get(ctx, "llama-pool", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := unstructured.SetNestedSlice(u.Object, []any{map[string]any{"number": portOf("eng-a")}, map[string]any{"number": portOf("eng-b")}}, "spec", "targetPorts"); err != nil {
		t.Fatal(err)
	}
	if _, err := pools.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 20*time.Second, "both endpoints in the pool", func() bool { return pool.Has(m.ep["eng-b"]) })
	m.waitEngines(r, 2)
	testutil.WaitFor(t, 10*time.Second, "the picker settled", func() bool { return settled(r) })
	body = []byte(chatBody(words("pool-system", 300), "another question", false))
	if res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/chat/completions", body: body}, false); err != nil {
		t.Fatal(err)
	}
	checkRouting(t, res, m.ep["eng-b"], 2)

	// The pod stops being Ready: no endpoint fits.
	setReady(corev1.ConditionFalse)
	testutil.WaitFor(t, 20*time.Second, "the pool empty", func() bool { return len(pool.Endpoints()) == 0 })
	res, err = env.do(ctx, httpRequest{method: "POST", path: "/v1/chat/completions", body: body}, false)
	if !errors.Is(err, errImmediate) {
		t.Fatalf("routed with an empty pool: %v %v", res.dest, err)
	}
	checkImmediate(t, res, 503, "service_unavailable")
}

func poolObject(name string, spec map[string]any) *unstructured.Unstructured {
	return &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "inference.networking.k8s.io/v1", "kind": "InferencePool",
		"metadata": map[string]any{"name": name}, "spec": spec,
	}}
}

func chatPrefix(t *testing.T, m *mesh, system string) []uint32 {
	t.Helper()
	toks, err := m.tok.RenderChat(nil, chatMsgs(system, "warm"))
	if err != nil {
		t.Fatal(err)
	}
	return toks[:len(toks)*3/4]
}
