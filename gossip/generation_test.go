package gossip

import (
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// behind is a version source d behind this host's clock: a process
// restarted on a host whose clock is behind its predecessor's.
func behind(d time.Duration) func() int64 {
	return func() int64 { return time.Now().Add(-d).UnixNano() }
}

// restartAt starts c as a new process of the member that listened at addr
// (same name, same address: a container restarted in its pod, faster than
// failure detection), joining seed.
func restartAt(t *testing.T, c Config, addr, seed string) *Node {
	t.Helper()
	c.BindAddr, c.BindPort = addrParts(t, addr)
	c.Join = []string{seed}
	return start(t, c)
}

// waitEngine waits until every observer shows engine id with want's
// running count and readiness, gossiped by member.
func waitEngine(t *testing.T, observers []*Node, id, member string, running int, ready bool) {
	t.Helper()
	for _, o := range observers {
		testutil.WaitFor(t, 20*time.Second, fmt.Sprintf("%s to show %s running=%d ready=%v", o.Name(), id, running, ready), func() bool {
			v, ok := o.Engine(id)
			return ok && v.Node == member && v.Running == running && v.Ready == ready
		})
	}
}

// Finding 1 of the NATS/skew test: a sidecar restarted under its fixed name
// on a clock behind its predecessor's (10 minutes here) was ignored by every
// member: its entries' versions, its wall clock, were below the dead
// process's, which every member kept showing (ready, the old load) for as
// long as the engine stayed idle. The new process's generation in its
// metadata replaces the old one's entries whatever the clocks.
func TestRestartOnClockBehindIsShown(t *testing.T) {
	in1 := start(t, testConfig("ingress-1", RoleIngress, nil))
	in2 := start(t, testConfig("ingress-2", RoleIngress, nil, in1.Addr()))
	sc := start(t, testConfig("sidecar-1", RoleSidecar, nil, in1.Addr()))
	testutil.WaitFor(t, 10*time.Second, "3 members everywhere", func() bool {
		return in1.NumMembers() == 3 && in2.NumMembers() == 3 && sc.NumMembers() == 3
	})
	sc.SetEngine(EngineState{ID: "e1", Model: "m", Running: 1, Ready: true})
	obs := []*Node{in1, in2}
	waitEngine(t, obs, "e1", "sidecar-1", 1, true)

	addr := sc.Addr()
	sc.Shutdown() // a crash: no leave, and back before failure detection
	c := testConfig("sidecar-1", RoleSidecar, nil)
	c.versionNow = behind(10 * time.Minute)
	back := restartAt(t, c, addr, in2.Addr())
	back.SetEngine(EngineState{ID: "e1", Model: "m", Running: 7, Ready: false})
	waitEngine(t, obs, "e1", "sidecar-1", 7, false)

	// Its later states win too (versions within one generation), and the
	// predecessor's entries do not come back through anyone's push/pull.
	back.SetEngine(EngineState{ID: "e1", Model: "m", Running: 2, Ready: true})
	waitEngine(t, obs, "e1", "sidecar-1", 2, true)
}

// Rolling upgrades and roll-backs mix members that predate generations
// (their metadata and entries carry none) with newer ones: an older
// member's state is still shown, and a restart across the two versions
// under one name, on a clock behind, replaces the predecessor's state
// either way at the newer members.
func TestGenerationMixedVersions(t *testing.T) {
	in := start(t, testConfig("ingress-1", RoleIngress, nil))
	oldIn := testConfig("ingress-old", RoleIngress, nil, in.Addr())
	oldIn.noGeneration = true
	inOld := start(t, oldIn)
	obs := []*Node{in}

	older := testConfig("sidecar-1", RoleSidecar, nil, in.Addr())
	older.noGeneration = true
	sc := start(t, older)
	testutil.WaitFor(t, 10*time.Second, "3 members everywhere", func() bool {
		return in.NumMembers() == 3 && inOld.NumMembers() == 3 && sc.NumMembers() == 3
	})
	if g := in.Members()["sidecar-1"].Gen; g != 0 {
		t.Fatalf("an older member advertises generation %x", g)
	}
	sc.SetEngine(EngineState{ID: "e1", Model: "m", Running: 1, Ready: true})
	// An older member's in-flight entry (no generation) is summed too.
	inOld.SetInFlight(map[string]int{"e1": 4})
	waitEngine(t, obs, "e1", "sidecar-1", 1, true)
	testutil.WaitFor(t, 10*time.Second, "the older ingress's in-flight", func() bool { return in.InFlight()["e1"] == 4 })

	// Upgraded: the newer process advertises a generation, on a clock behind.
	addr := sc.Addr()
	sc.Shutdown()
	newer := testConfig("sidecar-1", RoleSidecar, nil)
	newer.versionNow = behind(10 * time.Minute)
	up := restartAt(t, newer, addr, in.Addr())
	up.SetEngine(EngineState{ID: "e1", Model: "m", Running: 7})
	waitEngine(t, obs, "e1", "sidecar-1", 7, false)
	if g := in.Members()["sidecar-1"].Gen; g == 0 {
		t.Fatal("the upgraded member advertises no generation")
	}

	// Rolled back: an older process again, on a clock further behind.
	addr = up.Addr()
	up.Shutdown()
	older.versionNow = behind(20 * time.Minute)
	down := restartAt(t, older, addr, in.Addr())
	down.SetEngine(EngineState{ID: "e1", Model: "m", Running: 3, Ready: true})
	waitEngine(t, obs, "e1", "sidecar-1", 3, true)
}

// metaNode is a member as memberlist hands it to the event delegate.
func metaNode(t *testing.T, name string, meta NodeMeta) *memberlist.Node {
	t.Helper()
	b, err := encodeMeta(meta)
	if err != nil {
		t.Fatal(err)
	}
	return &memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: b}
}

