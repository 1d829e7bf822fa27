package gossip

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// directRelay hands each relayed entry to the node in to (a transport that
// delivers at once; MergeRelayed never waits, so the contract holds).
type directRelay struct {
	from string
	to   atomic.Pointer[Node]
	sent atomic.Int64
}

func (r *directRelay) Relay(member, _ string, msg []byte) {
	if member != r.from {
		panic("relayed as " + member)
	}
	r.sent.Add(1)
	if n := r.to.Load(); n != nil {
		_, _ = n.MergeRelayed(r.from, msg)
	}
}

// manyLoRAs makes an engine state too large for a broadcast packet (F1).
func manyLoRAs() string {
	names := make([]string, 40)
	for i := range names {
		names[i] = fmt.Sprintf("customer-adapter-finetune-v2-%03d", i)
	}
	return JoinLoRAs(names)
}

// Gossip cannot carry the new load here: push/pull runs once an hour and
// the entry is too large for a broadcast packet. The relay carries it.
func TestRelayCarriesWhatGossipCannot(t *testing.T) {
	relay := &directRelay{from: "sidecar-1"}
	ic := testConfig("ingress-1", RoleIngress, nil)
	ic.PushPullInterval = time.Hour
	in := start(t, ic)
	sc := testConfig("sidecar-1", RoleSidecar, nil, in.Addr())
	sc.PushPullInterval = time.Hour
	sc.Relay = relay
	s := start(t, sc)
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && s.NumMembers() == 2 })
	relay.to.Store(in)

	loras := manyLoRAs()
	for _, running := range []int{3, 9} {
		s.SetEngine(EngineState{ID: "e1", Model: "m", LoRAs: loras, Running: running})
		testutil.WaitFor(t, 5*time.Second, fmt.Sprintf("the ingress sees running=%d", running), func() bool {
			v, ok := in.Engine("e1")
			return ok && v.Running == running && v.LoRAs == loras
		})
	}
	if got := in.m.relayed.Load(); got < 2 {
		t.Fatalf("relay_received = %d, want >= 2", got)
	}
	// F1: the oversize entry is counted, never queued for a broadcast.
	if got := s.m.oversize.Load(); got < 2 {
		t.Fatalf("oversize = %d, want >= 2", got)
	}
	if got := s.queue.NumQueued(); got != 0 {
		t.Fatalf("%d broadcasts queued, want the oversize entry left out", got)
	}
}

// Only changed entries are relayed: not one set again unchanged, nor the
// periodic re-broadcast.
func TestRelayOnlyChangedEntries(t *testing.T) {
	relay := &directRelay{from: "sidecar-1"}
	c := testConfig("sidecar-1", RoleSidecar, nil)
	c.Relay = relay
	s := start(t, c)
	s.SetEngine(EngineState{ID: "e1", Model: "m", Running: 1})
	s.SetEngine(EngineState{ID: "e2", Model: "m"})
	testutil.WaitFor(t, 5*time.Second, "both engines relayed", func() bool { return relay.sent.Load() >= 2 })
	before := relay.sent.Load()
	s.SetEngine(EngineState{ID: "e1", Model: "m", Running: 1}) // set again, unchanged
	for i := 0; i <= 10; i++ {
		s.flush(i == 10) // the loop's own flushes find nothing dirty either
	}
	if got := relay.sent.Load(); got != before {
		t.Fatalf("relay got %d more messages for unchanged entries", got-before)
	}
	if got := s.queue.NumQueued(); got == 0 {
		t.Fatal("the re-broadcast queued nothing") // gossip still re-broadcasts them
	}
}

