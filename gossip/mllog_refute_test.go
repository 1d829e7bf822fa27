package gossip

import (
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// refuteAliveLine is memberlist v0.7.0's line (state.go, aliveNode) for a
// refuted alive message: theirs is the refuted message's metadata, ours
// this node's.
func refuteAliveLine(t *testing.T, theirs, ours NodeMeta) string {
	t.Helper()
	a, err := encodeMeta(theirs)
	if err != nil {
		t.Fatal(err)
	}
	b, err := encodeMeta(ours)
	if err != nil {
		t.Fatal(err)
	}
	versions := []uint8{1, 5, 2, 0, 0, 0}
	return fmt.Sprintf("[WARN] memberlist: Refuting an alive message for '%s' (%v:%d) meta:(%v VS %v), vsn:(%v VS %v)",
		ours.ID, net.IP{127, 0, 0, 1}, 7946, a, b, versions, versions)
}

// A member killed and restarted under its fixed name meets its previous
// run's alive message, which it refutes: that is the restart, logged at
// info within the start grace with the metadata as JSON text (it was
// decimal bytes). Another member's metadata under this name, or the same
// refutation after the grace, stays at warn (black-box report, finding 4).
func TestRefutedAliveOfPreviousRunAtInfo(t *testing.T) {
	h := &records{level: slog.LevelDebug}
	start := time.Unix(1000, 0)
	now := start.Add(2 * time.Second)
	w := &mlLog{log: slog.New(h), now: func() time.Time { return now }, started: start, kinds: map[string]*mlKind{}}
	l := func(s string) slog.Record {
		t.Helper()
		_, _ = w.Write([]byte(s + "\n"))
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.recs[len(h.recs)-1]
	}
	ours := NodeMeta{Role: RoleSidecar, ID: "sidecar-1", Model: "m", Gen: 22}
	prev := ours
	prev.Gen = 11

	rec := l(refuteAliveLine(t, prev, ours))
	want := `meta:({"role":"sidecar","id":"sidecar-1","model":"m","g":11} VS {"role":"sidecar","id":"sidecar-1","model":"m","g":22}), vsn:([1 5 2 0 0 0] VS [1 5 2 0 0 0]) (previous incarnation)`
	if rec.Level != slog.LevelInfo || !strings.HasPrefix(rec.Message, "Refuting an alive message for 'sidecar-1' (127.0.0.1:7946) ") ||
		!strings.HasSuffix(rec.Message, want) {
		t.Fatalf("previous run's alive message refuted at start: %v %q", rec.Level, rec.Message)
	}

	other := NodeMeta{Role: RoleIngress, ID: "ingress-9", Gen: 33} // another member's name clash
	rec = l(refuteAliveLine(t, other, ours))
	if rec.Level != slog.LevelWarn || strings.Contains(rec.Message, "previous incarnation") ||
		!strings.Contains(rec.Message, `meta:({"role":"ingress","id":"ingress-9","g":33} VS `) {
		t.Fatalf("another member's alive message refuted: %v %q", rec.Level, rec.Message)
	}

	now = start.Add(mlRefuteGrace + time.Second) // still refuting: a live process with this name
	rec = l(refuteAliveLine(t, prev, ours))
	if rec.Level != slog.LevelWarn {
		t.Fatalf("previous run's alive message refuted past the grace: %v %q", rec.Level, rec.Message)
	}
}

// The same with real memberlist on loopback: a sidecar member killed (no
// leave) and restarted at once on its address under its name.
func TestKilledMemberRestartRefutesAliveAtInfo(t *testing.T) {
	a := start(t, testConfig("ingress-1", RoleIngress, nil))
	old := start(t, testConfig("sidecar-1", RoleSidecar, nil, a.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return a.NumMembers() == 2 && old.NumMembers() == 2 })
	_, port, err := net.SplitHostPort(old.Addr())
	if err != nil {
		t.Fatal(err)
	}
	old.Shutdown() // killed: the others still hold it alive

	h := &records{level: slog.LevelDebug}
	c := testConfig("sidecar-1", RoleSidecar, nil, a.Addr())
	c.BindPort, _ = strconv.Atoi(port)
	c.Logger = slog.New(h)
	again := start(t, c)
	testutil.WaitFor(t, 10*time.Second, "the previous run's alive message refuted", func() bool {
		_, ok := h.find(slog.LevelInfo, "Refuting an alive message")
		_, warn := h.find(slog.LevelWarn, "Refuting an alive message")
		return ok || warn
	})
	if rec, ok := h.find(slog.LevelWarn, "Refuting an alive message"); ok {
		t.Fatalf("the previous run's alive message refuted at warn: %q", rec.Message)
	}
	rec, _ := h.find(slog.LevelInfo, "Refuting an alive message")
	if !strings.Contains(rec.Message, `{"role":"sidecar","id":"sidecar-1"`) || !strings.HasSuffix(rec.Message, "(previous incarnation)") {
		t.Fatalf("refutation line: %q", rec.Message)
	}
	testutil.WaitFor(t, 10*time.Second, "2 members again", func() bool { return a.NumMembers() == 2 && again.NumMembers() == 2 })
}