// The merge rule, step by step, without a network: which generation's
// entries are shown, held, adopted and dropped as a member's metadata
// changes, malformed metadata included.
func TestGenerationMergeRule(t *testing.T) {
	n := start(t, testConfig("obs", RoleIngress, nil))
	d := delegate{n}
	var mu sync.Mutex
	var apps []string
	n.OnAppState(func(node, name string, blob []byte) {
		mu.Lock()
		apps = append(apps, node+"/"+name+"="+string(blob))
		mu.Unlock()
	})
	eng := func(gen uint64, v int64, running int) *entry {
		return &entry{Origin: "m", Kind: kindEngine, Name: "e", Version: v, Gen: gen, Engine: &EngineState{ID: "e", Running: running}}
	}
	running := func() int {
		v, ok := n.Engine("e")
		if !ok {
			return -1
		}
		return v.Running
	}
	merge := func(e *entry) {
		b, err := encodeEntry(e)
		if err != nil {
			t.Fatal(err)
		}
		d.NotifyMsg(b)
	}

	// An older member: no generation in its metadata nor its entries.
	d.NotifyJoin(metaNode(t, "m", NodeMeta{Role: RoleSidecar}))
	merge(eng(0, 100, 1))
	if got := running(); got != 1 {
		t.Fatalf("an older member's entry: running %d, want 1", got)
	}
	// Its successor's entry comes before its metadata: held, not shown.
	merge(eng(5, 50, 2))
	merge(&entry{Origin: "m", Kind: kindApp, Name: "x", Version: 51, Gen: 5, App: []byte("new")})
	if got := running(); got != 1 {
		t.Fatalf("an entry of a generation not advertised yet is shown: running %d", got)
	}
	// The metadata advertises generation 5: the held entries come in
	// (their versions below the predecessor's), the older one's go.
	d.NotifyUpdate(metaNode(t, "m", NodeMeta{Role: RoleSidecar, Gen: 5}))
	if got := running(); got != 2 {
		t.Fatalf("after the new generation's metadata: running %d, want 2", got)
	}
	mu.Lock()
	if len(apps) != 1 || apps[0] != "m/x=new" {
		t.Fatalf("app callbacks %q, want the adopted entry's", apps)
	}
	mu.Unlock()
	if got := n.m.restarts.Load(); got != 1 {
		t.Fatalf("restarts = %d, want 1", got)
	}
	// A copy without generation (forwarded by an older member) or of an
	// older version within the generation is ignored.
	merge(eng(0, 1000, 9))
	merge(eng(5, 40, 9))
	if got := running(); got != 2 {
		t.Fatalf("running %d, want 2", got)
	}
	merge(eng(5, 60, 3))
	if got := running(); got != 3 {
		t.Fatalf("a newer version of the generation: running %d, want 3", got)
	}

	// Restarted again, on a clock far behind: generation 9 replaces 5, and
	// 5's entries still travelling are dropped, never held.
	d.NotifyUpdate(metaNode(t, "m", NodeMeta{Role: RoleSidecar, Gen: 9}))
	if got := running(); got != -1 {
		t.Fatalf("the predecessor's engine still shown (running %d)", got)
	}
	merge(eng(5, 70, 8))
	if _, held := n.pending[entryKey{"m", kindEngine, "e"}]; held {
		t.Fatal("an entry of the retired generation is held")
	}
	merge(eng(9, 1, 4))
	if got := running(); got != 4 {
		t.Fatalf("the new generation's entry: running %d, want 4", got)
	}

	// The same metadata again (a refreshed alive message) changes nothing.
	d.NotifyUpdate(metaNode(t, "m", NodeMeta{Role: RoleSidecar, Gen: 9}))
	if got := running(); got != 4 || n.m.restarts.Load() != 2 {
		t.Fatalf("running %d, restarts %d; want 4, 2", got, n.m.restarts.Load())
	}

	// Malformed metadata is counted; the member's entries are then ordered
	// by version alone, as before generations.
	bad := n.m.malformed.Load()
	d.NotifyUpdate(&memberlist.Node{Name: "m", Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: []byte(`{"g":-1}`)})
	if n.m.malformed.Load() != bad+1 {
		t.Fatal("malformed metadata not counted")
	}
	merge(eng(7, 2, 5))
	if got := running(); got != 5 {
		t.Fatalf("under malformed metadata: running %d, want 5", got)
	}

	// Gone: nothing of it is held.
	merge(&entry{Origin: "m", Kind: kindInFlight, Version: 3, Gen: 11})
	d.NotifyUpdate(metaNode(t, "m", NodeMeta{Role: RoleSidecar, Gen: 12}))
	merge(&entry{Origin: "m", Kind: kindInFlight, Version: 3, Gen: 13})
	d.NotifyLeave(&memberlist.Node{Name: "m"})
	n.mu.Lock()
	defer n.mu.Unlock()
	if len(n.pending) != 0 || len(n.gens) != 1 { // gens: this node's own
		t.Fatalf("after the member left: %d held, %d generations", len(n.pending), len(n.gens))
	}
}

