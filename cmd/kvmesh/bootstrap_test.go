package main

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestBootstrapReportsStaleCopies: after a rotation in the install's
// namespace, `kvmesh bootstrap --engine-namespaces` prints each copy of its
// own it updated, and exits non-zero naming a differing copy it did not
// make (left as it is). Before, it printed "nothing changed" and exited 0
// while the engines' sidecars kept the old password and key (k8s tester 3).
func TestBootstrapReportsStaleCopies(t *testing.T) {
	s := kubetest.StartT(t, kubetest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cs := kubernetes.NewForConfigOrDie(s.Config)
	for _, ns := range []string{"kvmesh", "team-a", "team-b"} {
		if _, err := cs.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	run := func(engines string) (string, error) {
		var out, errOut testutil.SyncBuffer
		err := runBootstrap(ctx, []string{"--kubeconfig", s.Kubeconfig, "--namespace", "kvmesh", "--engine-namespaces", engines}, &out, &errOut)
		return out.String(), err
	}
	if out, err := run("team-a"); err != nil || !strings.Contains(out, "created team-a/kvmesh-gossip[key]") {
		t.Fatalf("first run: %v\n%s", err, out)
	}
	// team-b's operator made its NATS copy by hand.
	if _, err := cs.CoreV1().Secrets("team-b").Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "kvmesh-nats"},
		Data: map[string][]byte{"sidecar-password": []byte("handmade")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	g, err := cs.CoreV1().Secrets("kvmesh").Get(ctx, "kvmesh-gossip", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	g.Data["key"] = []byte("NEW," + string(g.Data["key"]))
	if _, err := cs.CoreV1().Secrets("kvmesh").Update(ctx, g, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	out, err := run("team-a")
	if err != nil || !strings.Contains(out, "updated team-a/kvmesh-gossip[key]") || strings.Contains(out, "nothing changed") {
		t.Fatalf("after the rotation: %v\n%s", err, out)
	}
	out, err = run("team-a,team-b")
	if err == nil || !strings.Contains(err.Error(), "team-b/kvmesh-nats[sidecar-password]") || !strings.Contains(err.Error(), "app.kubernetes.io/managed-by=kvmesh-bootstrap") {
		t.Fatalf("a differing copy not bootstrap's: err %v, want it named\n%s", err, out)
	}
	if !strings.Contains(out, "created team-b/kvmesh-gossip[key]") {
		t.Errorf("the rest of team-b was not copied:\n%s", out)
	}
	if out, err := run("team-a"); err != nil || !strings.Contains(out, "nothing changed") {
		t.Fatalf("rerun: %v\n%s", err, out)
	}
}