func TestMergeRelayedRules(t *testing.T) {
	in := start(t, testConfig("ingress-1", RoleIngress, nil))
	sc := start(t, testConfig("sidecar-1", RoleSidecar, nil, in.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && sc.NumMembers() == 2 })

	enc := func(origin string, ver int64, running int) []byte {
		// sc.gen: the generation sidecar-1 advertises (generation.go)
		b, err := encodeEntry(&entry{Origin: origin, Kind: kindEngine, Name: "e1", Version: ver, Gen: sc.gen, Engine: &EngineState{ID: "e1", Model: "m", Running: running}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	running := func() int {
		v, ok := in.Engine("e1")
		if !ok {
			return -1
		}
		return v.Running
	}

	// Malformed input and an origin other than the sender: counted, rejected.
	bad0 := in.m.malformed.Load()
	for _, c := range []struct {
		from string
		msg  []byte
	}{
		{"sidecar-1", nil},
		{"sidecar-1", []byte{0xff, '{'}},
		{"sidecar-1", append([]byte{wireEntry}, `{"o":"sidecar-1","k":1,"n":"e1","v":5}`...)}, // no engine
		{"sidecar-1", append([]byte{wireEntry}, strings.Repeat("[", 10000)...)},
		{"sidecar-1", append([]byte{wireState}, "[]"...)},
		{"someone-else", enc("sidecar-1", 10, 1)},
		{"sidecar-1", enc("sidecar-1", 1<<62, 0)}, // a forged far-future version would freeze sidecar-1's state
	} {
		if ok, err := in.MergeRelayed(c.from, c.msg); ok || err == nil {
			t.Errorf("MergeRelayed(%q, %q) = %v, %v; want rejected", c.from, c.msg, ok, err)
		}
	}
	if got := in.m.malformed.Load() - bad0; got != 6 {
		t.Fatalf("malformed += %d, want 6", got)
	}
	if got := in.m.future.Load(); got != 1 { // the far-future one: TestRelayAheadCountedAndWarned
		t.Fatalf("relay_future = %d, want 1", got)
	}
	if running() != -1 {
		t.Fatal("a rejected entry reached the view")
	}

	// A newer version is merged; an older one (an echo) does not overwrite it.
	if ok, err := in.MergeRelayed("sidecar-1", enc("sidecar-1", 20, 7)); !ok || err != nil {
		t.Fatalf("newer entry: %v, %v", ok, err)
	}
	for _, v := range []int64{20, 19} {
		if ok, err := in.MergeRelayed("sidecar-1", enc("sidecar-1", v, 1)); ok || err != nil {
			t.Fatalf("version %d over 20: %v, %v; want ignored", v, ok, err)
		}
	}
	if got := running(); got != 7 {
		t.Fatalf("running = %d after an older version; want 7", got)
	}
	// The member's own entry is never overwritten by an echo.
	in.SetEngine(EngineState{ID: "own", Model: "m", Running: 4})
	own, _ := encodeEntry(&entry{Origin: "ingress-1", Kind: kindEngine, Name: "own", Version: time.Now().Add(time.Minute).UnixNano(), Engine: &EngineState{ID: "own", Model: "m", Running: 1}})
	if ok, err := in.MergeRelayed("ingress-1", own); ok || err != nil {
		t.Fatalf("own echo: %v, %v; want ignored", ok, err)
	}
	if v, _ := in.Engine("own"); v.Running != 4 {
		t.Fatalf("own entry overwritten: running %d", v.Running)
	}
	// A member not alive (never joined, or gone) is ignored.
	if ok, err := in.MergeRelayed("ghost", enc("ghost", 30, 5)); ok || err != nil {
		t.Fatalf("unknown origin: %v, %v; want ignored", ok, err)
	}
	_ = sc.Close()
	testutil.WaitFor(t, 10*time.Second, "the sidecar gone", func() bool { return in.NumMembers() == 1 })
	if ok, err := in.MergeRelayed("sidecar-1", enc("sidecar-1", 40, 8)); ok || err != nil {
		t.Fatalf("dead origin: %v, %v; want ignored", ok, err)
	}
	if got := running(); got != -1 {
		t.Fatalf("a dead member's entry is in the view (running %d)", got)
	}
}

// FuzzMergeRelayed: whatever a relay delivers, MergeRelayed neither panics
// nor accepts what decodeEntry rejects, and an accepted entry is the view's.
func FuzzMergeRelayed(f *testing.F) {
	good, _ := encodeEntry(&entry{Origin: "peer", Kind: kindEngine, Name: "e", Version: 3, Engine: &EngineState{ID: "e", KVUsage: 0.3}})
	inf, _ := encodeEntry(&entry{Origin: "peer", Kind: kindInFlight, Version: 4, InFlight: map[string]int{"e": 2}})
	f.Add("peer", good)
	f.Add("", inf)
	f.Add("other", good)
	f.Add("peer", []byte{wireEntry, '{', '}'})
	n, err := New(testConfig("fuzz", RoleIngress, nil))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(n.Shutdown)
	n.mu.Lock()
	n.alive["peer"] = NodeMeta{Role: RoleSidecar}
	n.mu.Unlock()
	f.Fuzz(func(t *testing.T, from string, b []byte) {
		ok, err := n.MergeRelayed(from, b)
		e, derr := decodeEntry(b)
		if ok && (err != nil || derr != nil || (from != "" && e.Origin != from)) {
			t.Fatalf("accepted %q from %q: err %v, decode %v", b, from, err, derr)
		}
		if derr == nil && from != "" && e.Origin != from && err == nil {
			t.Fatalf("origin %q relayed as %q's not rejected", e.Origin, from)
		}
	})
}

// An entry relayed with a version more than MaxRelayAhead ahead of this
// clock (its member's clock minutes ahead, or this one's behind) is refused
// with a counter of its own and a warning naming the member and the skew,
// once a minute per member. Before, it was counted as malformed and logged
// at debug: an ingress whose clock was 10 minutes behind refused every
// member's entries with no word.
func TestRelayAheadCountedAndWarned(t *testing.T) {
	var logs testutil.SyncBuffer
	ic := testConfig("ingress-1", RoleIngress, nil)
	ic.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	in := start(t, ic)
	sc := start(t, testConfig("sidecar-1", RoleSidecar, nil, in.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && sc.NumMembers() == 2 })
	ahead := func(d time.Duration) []byte {
		b, err := encodeEntry(&entry{Origin: "sidecar-1", Kind: kindEngine, Name: "e1", Version: time.Now().Add(d).UnixNano(), Gen: sc.gen,
			Engine: &EngineState{ID: "e1", Model: "m", Running: 1}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	bad0 := in.m.malformed.Load()
	for range 3 {
		if ok, err := in.MergeRelayed("sidecar-1", ahead(10*time.Minute)); ok || !errors.Is(err, ErrRelayAhead) {
			t.Fatalf("an entry 10 min ahead: %v, %v; want refused with ErrRelayAhead", ok, err)
		}
	}
	if got := in.m.future.Load(); got != 3 {
		t.Fatalf("relay_future = %d, want 3", got)
	}
	if got := in.m.malformed.Load() - bad0; got != 0 {
		t.Fatalf("malformed += %d for entries that are well formed", got)
	}
	out := logs.String()
	if n := strings.Count(out, "versioned too far ahead"); n != 1 {
		t.Fatalf("%d warnings for 3 refusals within a minute, want 1:\n%s", n, out)
	}
	for _, want := range []string{"level=WARN", "origin=sidecar-1", "max_ahead=5m0s"} {
		if !strings.Contains(out, want) {
			t.Fatalf("warning lacks %q:\n%s", want, out)
		}
	}
	if !strings.Contains(out, " ahead=10m") && !strings.Contains(out, " ahead=9m") { // measured: 10 min less the time since
		t.Fatalf("warning lacks the skew (ahead=~10m):\n%s", out)
	}
	// Within the bound it is merged.
	if ok, err := in.MergeRelayed("sidecar-1", ahead(time.Minute)); !ok || err != nil {
		t.Fatalf("an entry a minute ahead: %v, %v; want merged", ok, err)
	}
}

// A NATS publisher that forges a fresh origin name per far-ahead entry
// drew one warning per name (up to aheadWarnMax a minute); origins that
// are no alive member now share one line a minute, carrying how many went
// unlogged, and every refusal is still counted.
func TestRelayAheadForgedOriginsShareOneWarning(t *testing.T) {
	var logs testutil.SyncBuffer
	c := testConfig("ingress-1", RoleIngress, nil)
	c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	in := start(t, c)
	const forged = 300
	for i := range forged {
		origin := fmt.Sprintf("forged-%d", i)
		b, err := encodeEntry(&entry{Origin: origin, Kind: kindEngine, Name: "e1", Version: time.Now().Add(10 * time.Minute).UnixNano(),
			Engine: &EngineState{ID: "e1", Model: "m"}})
		if err != nil {
			t.Fatal(err)
		}
		if ok, err := in.MergeRelayed(origin, b); ok || !errors.Is(err, ErrRelayAhead) {
			t.Fatalf("forged entry %d: %v, %v; want refused with ErrRelayAhead", i, ok, err)
		}
	}
	if got := in.m.future.Load(); got != forged {
		t.Fatalf("relay_future = %d, want %d (every refusal counted)", got, forged)
	}
	if n := strings.Count(logs.String(), "versioned too far ahead"); n >= forged/2 {
		t.Fatalf("%d warnings for %d forged origins, want about one a minute:\n%.2000s", n, forged, logs.String())
	}

	// The same through a clock of the test's own: one line, then, a
	// minute on, one line counting the rest.
	in.ahead.mu.Lock()
	in.ahead.last = nil
	in.ahead.mu.Unlock()
	before := strings.Count(logs.String(), "versioned too far ahead")
	now := time.Unix(1000, 0)
	for i := range forged {
		in.warnAhead(fmt.Sprintf("forged-%d", i), 10*time.Minute, now)
	}
	if n := strings.Count(logs.String(), "versioned too far ahead") - before; n != 1 {
		t.Fatalf("%d warnings for %d forged origins within a minute, want 1:\n%.2000s", n, forged, logs.String())
	}
	in.warnAhead("forged-last", 10*time.Minute, now.Add(aheadWarnEvery))
	out := logs.String()
	if n := strings.Count(out, "versioned too far ahead") - before; n != 2 {
		t.Fatalf("%d warnings a minute on, want 2:\n%s", n, out)
	}
	for _, want := range []string{"origin=forged-last", "member=false", fmt.Sprintf("suppressed=%d", forged-1)} {
		if !strings.Contains(out, want) {
			t.Fatalf("second warning lacks %q:\n%s", want, out)
		}
	}
	if len(in.ahead.last) != 1 {
		t.Fatalf("%d origins remembered for forged names, want 1 (the shared line)", len(in.ahead.last))
	}
}

// The state lane follows the generation rule as gossip does: an entry
// relayed for a member is shown only of the generation its metadata
// advertises, whatever its version (a dead predecessor's entry, versioned
// by a clock ahead, relayed late, does not come back).
func TestMergeRelayedFollowsGeneration(t *testing.T) {
	in := start(t, testConfig("ingress-1", RoleIngress, nil))
	sc := start(t, testConfig("sidecar-1", RoleSidecar, nil, in.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return in.NumMembers() == 2 && sc.NumMembers() == 2 })
	enc := func(gen uint64, ver int64, running int) []byte {
		b, err := encodeEntry(&entry{Origin: "sidecar-1", Kind: kindEngine, Name: "e1", Version: ver, Gen: gen, Engine: &EngineState{ID: "e1", Model: "m", Running: running}})
		if err != nil {
			t.Fatal(err)
		}
		return b
	}
	now := time.Now().UnixNano()
	if ok, err := in.MergeRelayed("sidecar-1", enc(sc.gen, now, 1)); !ok || err != nil {
		t.Fatalf("an entry of the advertised generation: %v, %v", ok, err)
	}
	for _, gen := range []uint64{0, sc.gen + 1} {
		if ok, err := in.MergeRelayed("sidecar-1", enc(gen, now+int64(time.Minute), 9)); ok || err != nil {
			t.Fatalf("generation %x, newer version: %v, %v; want ignored", gen, ok, err)
		}
	}
	if v, _ := in.Engine("e1"); v.Running != 1 {
		t.Fatalf("running %d, want the advertised generation's 1", v.Running)
	}
}