// Wire compatibility both ways: metadata and entries without a generation
// (older members) decode as generation 0, and an older member's decoder
// (no such field) reads the newer ones. CheckMeta leaves room for the
// generation New adds.
func TestGenerationWireCompatible(t *testing.T) {
	m, err := decodeMeta([]byte(`{"role":"sidecar","id":"a","ep":3}`))
	if err != nil || m.Gen != 0 || m.ID != "a" {
		t.Fatalf("older metadata: %+v, %v", m, err)
	}
	e, err := decodeEntry(append([]byte{wireEntry}, `{"o":"a","k":2,"v":1,"i":{"e":1}}`...))
	if err != nil || e.Gen != 0 {
		t.Fatalf("older entry: %+v, %v", e, err)
	}
	// NodeMeta and entry as they were before generations.
	type oldMeta struct {
		Role  string `json:"role"`
		ID    string `json:"id"`
		Epoch uint64 `json:"ep,omitempty"`
	}
	type oldEntry struct {
		Origin  string `json:"o"`
		Kind    uint8  `json:"k"`
		Version int64  `json:"v"`
	}
	b, _ := encodeMeta(NodeMeta{Role: RoleSidecar, ID: "a", Gen: 1<<64 - 1})
	var om oldMeta
	if err := json.Unmarshal(b, &om); err != nil || om.ID != "a" {
		t.Fatalf("an older member reads %s as %+v, %v", b, om, err)
	}
	b, _ = encodeEntry(&entry{Origin: "a", Kind: kindInFlight, Version: 7, Gen: 1<<64 - 1})
	var oe oldEntry
	if err := json.Unmarshal(b[1:], &oe); err != nil || oe.Version != 7 {
		t.Fatalf("an older member reads %s as %+v, %v", b, oe, err)
	}

	// Metadata that fitted only without a generation is refused at start,
	// naming the limit, rather than dropped by memberlist later.
	fit := NodeMeta{Role: RoleSidecar, ID: "a"}
	b, _ = encodeMeta(fit)
	fit.Model = strings.Repeat("m", MetaLimit-len(b)-len(`,"model":""`))
	if b, _ := encodeMeta(fit); len(b) != MetaLimit {
		t.Fatalf("test metadata of %d bytes, want %d", len(b), MetaLimit)
	}
	if err := CheckMeta(fit); err == nil {
		t.Fatal("metadata with no room for the generation accepted")
	}
}

