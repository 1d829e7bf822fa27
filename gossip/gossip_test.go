package gossip

import (
	"bytes"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
	"github.com/kvmesh/kvmesh/kvevents"
)

func testConfig(name, role string, key []byte, join ...string) Config {
	c := DefaultConfig()
	c.Name = name
	c.Profile = "local"
	c.BroadcastInterval = 50 * time.Millisecond
	c.PushPullInterval = 500 * time.Millisecond
	c.RejoinInterval = 200 * time.Millisecond
	c.SecretKey = key
	c.Meta = NodeMeta{Role: role, ID: name}
	c.Join = join
	return c
}

func start(t *testing.T, c Config) *Node {
	t.Helper()
	n, err := New(c)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = n.Close() })
	return n
}

func TestStatePropagatesAndDeadSidecarDisappears(t *testing.T) {
	key := []byte("0123456789abcdef")
	in1 := start(t, testConfig("ingress-1", RoleIngress, key))
	in2 := start(t, testConfig("ingress-2", RoleIngress, key, in1.Addr()))
	sc := start(t, testConfig("sidecar-1", RoleSidecar, key, in1.Addr()))
	testutil.WaitFor(t, 10*time.Second, "3 members everywhere", func() bool {
		return in1.NumMembers() == 3 && in2.NumMembers() == 3 && sc.NumMembers() == 3
	})
	if m := in2.Members()["sidecar-1"]; m.Role != RoleSidecar || m.ID != "sidecar-1" {
		t.Fatalf("sidecar metadata seen by ingress-2: %+v", m)
	}

	var dig kvevents.EngineDigest
	dig.Head = kvevents.Head{Epoch: 7, Seq: 42}
	dig.Digests[kvevents.TierGPU].Add(99)
	sc.SetEngine(EngineState{ID: "e1", Model: "m", Running: 3, Waiting: 1, KVUsage: 0.5, Digest: dig})
	in1.SetInFlight(map[string]int{"e1": 2})
	in2.SetInFlight(map[string]int{"e1": 5, "e2": 1})

	var mu sync.Mutex
	got := map[string]string{}
	in2.OnAppState(func(node, name string, blob []byte) {
		mu.Lock()
		got[node+"/"+name] = string(blob)
		mu.Unlock()
	})
	if err := in1.SetAppState("ratelimit", []byte("v1")); err != nil {
		t.Fatal(err)
	}

	for _, n := range []*Node{in1, in2} {
		testutil.WaitFor(t, 5*time.Second, n.Name()+" sees e1", func() bool {
			v, ok := n.Engine("e1")
			return ok && v.Running == 3 && v.Digest == dig && v.Node == "sidecar-1"
		})
		testutil.WaitFor(t, 5*time.Second, n.Name()+" sums in-flight", func() bool {
			f := n.InFlight()
			return f["e1"] == 7 && f["e2"] == 1
		})
	}
	testutil.WaitFor(t, 5*time.Second, "app state delivered", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return got["ingress-1/ratelimit"] == "v1"
	})
	if h, ok := in2.EngineHead("e1"); !ok || h.Head.Seq != 42 {
		t.Fatalf("EngineHead = %+v %v", h, ok)
	}

	// Newer state replaces older.
	sc.SetEngine(EngineState{ID: "e1", Model: "m", Running: 9, Digest: dig})
	testutil.WaitFor(t, 5*time.Second, "update", func() bool { v, _ := in1.Engine("e1"); return v.Running == 9 })

	// A crash (no leave): failure detection removes the engine everywhere.
	left := make(chan string, 4)
	in1.OnLeave(func(node string) { left <- node })
	killed := time.Now()
	sc.Shutdown()
	for _, n := range []*Node{in1, in2} {
		testutil.WaitFor(t, 15*time.Second, n.Name()+" drops e1", func() bool { _, ok := n.Engine("e1"); return !ok })
	}
	t.Logf("dead sidecar's engine gone everywhere %v after the crash", time.Since(killed).Round(10*time.Millisecond))
	if node := <-left; node != "sidecar-1" {
		t.Fatalf("OnLeave(%q)", node)
	}
	// In-flight of the alive ingresses is still there.
	if f := in1.InFlight(); f["e1"] != 7 {
		t.Fatalf("in-flight after sidecar death: %v", f)
	}
}

