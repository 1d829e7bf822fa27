package kubetest

import (
	"context"
	"errors"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"
)

func TestMain(m *testing.M) { os.Exit(Main(m, Options{})) }

// TestServerServesAPI: the kubeconfig works, objects are stored in etcd, and
// pods are admitted without a "default" ServiceAccount (no token controller).
func TestServerServesAPI(t *testing.T) {
	s := Shared(t)
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(cfg)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ns := s.Namespace(t)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: "p"},
		Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "c", Image: "busybox"}}},
	}
	if _, err := cs.CoreV1().Pods(ns).Create(ctx, pod, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	got, err := cs.CoreV1().Pods(ns).Get(ctx, "p", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got.Status.Phase != corev1.PodPending {
		t.Fatalf("phase %q, want Pending (no kubelet)", got.Status.Phase)
	}
}

// TestApplyDecodesMultiDocYAML checks Decode and a server-side dry run.
func TestApplyDecodesMultiDocYAML(t *testing.T) {
	s := Shared(t)
	ns := s.Namespace(t)
	objs, err := Decode(strings.NewReader("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a}\n---\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\ndata: {k: v}\n"))
	if err != nil || len(objs) != 2 {
		t.Fatalf("decode: %d objects, %v", len(objs), err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := Apply(ctx, s.Config, ApplyOptions{Namespace: ns, DryRun: true}, objs...); err != nil {
		t.Fatal(err)
	}
	cs := kubernetes.NewForConfigOrDie(s.Config)
	if _, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "b", metav1.GetOptions{}); err == nil {
		t.Fatal("dry run stored the object")
	}
	if err := Apply(ctx, s.Config, ApplyOptions{Namespace: ns}, objs...); err != nil {
		t.Fatal(err)
	}
	cm, err := cs.CoreV1().ConfigMaps(ns).Get(ctx, "b", metav1.GetOptions{})
	if err != nil || cm.Data["k"] != "v" {
		t.Fatalf("applied configmap: %v %v", cm, err)
	}
}

// TestStopLeavesNoProcess starts a second pair and checks both processes are
// gone after Stop.
func TestStopLeavesNoProcess(t *testing.T) {
	Shared(t) // skip or fail like the others when the binaries are missing
	s, err := Start(Options{RBAC: true})
	if err != nil {
		t.Fatal(err)
	}
	var pids []int
	for _, p := range s.procs {
		pids = append(pids, p.Process.Pid)
	}
	dir := s.Dir
	s.Stop()
	s.Stop() // safe twice
	for _, pid := range pids {
		if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
			t.Errorf("pid %d still exists after Stop (kill 0: %v)", pid, err)
		}
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Errorf("%s still exists after Stop", dir)
	}
}
