package bootstrap

import (
	"context"
	"encoding/base64"
	"os"
	"slices"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"

	"github.com/kvmesh/kvmesh/internal/kubetest"
)

func TestMain(m *testing.M) { os.Exit(kubetest.Main(m, kubetest.Options{})) }

func TestEnsureCreatesOnceAndNeverOverwrites(t *testing.T) {
	srv := kubetest.Shared(t)
	cs, err := kubernetes.NewForConfig(srv.Config)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home, engines := srv.Namespace(t), srv.Namespace(t) // fresh each run (-count)
	// An operator brought their own admin password.
	if _, err := cs.CoreV1().Secrets(home).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: NATSSecret},
		Data: map[string][]byte{"admin-password": []byte("mine")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := Ensure(ctx, cs, home, []string{engines})
	if err != nil {
		t.Fatal(err)
	}
	// 3 NATS keys (not admin) + gossip key + 2 copies in "engines".
	if len(res.Created) != 6 {
		t.Fatalf("created %v, want 6 entries", res.Created)
	}
	get := func(ns, name string) map[string][]byte {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return s.Data
	}
	nats := get(home, NATSSecret)
	if string(nats["admin-password"]) != "mine" {
		t.Fatalf("the operator's admin password was overwritten: %q", nats["admin-password"])
	}
	for _, k := range natsKeys {
		if k != "admin-password" && len(nats[k]) < 16 {
			t.Fatalf("%s: %q is not a generated password", k, nats[k])
		}
	}
	if nats["sidecar-password"] == nil || string(nats["sidecar-password"]) == string(nats["ingress-password"]) {
		t.Fatal("roles share a password")
	}
	key, err := base64.StdEncoding.DecodeString(string(get(home, GossipSecret)["key"]))
	if err != nil || len(key) != 32 {
		t.Fatalf("gossip key: %d bytes, %v; want 32 (AES-256)", len(key), err)
	}
	eng := get(engines, NATSSecret)
	if string(eng["sidecar-password"]) != string(nats["sidecar-password"]) || eng["ingress-password"] != nil || eng["admin-password"] != nil {
		t.Fatalf("the engines' namespace got %v: want only the sidecar's password, the same value", keysOf(eng))
	}
	// A rerun changes nothing.
	res, err = Ensure(ctx, cs, home, []string{engines})
	if err != nil || len(res.Created) != 0 {
		t.Fatalf("rerun created %v (err %v)", res.Created, err)
	}
	if string(get(home, NATSSecret)["sidecar-password"]) != string(nats["sidecar-password"]) {
		t.Fatal("a rerun rotated a password")
	}
}

func keysOf(m map[string][]byte) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

// TestCopiesFollowTheSource: after the install's Secrets change (a gossip key
// or NATS password rotated, a reinstall with the operator's own values), a
// rerun sets bootstrap's copies in an engine namespace to the new values and
// says so (Updated); a differing copy bootstrap did not make (no managed-by
// label) is left as it is and reported (Mismatched). Before, every existing
// copy was skipped and the rerun said nothing changed (k8s tester 3).
func TestCopiesFollowTheSource(t *testing.T) {
	srv := kubetest.Shared(t)
	cs := kubernetes.NewForConfigOrDie(srv.Config)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	home, managed, foreign := srv.Namespace(t), srv.Namespace(t), srv.Namespace(t)
	// The foreign namespace's operator made the gossip copy by hand.
	if _, err := cs.CoreV1().Secrets(foreign).Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: GossipSecret},
		Data: map[string][]byte{"key": []byte("handmade")}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	res, err := Ensure(ctx, cs, home, []string{managed, foreign})
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{foreign + "/" + GossipSecret + "[key]"}; !slices.Equal(res.Mismatched, want) || len(res.Updated) != 0 {
		t.Fatalf("first run: mismatched %v updated %v, want mismatched %v", res.Mismatched, res.Updated, want)
	}
	get := func(ns, name, key string) string {
		s, err := cs.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		return string(s.Data[key])
	}
	// Rotation in the install's namespace.
	for name, kv := range map[string][2]string{NATSSecret: {"sidecar-password", "new-password"}, GossipSecret: {"key", "NEWKEY,OLDKEY"}} {
		s, err := cs.CoreV1().Secrets(home).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s.Data[kv[0]] = []byte(kv[1])
		if _, err := cs.CoreV1().Secrets(home).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	res, err = Ensure(ctx, cs, home, []string{managed, foreign})
	if err != nil {
		t.Fatal(err)
	}
	// foreign's NATS copy is the first run's (labelled): it follows too.
	wantUpdated := []string{managed + "/" + NATSSecret + "[sidecar-password]", managed + "/" + GossipSecret + "[key]", foreign + "/" + NATSSecret + "[sidecar-password]"}
	wantMismatched := []string{foreign + "/" + GossipSecret + "[key]"}
	if !slices.Equal(res.Updated, wantUpdated) || !slices.Equal(res.Mismatched, wantMismatched) || len(res.Created) != 0 {
		t.Fatalf("after the rotation: created %v updated %v mismatched %v; want updated %v mismatched %v", res.Created, res.Updated, res.Mismatched, wantUpdated, wantMismatched)
	}
	if get(managed, NATSSecret, "sidecar-password") != "new-password" || get(managed, GossipSecret, "key") != "NEWKEY,OLDKEY" {
		t.Fatal("bootstrap's copies keep the old values")
	}
	if get(foreign, GossipSecret, "key") != "handmade" || get(foreign, NATSSecret, "sidecar-password") != "new-password" {
		t.Fatal("a copy bootstrap did not make was overwritten, or one it made keeps the old value")
	}
	// In line now: a rerun changes nothing.
	if res, err = Ensure(ctx, cs, home, []string{managed}); err != nil || len(res.Created)+len(res.Updated)+len(res.Mismatched) != 0 {
		t.Fatalf("rerun: %+v, %v", res, err)
	}
}