func TestGracefulLeaveRemovesAtOnce(t *testing.T) {
	a := start(t, testConfig("a", RoleIngress, nil))
	// Join by DNS name (memberlist resolves it; a headless Service works the same).
	_, port, _ := net.SplitHostPort(a.Addr())
	b := start(t, testConfig("b", RoleSidecar, nil, net.JoinHostPort("localhost", port)))
	b.SetEngine(EngineState{ID: "eb", Model: "m"})
	testutil.WaitFor(t, 5*time.Second, "a sees eb", func() bool { _, ok := a.Engine("eb"); return ok })
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Close(); err != nil { // idempotent
		t.Fatal(err)
	}
	b.Shutdown()
	testutil.WaitFor(t, 15*time.Second, "a drops eb", func() bool { _, ok := a.Engine("eb"); return !ok })
}

func TestWrongKeyCannotJoin(t *testing.T) {
	a := start(t, testConfig("a", RoleIngress, []byte("0123456789abcdef")))
	c := testConfig("intruder", RoleSidecar, []byte("fedcba9876543210"))
	c.Join = nil
	x := start(t, c)
	if _, err := x.Join([]string{a.Addr()}); err == nil {
		t.Fatal("a member with the wrong key joined")
	}
	plain := start(t, testConfig("plain", RoleSidecar, nil))
	if _, err := plain.Join([]string{a.Addr()}); err == nil {
		t.Fatal("an unencrypted member joined an encrypted cluster")
	}
	if a.NumMembers() != 1 || x.NumMembers() != 1 {
		t.Fatalf("members: a=%d intruder=%d", a.NumMembers(), x.NumMembers())
	}
}

func TestMalformedGossipCountedAndSkipped(t *testing.T) {
	a := start(t, testConfig("a", RoleIngress, nil))
	d := delegate{a}
	d.NotifyMsg([]byte{0xff, 0x00})
	d.NotifyMsg(append([]byte{wireEntry}, `{"o":"x","k":1,"n":"e","v":1}`...)) // engine entry without engine
	d.MergeRemoteState([]byte("garbage"), false)
	good, _ := encodeEntry(&entry{Origin: "a2", Kind: kindInFlight, Version: 1, InFlight: map[string]int{"e": 1}})
	state := append([]byte{wireState}, `[{"o":"","k":1},`...)
	state = append(state, good[1:]...)
	state = append(state, ']')
	d.MergeRemoteState(state, false)
	if got := a.m.malformed.Load(); got != 4 {
		t.Fatalf("malformed = %d, want 4", got)
	}
	// The well-formed entry of the state was considered (ignored: origin a2 is not a member).
	if got := a.m.ignored.Load(); got != 1 {
		t.Fatalf("ignored = %d, want 1", got)
	}
}

func TestValidateListsEveryProblem(t *testing.T) {
	c := DefaultConfig()
	c.SecretKey = []byte("short")
	c.Profile = "moon"
	c.BindPort = 70000
	c.BroadcastInterval = 0
	c.Meta.Role = "chef"
	c.Meta.Model = strings.Repeat("x", 600)
	err := c.Validate()
	if !errors.Is(err, ErrConfig) {
		t.Fatal(err)
	}
	for _, want := range []string{"secret key", "profile", "bind port", "broadcast interval", "role", "gossip metadata of", "model 600 bytes"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("missing %q in %v", want, err)
		}
	}
}

