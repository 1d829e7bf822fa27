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