// FuzzMemberGeneration: whatever metadata a member advertises and whatever
// entries arrive, nothing panics, malformed metadata is counted, and once
// well-formed metadata advertises a generation the view holds that
// member's entries of that generation only.
func FuzzMemberGeneration(f *testing.F) {
	e1, _ := encodeEntry(&entry{Origin: "peer", Kind: kindEngine, Name: "e", Version: 3, Gen: 5, Engine: &EngineState{ID: "e"}})
	e0, _ := encodeEntry(&entry{Origin: "peer", Kind: kindInFlight, Version: 4, InFlight: map[string]int{"e": 2}})
	f.Add([]byte(`{"role":"sidecar","g":5}`), e1, e0)
	f.Add([]byte(`{"role":"sidecar"}`), e0, e1)
	f.Add([]byte(`{"g":"x"}`), e1, e1)
	f.Add([]byte(`{"g":18446744073709551616}`), e0, e1)
	f.Add([]byte{}, []byte{wireEntry}, []byte(nil))
	c := testConfig("fuzz", RoleIngress, nil)
	c.Logger = slog.New(slog.DiscardHandler) // a join and a leave per input
	n, err := New(c)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(n.Shutdown)
	d := delegate{n}
	f.Fuzz(func(t *testing.T, meta, a, b []byte) {
		d.NotifyMsg(a) // before the member is known: ignored
		bad := n.m.malformed.Load()
		d.NotifyJoin(&memberlist.Node{Name: "peer", Addr: net.IPv4(127, 0, 0, 1), Port: 1, Meta: meta})
		m, merr := decodeMeta(meta)
		if merr != nil && n.m.malformed.Load() == bad {
			t.Fatalf("malformed metadata %q not counted", meta)
		}
		d.NotifyMsg(a)
		d.NotifyMsg(b)
		if merr == nil {
			n.mu.Lock()
			for k, e := range n.entries {
				if k.origin == "peer" && e.Gen != m.Gen {
					n.mu.Unlock()
					t.Fatalf("entry of generation %x shown under metadata advertising %x", e.Gen, m.Gen)
				}
			}
			n.mu.Unlock()
		}
		d.NotifyLeave(&memberlist.Node{Name: "peer"})
		n.mu.Lock()
		defer n.mu.Unlock()
		for k := range n.entries {
			if k.origin == "peer" {
				t.Fatal("a member's entries outlived it")
			}
		}
		if len(n.pending) != 0 {
			t.Fatalf("%d entries held after the member left", len(n.pending))
		}
	})
}