func FuzzDecodeGossip(f *testing.F) {
	e, _ := encodeEntry(&entry{Origin: "n", Kind: kindEngine, Name: "e", Version: 3, Engine: &EngineState{ID: "e", KVUsage: 0.3}})
	s, _ := encodeState([]*entry{{Origin: "n", Kind: kindApp, Name: "x", App: []byte{1}}})
	pdE, _ := encodeEntry(&entry{Origin: "n", Kind: kindEngine, Name: "p", Version: 4, Engine: &EngineState{ID: "p", Group: "g0", PDProtocol: PDProtocolSGLang, Bootstrap: "10.0.0.1:8998"}})
	pdL, _ := encodeEntry(&entry{Origin: "i", Kind: kindInFlight, Version: 5, InFlight: map[string]int{"p": 2}, Prefill: map[string]PrefillLoad{"p": {Legs: 2, Queued: 3}}})
	f.Add(e)
	f.Add(s)
	f.Add(pdE)
	f.Add(pdL)
	f.Add(append([]byte{wireEntry}, `{"o":"i","k":2,"v":1,"pf":{"p":{"l":-1}}}`...))
	f.Add([]byte(`{"role":"sidecar"}`))
	f.Add([]byte(`{"role":"sidecar","g":18446744073709551615}`))
	genE, _ := encodeEntry(&entry{Origin: "n", Kind: kindInFlight, Version: 6, Gen: 1 << 63, InFlight: map[string]int{"e": 1}})
	f.Add(genE)
	capE, _ := encodeEntry(&entry{Origin: "n", Kind: kindEngine, Name: "c", Version: 7, Engine: &EngineState{ID: "c", BlockSize: 16, GPUBlocks: 4096}})
	f.Add(capE)
	f.Add(append([]byte{wireEntry}, `{"o":"n","k":1,"n":"c","v":8,"e":{"id":"c","gpub":-1,"dig":{}}}`...))
	f.Fuzz(func(t *testing.T, b []byte) {
		if e, err := decodeEntry(b); err == nil {
			again, err := encodeEntry(e)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := decodeEntry(again); err != nil {
				t.Fatalf("re-encoded entry rejected: %v", err)
			}
		}
		_, _, _ = decodeState(b)
		_, _ = decodeMeta(b)
		if bytes.HasPrefix(b, []byte{wireState}) {
			_, _, _ = decodeState(b[1:])
		}
	})
}

// FuzzJoinLoRAs: whatever adapter names an engine lists, the sidecar's
// LoRAs field passes the receivers' check and splits back into sorted,
// distinct names it was given.
func FuzzJoinLoRAs(f *testing.F) {
	f.Add("sql-lora\x00chat-lora\x00sql-lora")
	f.Add("a,b\x00\x00" + strings.Repeat("x", 300))
	f.Fuzz(func(t *testing.T, s string) {
		names := strings.Split(s, "\x00")
		st := EngineState{ID: "e", Model: "m", LoRAs: JoinLoRAs(names)}
		e := entry{Origin: "n", Kind: kindEngine, Name: "e", Engine: &st}
		if err := e.check(); err != nil {
			t.Fatalf("JoinLoRAs(%q) = %q: %v", names, st.LoRAs, err)
		}
		got := st.Adapters()
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Fatalf("adapters %q not sorted and distinct", got)
		}
		for _, a := range got {
			if !slices.Contains(names, a) {
				t.Fatalf("adapter %q was not given", a)
			}
		}
	})
}

// A seed that restarts with no seeds of its own (the first sidecar, started
// without --join) is alone; the members that joined through it are not, and
// still find it again: they join the seeds at which no member listens.
func TestRestartedSeedIsJoinedAgain(t *testing.T) {
	seed := start(t, testConfig("seed", RoleSidecar, nil))
	addr := seed.Addr()
	a := start(t, testConfig("a", RoleIngress, nil, addr))
	b := start(t, testConfig("b", RoleSidecar, nil, addr))
	testutil.WaitFor(t, 10*time.Second, "3 members everywhere", func() bool {
		return seed.NumMembers() == 3 && a.NumMembers() == 3 && b.NumMembers() == 3
	})
	seed.Shutdown() // a crash: no leave message
	testutil.WaitFor(t, 15*time.Second, "the seed declared gone", func() bool { return a.NumMembers() == 2 && b.NumMembers() == 2 })

	c := testConfig("seed", RoleSidecar, nil)
	c.BindAddr, c.BindPort = addrParts(t, addr)
	back := start(t, c)
	back.SetEngine(EngineState{ID: "e-seed", Model: "m"})
	testutil.WaitFor(t, 15*time.Second, "the restarted seed a member again", func() bool {
		_, ok := a.Engine("e-seed")
		return ok && back.NumMembers() == 3 && b.NumMembers() == 3
	})
}

func addrParts(t *testing.T, addr string) (string, int) {
	t.Helper()
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		t.Fatal(err)
	}
	return host, p
}

