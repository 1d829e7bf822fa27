package gossip

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// A running cluster rotates its key without a partition: install the new key
// everywhere, use it, drop the old one. Afterwards a member with only the new
// key joins, and one with only the old key cannot.
func TestKeyRotation(t *testing.T) {
	k1, k2 := []byte("0123456789abcdef"), []byte("fedcba9876543210")
	a := start(t, testConfig("a", RoleIngress, k1))
	b := start(t, testConfig("b", RoleSidecar, k1, a.Addr()))
	testutil.WaitFor(t, 10*time.Second, "a and b to meet", func() bool { return a.NumMembers() == 2 && b.NumMembers() == 2 })
	for _, n := range []*Node{a, b} {
		if err := n.InstallKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*Node{a, b} {
		if err := n.UseKey(k2); err != nil {
			t.Fatal(err)
		}
	}
	for _, n := range []*Node{a, b} {
		if err := n.RemoveKey(k1); err != nil {
			t.Fatal(err)
		}
	}
	c := start(t, testConfig("c", RoleIngress, k2, a.Addr()))
	testutil.WaitFor(t, 10*time.Second, "c (new key only) to join", func() bool {
		return a.NumMembers() == 3 && b.NumMembers() == 3 && c.NumMembers() == 3
	})
	old := testConfig("old", RoleIngress, k1)
	d := start(t, old)
	if _, err := d.Join([]string{a.Addr()}); err == nil {
		t.Fatal("a member with only the retired key joined")
	}

	// A node started with the old key as an extra key talks to both.
	e := testConfig("e", RoleSidecar, k2, a.Addr())
	e.ExtraKeys = [][]byte{k1}
	start(t, e)
	testutil.WaitFor(t, 10*time.Second, "e to join", func() bool { return a.NumMembers() == 4 })

	plain := start(t, testConfig("plain", RoleIngress, nil))
	if err := plain.InstallKey(k2); !errors.Is(err, ErrNoEncryption) {
		t.Fatalf("InstallKey without encryption: %v", err)
	}
	bad := testConfig("bad", RoleIngress, nil)
	bad.ExtraKeys = [][]byte{[]byte("short")}
	if err := bad.Validate(); err == nil {
		t.Fatal("extra keys without a secret key and of a bad length accepted")
	}
}

// A New that fails to listen leaves no metrics behind: a retry on the same
// registry succeeds.
func TestFailedNewUnregistersMetrics(t *testing.T) {
	reg := prometheus.NewRegistry()
	ln, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	c := testConfig("m", RoleIngress, nil)
	c.BindAddr, c.BindPort = "127.0.0.1", ln.LocalAddr().(*net.UDPAddr).Port
	c.Registerer = reg
	if n, err := New(c); err == nil {
		n.Close()
		t.Fatal("New listened on a taken UDP port")
	}
	c.BindPort = 0
	n, err := New(c)
	if err != nil {
		t.Fatalf("retry on the same registry: %v", err)
	}
	n.Close()
}
