package gossip

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// records keeps every slog record at or above its level.
type records struct {
	level slog.Level
	mu    sync.Mutex
	recs  []slog.Record
}

func (r *records) Enabled(_ context.Context, l slog.Level) bool { return l >= r.level }
func (r *records) Handle(_ context.Context, rec slog.Record) error {
	r.mu.Lock()
	r.recs = append(r.recs, rec.Clone())
	r.mu.Unlock()
	return nil
}
func (r *records) WithAttrs([]slog.Attr) slog.Handler { return r }
func (r *records) WithGroup(string) slog.Handler      { return r }

func (r *records) find(level slog.Level, substr string) (slog.Record, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rec := range r.recs {
		if rec.Level == level && strings.Contains(rec.Message, substr) {
			return rec, true
		}
	}
	return slog.Record{}, false
}

func (r *records) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.recs)
}

func TestMemberlistLinesLevelsAndRateLimit(t *testing.T) {
	h := &records{level: slog.LevelDebug}
	now := time.Unix(1000, 0)
	w := &mlLog{log: slog.New(h), now: func() time.Time { return now }, kinds: map[string]*mlKind{}}
	l := func(s string) { _, _ = w.Write([]byte(s + "\n")) }

	l("[DEBUG] memberlist: Stream connection from=127.0.0.1:1")
	l("[INFO] memberlist: Suspect n1 has failed, no acks received")
	l("[ERR] memberlist: failed to receive: remote state is encrypted and encryption is not configured from=127.0.0.1:58004")
	l("[WARN] memberlist: Was able to connect to n2 over TCP but UDP probes failed, network may be misconfigured")
	if _, ok := h.find(slog.LevelDebug, "Stream connection"); !ok {
		t.Error("[DEBUG] line not at debug")
	}
	if _, ok := h.find(slog.LevelDebug, "Suspect n1"); !ok {
		t.Error("[INFO] line not at debug")
	}
	if rec, ok := h.find(slog.LevelWarn, "failed to receive: remote state is encrypted"); !ok || strings.HasPrefix(rec.Message, "[") {
		t.Errorf("[ERR] line not at warn, prefix stripped: %v %q", ok, rec.Message)
	}
	if _, ok := h.find(slog.LevelWarn, "UDP probes failed"); !ok {
		t.Error("[WARN] line not at warn")
	}

	// Repeats of a kind within a minute are suppressed, then counted.
	before := h.count()
	for i := range 10 {
		l(fmt.Sprintf("[ERR] memberlist: Push/Pull with epp1 failed: dial tcp 10.0.0.%d:7946: i/o timeout", i))
		now = now.Add(time.Second)
	}
	if got := h.count() - before; got != 1 {
		t.Fatalf("%d records for 10 repeats within a minute, want 1", got)
	}
	now = now.Add(time.Minute)
	l("[ERR] memberlist: Push/Pull with epp1 failed: again")
	h.mu.Lock()
	last := h.recs[len(h.recs)-1]
	h.mu.Unlock()
	var suppressed int64
	last.Attrs(func(a slog.Attr) bool {
		if a.Key == "suppressed" {
			suppressed = a.Value.Int64()
		}
		return true
	})
	if last.Message != "Push/Pull with epp1 failed: again" || suppressed != 9 {
		t.Fatalf("after a minute: %q suppressed=%d, want the line with 9 suppressed", last.Message, suppressed)
	}

	// Kinds are bounded: past the cap, new kinds share one limit.
	before = h.count()
	for i := range 3 * maxMLKinds {
		l(fmt.Sprintf("[WARN] memberlist: kind-%c%c thing", 'a'+i%26, 'a'+i/26))
	}
	if len(w.kinds) > maxMLKinds+1 {
		t.Fatalf("%d kinds kept", len(w.kinds))
	}
	if got := h.count() - before; got > maxMLKinds+1 {
		t.Fatalf("%d records for %d distinct kinds", got, 3*maxMLKinds)
	}
}

// F12: at the default level a gossip key mismatch shows on the receiving
// side (memberlist logs it as [ERR]).
func TestKeyMismatchLoggedAtWarn(t *testing.T) {
	h := &records{level: slog.LevelInfo}
	c := testConfig("plain", RoleIngress, nil)
	c.Logger = slog.New(h)
	a := start(t, c)
	x := start(t, testConfig("keyed", RoleSidecar, []byte("0123456789abcdef")))
	_, _ = x.Join([]string{a.Addr()})
	testutil.WaitFor(t, 10*time.Second, "a warning about the encrypted message", func() bool {
		_, ok := h.find(slog.LevelWarn, "encrypt")
		return ok
	})
}

// Kinds quiet for a period are forgotten once the table is full: after 64
// members' push/pull failures (one kind each), a key mismatch still gets
// its own line instead of sharing one a minute with everything else.
func TestMemberlistKindsForgotten(t *testing.T) {
	h := &records{level: slog.LevelDebug}
	now := time.Unix(1000, 0)
	w := &mlLog{log: slog.New(h), now: func() time.Time { return now }, kinds: map[string]*mlKind{}}
	l := func(s string) { _, _ = w.Write([]byte(s + "\n")) }
	for i := range maxMLKinds {
		l(fmt.Sprintf("[ERR] memberlist: Push/Pull with member-%c%c failed: dial tcp: connection refused", 'a'+i/26, 'a'+i%26))
	}
	now = now.Add(2 * mlLogEvery)
	l("[ERR] memberlist: failed to receive: No installed keys could decrypt the message from=127.0.0.1:1")
	l("[ERR] memberlist: Push/Pull with member-zz failed: dial tcp: connection refused")
	if _, ok := h.find(slog.LevelWarn, "No installed keys could decrypt"); !ok {
		t.Fatal("a new kind after a full table of quiet ones was not logged")
	}
	if _, ok := h.find(slog.LevelWarn, "member-zz"); !ok {
		t.Fatal("a second new kind was folded into the first")
	}
}