// TestNameTaken: a member started under the name of a live member is
// refused at New (memberlist ignores its claims about itself, but the state
// it gossiped under that name would live as long as the first member), the
// first member keeps working, and a member refused on a later join
// publishes nothing. Once the first member is dead, its name may be taken
// from another address.
func TestNameTaken(t *testing.T) {
	first := start(t, testConfig("dup", RoleSidecar, nil))
	first.SetEngine(EngineState{ID: "e1", Model: "m"})
	obs := start(t, testConfig("observer", RoleIngress, nil, first.Addr()))
	testutil.WaitFor(t, 10*time.Second, "2 members", func() bool { return first.NumMembers() == 2 && obs.NumMembers() == 2 })

	if n, err := New(testConfig("dup", RoleSidecar, nil, obs.Addr())); !errors.Is(err, ErrNameTaken) {
		if err == nil {
			n.Shutdown()
		}
		t.Fatalf("New with a live member's name: %v, want ErrNameTaken", err)
	}
	// The newcomer's push/pull carried its claim to the observer.
	testutil.WaitFor(t, 10*time.Second, "the observer to count the conflict", func() bool { return obs.m.conflicts.Load() > 0 })
	if first.taken.Load() != nil {
		t.Fatalf("the first member was refused (taken by %s)", *first.taken.Load())
	}

	// Alone first, then a join finds the name taken: refused, it stops and
	// publishes nothing more; Close does not leave in the other's name.
	late := start(t, testConfig("dup", RoleSidecar, nil))
	late.SetEngine(EngineState{ID: "e4", Model: "m"})
	if _, err := late.Join([]string{obs.Addr()}); !errors.Is(err, ErrNameTaken) {
		t.Fatalf("late join: %v, want ErrNameTaken", err)
	}
	late.flush(true)
	if q := late.queue.NumQueued(); q != 0 {
		t.Fatalf("a refused node queued %d broadcasts", q)
	}
	if err := late.Close(); err != nil {
		t.Fatalf("closing a refused node: %v", err)
	}
	if _, ok := obs.Members()["dup"]; !ok || first.NumMembers() != 2 {
		t.Fatalf("the first member lost its place: observer members %v, first sees %d", obs.Members(), first.NumMembers())
	}

	// The first member dies: its name is free for another address.
	first.Shutdown()
	testutil.WaitFor(t, 20*time.Second, "the observer to see the first member dead", func() bool { return obs.NumMembers() == 1 })
	again := start(t, testConfig("dup", RoleSidecar, nil, obs.Addr()))
	again.SetEngine(EngineState{ID: "e5", Model: "m"})
	testutil.WaitFor(t, 10*time.Second, "the observer to see the new member's engine", func() bool {
		_, ok := obs.Engine("e5")
		return ok && obs.NumMembers() == 2
	})
}

func TestLoRAsLeftOut(t *testing.T) {
	many := make([]string, MaxLoRAs+6)
	for i := range many {
		many[i] = fmt.Sprintf("a%03d", i)
	}
	for _, tc := range []struct {
		name  string
		names []string
		want  int
	}{
		{"none", nil, 0},
		{"all fit", []string{"b", "a", "b"}, 0},
		{"invalid", []string{"", "x,y", strings.Repeat("n", MaxLoRAName+1), "ok"}, 3},
		{"beyond the bound", many, 6},
		{"beyond, duplicates not counted", append(many, many[:10]...), 6},
	} {
		if got := LoRAsLeftOut(tc.names); got != tc.want {
			t.Errorf("%s: %d left out, want %d", tc.name, got, tc.want)
		}
		if kept := len((&EngineState{LoRAs: JoinLoRAs(tc.names)}).Adapters()); kept+tc.want+dups(tc.names) != len(tc.names) {
			t.Errorf("%s: %d kept + %d left out + duplicates ≠ %d names", tc.name, kept, tc.want, len(tc.names))
		}
	}
}

// dups counts the repeated valid names in names.
func dups(names []string) int {
	seen, n := map[string]bool{}, 0
	for _, s := range names {
		if validLoRA(s) {
			if seen[s] {
				n++
			}
			seen[s] = true
		}
	}
	return n
}
