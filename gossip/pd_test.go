package gossip

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/internal/testutil"
)

// TestPDStatePropagates: the P/D group, protocol and bootstrap address of
// an engine, and each ingress's prefill legs, reach every member; prefill
// loads are summed over the ingresses.
func TestPDStatePropagates(t *testing.T) {
	in1 := start(t, testConfig("ingress-1", RoleIngress, nil))
	in2 := start(t, testConfig("ingress-2", RoleIngress, nil, in1.Addr()))
	sc := start(t, testConfig("sidecar-1", RoleSidecar, nil, in1.Addr()))
	testutil.WaitFor(t, 10*time.Second, "3 members everywhere", func() bool {
		return in1.NumMembers() == 3 && in2.NumMembers() == 3 && sc.NumMembers() == 3
	})
	sc.SetEngine(EngineState{ID: "p0", Model: "m", EngineRole: "prefill", Group: "llama-0", PDProtocol: PDProtocolSGLang, Bootstrap: "10.0.0.5:8998"})
	in1.SetLoads(map[string]int{"p0": 3}, map[string]PrefillLoad{"p0": {Legs: 3, Queued: 4}})
	in2.SetLoads(map[string]int{"p0": 1}, map[string]PrefillLoad{"p0": {Legs: 1}})
	for _, n := range []*Node{in1, in2} {
		testutil.WaitFor(t, 5*time.Second, n.Name()+" sees p0's P/D fields", func() bool {
			v, ok := n.Engine("p0")
			return ok && v.Group == "llama-0" && v.PDProtocol == PDProtocolSGLang && v.Bootstrap == "10.0.0.5:8998"
		})
		testutil.WaitFor(t, 5*time.Second, n.Name()+" sums prefill loads", func() bool {
			l := n.PrefillLoads()["p0"]
			return l.Legs == 4 && l.Queued == 4 && n.InFlight()["p0"] == 4
		})
	}
	// SetInFlight alone (an ingress without P/D) clears its prefill loads.
	in1.SetInFlight(map[string]int{"p0": 1})
	testutil.WaitFor(t, 5*time.Second, "ingress-2 sees ingress-1's prefill legs gone", func() bool {
		l := in2.PrefillLoads()["p0"]
		return l.Legs == 1 && l.Queued == 0
	})
}

// TestPDEncodingCompatible: the new fields are omitted when empty (members
// that predate them see the same bytes as before), an entry without them
// decodes, and an entry with them decodes in the old shape (unknown
// members are ignored by encoding/json) with its in-flight counts intact.
func TestPDEncodingCompatible(t *testing.T) {
	plain, err := encodeEntry(&entry{Origin: "s", Kind: kindEngine, Name: "e", Version: 1, Engine: &EngineState{ID: "e", Model: "m"}})
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{`"grp"`, `"pdp"`, `"boot"`, `"pf"`} {
		if strings.Contains(string(plain), k) {
			t.Errorf("an engine without P/D fields encodes %s: %s", k, plain)
		}
	}
	old := append([]byte{wireEntry}, `{"o":"i","k":2,"v":7,"i":{"e":2}}`...)
	e, err := decodeEntry(old)
	if err != nil || e.InFlight["e"] != 2 || e.Prefill != nil {
		t.Fatalf("old in-flight entry: %+v, %v", e, err)
	}
	withPD, err := encodeEntry(&entry{Origin: "i", Kind: kindInFlight, Version: 8, InFlight: map[string]int{"e": 2}, Prefill: map[string]PrefillLoad{"e": {Legs: 2, Queued: 1}}})
	if err != nil {
		t.Fatal(err)
	}
	var oldShape struct {
		Origin   string         `json:"o"`
		Kind     uint8          `json:"k"`
		Version  int64          `json:"v"`
		InFlight map[string]int `json:"i,omitempty"`
	}
	if err := json.Unmarshal(withPD[1:], &oldShape); err != nil || oldShape.InFlight["e"] != 2 || oldShape.Kind != kindInFlight {
		t.Fatalf("old decoder on a new entry: %+v, %v", oldShape, err)
	}
	bad := append([]byte{wireEntry}, `{"o":"i","k":2,"v":1,"pf":{"e":{"q":-2}}}`...)
	if _, err := decodeEntry(bad); err == nil {
		t.Fatal("negative prefill queue accepted")
	}
}