// A member restarted under its old name refutes, while it starts, the
// dead (or suspect) state its previous run left behind, and a stopping
// node's sends and reads fail on its own closed sockets: both were logged
// at warn on every rolling restart. They are now info and debug; the same
// lines outside those moments, and a refuted alive message (another
// process with this name), stay at warn.
func TestMemberlistRestartNoiseBelowWarn(t *testing.T) {
	h := &records{level: slog.LevelDebug}
	start := time.Unix(1000, 0)
	now := start
	stopped := make(chan struct{})
	w := &mlLog{log: slog.New(h), now: func() time.Time { return now }, started: start, stopped: stopped, kinds: map[string]*mlKind{}}
	l := func(s string) { _, _ = w.Write([]byte(s + "\n")) }
	level := func(substr string) slog.Level {
		t.Helper()
		h.mu.Lock()
		defer h.mu.Unlock()
		for i := len(h.recs) - 1; i >= 0; i-- {
			if strings.Contains(h.recs[i].Message, substr) {
				return h.recs[i].Level
			}
		}
		t.Fatalf("no record of %q", substr)
		return 0
	}
	// Texts as memberlist v0.7.0 writes them (state.go: the refutations,
	// gossip sends and push/pulls failing on a closed socket).
	const (
		dead    = "[WARN] memberlist: Refuting a dead message (from: ingress-2)"
		suspect = "[WARN] memberlist: Refuting a suspect message (from: ingress-3)"
		alive   = "[WARN] memberlist: Refuting an alive message for 'sidecar-1' (10.0.0.9:7946) meta:([1] VS [2]), vsn:([1 5 2 0 0 0] VS [1 5 2 0 0 0])"
		closed  = "[ERR] memberlist: Failed to send gossip to 10.0.0.2:7946: write udp [::]:7946->10.0.0.2:7946: use of closed network connection"
		closed2 = "[ERR] memberlist: Push/Pull with ingress-2 failed: read tcp 10.0.0.1:40000->10.0.0.2:7946: use of closed network connection"
	)

	now = start.Add(2 * time.Second)
	l(dead)
	if got := level("Refuting a dead message"); got != slog.LevelInfo {
		t.Errorf("dead message refuted at start logged at %v, want INFO", got)
	}
	l(suspect)
	if got := level("Refuting a suspect message"); got != slog.LevelInfo {
		t.Errorf("suspect message refuted at start logged at %v, want INFO", got)
	}
	l(alive)
	if got := level("Refuting an alive message"); got != slog.LevelWarn {
		t.Errorf("alive message refuted logged at %v, want WARN (a duplicate name)", got)
	}
	l(closed)
	if got := level("Failed to send gossip"); got != slog.LevelWarn {
		t.Errorf("closed connection while running logged at %v, want WARN", got)
	}

	// Past the grace, a refutation means this running member was declared
	// dead: warn, though a refutation at info was logged seconds before.
	now = start.Add(mlRefuteGrace + time.Second)
	l(dead)
	if got := level("Refuting a dead message"); got != slog.LevelWarn {
		t.Errorf("dead message refuted while running logged at %v, want WARN", got)
	}

	close(stopped)
	l(closed2)
	if got := level("Push/Pull with ingress-2 failed"); got != slog.LevelDebug {
		t.Errorf("closed connection while stopping logged at %v, want DEBUG", got)
	}
	l("[ERR] memberlist: Failed fallback TCP ping: dial tcp 10.0.0.4:7946: operation was canceled")
	if got := level("Failed fallback TCP ping"); got != slog.LevelDebug {
		t.Errorf("dial cancelled while stopping logged at %v, want DEBUG", got)
	}
	l("[ERR] memberlist: Push/Pull with ingress-3 failed: dial tcp 10.0.0.3:7946: connect: connection refused")
	if got := level("Push/Pull with ingress-3 failed"); got != slog.LevelWarn {
		t.Errorf("another failure while stopping logged at %v, want WARN", got)
	}
}

// A member restarted under its old name (a rolling restart with a fixed
// --id): the new run refutes the dead state the old one left (it left the
// cluster), and logs that at info, not warn.
func TestRestartUnderSameNameRefutesAtInfo(t *testing.T) {
	a := start(t, testConfig("ingress-1", RoleIngress, nil))
	old := start(t, testConfig("sidecar-1", RoleSidecar, nil, a.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return a.NumMembers() == 2 && old.NumMembers() == 2 })
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}
	testutil.WaitFor(t, 10*time.Second, "the old run gone", func() bool { return a.NumMembers() == 1 })

	h := &records{level: slog.LevelDebug}
	c := testConfig("sidecar-1", RoleSidecar, nil, a.Addr())
	c.Logger = slog.New(h)
	again := start(t, c)
	testutil.WaitFor(t, 10*time.Second, "the dead message refuted", func() bool {
		_, info := h.find(slog.LevelInfo, "Refuting a dead message")
		_, warn := h.find(slog.LevelWarn, "Refuting a dead message")
		return info || warn
	})
	if rec, ok := h.find(slog.LevelWarn, "Refuting a dead message"); ok {
		t.Fatalf("refutation at restart logged at warn: %q", rec.Message)
	}
	testutil.WaitFor(t, 10*time.Second, "2 members again", func() bool { return a.NumMembers() == 2 && again.NumMembers() == 2 })
}