// EngineView.Age is told without comparing clocks: a sidecar 10 minutes
// behind and one 10 minutes ahead of the observers date their states
// (Updated) that far off, yet each observer, the one that got the state
// forwarded by push/pull when it joined included, gives its real age. Before,
// only Updated was there: `kvmesh get engines` showed 0s for the one ahead and
// 10 minutes for the one behind (finding 6 of the NATS/skew test).
func TestEngineAgeWithoutClocks(t *testing.T) {
	in := start(t, testConfig("ingress-1", RoleIngress, nil))
	skewed := map[string]time.Duration{"behind": -10 * time.Minute, "ahead": 10 * time.Minute}
	set := map[string]time.Time{}
	for id, d := range skewed {
		c := testConfig("sidecar-"+id, RoleSidecar, nil, in.Addr())
		c.versionNow = func() int64 { return time.Now().Add(d).UnixNano() }
		sc := start(t, c)
		testutil.WaitFor(t, 10*time.Second, sc.Name()+" joined", func() bool { return sc.NumMembers() >= 2 })
		set[id] = time.Now()
		sc.SetEngine(EngineState{ID: id, Model: "m"})
	}
	testutil.WaitFor(t, 10*time.Second, "the ingress sees both engines", func() bool { return len(in.Engines()) == 2 })
	// Joins after: the states reach it forwarded by push/pull.
	late := start(t, testConfig("ingress-late", RoleIngress, nil, in.Addr()))
	testutil.WaitFor(t, 10*time.Second, "the late ingress sees both engines", func() bool { return len(late.Engines()) == 2 })
	for _, o := range []*Node{in, late} {
		for _, v := range o.Engines() {
			real := time.Since(set[v.ID]) // read after the view: its Age cannot be larger
			if v.Age < 0 || v.Age > real || v.Age < real-5*time.Second {
				t.Errorf("%s: engine %s's age %v, want within 5s below its real age %v", o.Name(), v.ID, v.Age, real)
			}
			if off := time.Since(v.Updated) - real; off.Abs() < 9*time.Minute {
				t.Errorf("%s: engine %s dated %v off; the test's skew did not apply", o.Name(), v.ID, off)
			}
		}
	}
	// A state whose sidecar predates ages (Age not carried) says so.
	if v, ok := in.Engine("behind"); !ok || v.Age < 0 {
		t.Fatalf("Engine: %+v, %v", v, ok)
	}
	in.merge([]*entry{{Origin: "sidecar-behind", Kind: kindEngine, Name: "behind", Version: 1 << 62, Gen: in.gensOf("sidecar-behind"),
		Engine: &EngineState{ID: "behind", Model: "m"}}})
	if v, _ := in.Engine("behind"); v.Age >= 0 {
		t.Fatalf("an entry without age: Age %v, want negative (unknown)", v.Age)
	}
}

// gensOf is the generation n holds for member name.
func (n *Node) gensOf(name string) uint64 {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.gens[name].gen
}

// Two sidecars gossip one engine id (one moved to another node while the
// old one drains, or two given one id); the old one's host clock is 10
// minutes ahead. The state set last, told by the entries' ages, wins over
// the one whose version (its host's wall clock) is larger: an ingress
// showed the old sidecar's running=1 ready=false, 5 s old, over the new
// one's running=9 ready=true, 3 s old (tester h-clock). Without an age,
// versions still decide.
func TestEngineOfTwoSidecarsFollowsAgeNotClocks(t *testing.T) {
	n := start(t, testConfig("obs", RoleIngress, nil))
	d := delegate{n}
	now := time.Now()
	send := func(origin string, version int64, age time.Duration, running int, ready bool) {
		t.Helper()
		b, err := encodeEntry(&entry{Origin: origin, Kind: kindEngine, Name: "e1", Version: version, Gen: 1, Age: int64(age),
			Engine: &EngineState{ID: "e1", Model: "m", Running: running, Ready: ready}})
		if err != nil {
			t.Fatal(err)
		}
		d.NotifyMsg(b)
	}
	for _, m := range []string{"sidecar-old", "sidecar-new"} {
		d.NotifyJoin(metaNode(t, m, NodeMeta{Role: RoleSidecar, Gen: 1}))
	}
	check := func(what, node string, running int) {
		t.Helper()
		v, ok := n.Engine("e1")
		if !ok || v.Node != node || v.Running != running {
			t.Fatalf("%s: Engine(e1) = %s running=%d (%v), want %s running=%d", what, v.Node, v.Running, ok, node, running)
		}
		if vs := n.Engines(); len(vs) != 1 || vs[0].Node != node || vs[0].Running != running {
			t.Fatalf("%s: Engines() = %+v, want %s running=%d", what, vs, node, running)
		}
	}

	send("sidecar-old", now.Add(10*time.Minute-5*time.Second).UnixNano(), 5*time.Second, 1, false)
	send("sidecar-new", now.Add(-3*time.Second).UnixNano(), 3*time.Second, 9, true)
	check("the old sidecar's clock 10 min ahead", "sidecar-new", 9)

	// The old sidecar sets its state again: now it is the younger.
	send("sidecar-old", now.Add(10*time.Minute).UnixNano(), time.Millisecond, 2, true)
	check("the old sidecar's newer state", "sidecar-old", 2)

	// A state without age (a member that predates ages): versions decide.
	send("sidecar-new", now.Add(time.Hour).UnixNano(), 0, 7, true)
	check("no age, the larger version", "sidecar-new", 7)
}
