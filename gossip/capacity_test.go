package gossip

import (
	"encoding/json"
	"errors"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"

	"github.com/kvmesh/kvmesh/kvevents"
)

// An engine state as a sidecar that predates GPUBlocks encodes it
// (recorded from its encodeEntry): no "gpub" key.
const oldEngineEntry = `{"o":"sidecar-a","k":1,"n":"a","v":42,"g":7,"e":{"id":"a","model":"m","url":"http://10.0.0.1:8000","bs":16,"run":2,"wait":1,"kv":0.5,"ready":true,"dig":{"Head":{"Epoch":9,"Seq":3},"Digests":[{"Count":4,"Sum":5,"Xor":6},{"Count":0,"Sum":0,"Xor":0},{"Count":0,"Sum":0,"Xor":0}]}},"ag":1000}`

// prevEngineState is EngineState as members that predate GPUBlocks have
// it, the fields an older ingress decodes into.
type prevEngineState struct {
	ID            string                `json:"id"`
	Model         string                `json:"model"`
	URL           string                `json:"url,omitempty"`
	EngineRole    string                `json:"erole,omitempty"`
	DPSize        int                   `json:"dps,omitempty"`
	BlockSize     int                   `json:"bs,omitempty"`
	Running       int                   `json:"run"`
	Waiting       int                   `json:"wait"`
	KVUsage       float64               `json:"kv"`
	QueuedPrefill int64                 `json:"qpf,omitempty"`
	Ready         bool                  `json:"ready,omitempty"`
	Group         string                `json:"grp,omitempty"`
	PDProtocol    string                `json:"pdp,omitempty"`
	Bootstrap     string                `json:"boot,omitempty"`
	LoRAs         string                `json:"lora,omitempty"`
	MaxModelLen   int                   `json:"mml,omitempty"`
	Root          string                `json:"root,omitempty"`
	Digest        kvevents.EngineDigest `json:"dig"`
}

type prevEntry struct {
	Origin  string           `json:"o"`
	Kind    uint8            `json:"k"`
	Name    string           `json:"n,omitempty"`
	Version int64            `json:"v"`
	Gen     uint64           `json:"g,omitempty"`
	Engine  *prevEngineState `json:"e,omitempty"`
	Age     int64            `json:"ag,omitempty"`
}

// GPUBlocks (the engine's KV capacity) rides in the engine state both ways
// between members that know it and members that predate it: an older
// sidecar's state decodes with 0 (unknown: the terms sized by it stay
// off), and an older member decodes a new state (encoding/json ignores the
// key it does not know), the rest of the state intact.
func TestEngineStateGPUBlocksCompat(t *testing.T) {
	// Old sidecar → new member.
	e, err := decodeEntry(append([]byte{wireEntry}, oldEngineEntry...))
	if err != nil {
		t.Fatal(err)
	}
	if e.Engine.GPUBlocks != 0 || e.Engine.BlockSize != 16 || e.Engine.KVUsage != 0.5 || !e.Engine.Ready || e.Engine.Digest.Digests[0].Count != 4 {
		t.Fatalf("old state decoded as %+v", *e.Engine)
	}
	// Unknown capacity is not sent: a new sidecar's state without one is
	// byte for byte an old one's.
	now := time.Now()
	e.received(now)
	again, err := encodeEntry(e.stamped(now))
	if err != nil {
		t.Fatal(err)
	}
	if string(again[1:]) != oldEngineEntry {
		t.Fatalf("capacity 0 encoded as\n%s\nnot as an older sidecar does\n%s", again[1:], oldEngineEntry)
	}

	// New sidecar → new member, by broadcast and by push/pull.
	st := EngineState{ID: "a", Model: "m", URL: "http://10.0.0.1:8000", BlockSize: 16, Running: 2, KVUsage: 0.5, Ready: true, GPUBlocks: 4096}
	b, err := encodeEntry(&entry{Origin: "sidecar-a", Kind: kindEngine, Name: "a", Version: 43, Engine: &st})
	if err != nil {
		t.Fatal(err)
	}
	if e, err := decodeEntry(b); err != nil || *e.Engine != st {
		t.Fatalf("new state: %+v, %v; want %+v", e, err, st)
	}
	full, err := encodeState([]*entry{{Origin: "sidecar-a", Kind: kindEngine, Name: "a", Version: 43, Engine: &st}})
	if err != nil {
		t.Fatal(err)
	}
	if es, bad, err := decodeState(full); err != nil || bad != 0 || len(es) != 1 || es[0].Engine.GPUBlocks != 4096 {
		t.Fatalf("new full state: %v bad %d, %v", es, bad, err)
	}

	// New sidecar → old member: its decoder takes the new state.
	var old prevEntry
	if err := json.Unmarshal(b[1:], &old); err != nil {
		t.Fatalf("an older member rejects the new state: %v", err)
	}
	if old.Engine == nil || old.Engine.ID != "a" || old.Engine.BlockSize != 16 || old.Engine.KVUsage != 0.5 || !old.Engine.Ready || old.Version != 43 {
		t.Fatalf("an older member decodes the new state as %+v", old.Engine)
	}

	// A negative capacity is malformed.
	bad := strings.Replace(oldEngineEntry, `"bs":16,`, `"bs":16,"gpub":-1,`, 1)
	if _, err := decodeEntry(append([]byte{wireEntry}, bad...)); !errors.Is(err, errMalformed) {
		t.Fatalf("negative capacity: %v", err)
	}
}

// The capacity costs a broadcast at most its key and 10 digits: a usual
// engine state with the largest still fits a gossip packet, encrypted.
func TestEngineStateWithCapacityFitsBroadcast(t *testing.T) {
	st := EngineState{ID: "vllm-decode-7f9c8d6b5-abcde", Model: "meta-llama/Llama-3.1-70B-Instruct", URL: "http://10.123.45.67:8000",
		EngineRole: "decode", DPSize: 8, BlockSize: 16, Running: 1000, Waiting: 1000, KVUsage: 0.123456789, QueuedPrefill: math.MaxInt32,
		Ready: true, Group: "pool-a", MaxModelLen: 131072, Root: "/models/meta-llama/Llama-3.1-70B-Instruct", GPUBlocks: math.MaxInt32}
	st.Digest.Head = kvevents.Head{Epoch: math.MaxUint64, Seq: math.MaxUint64}
	for i := range st.Digest.Digests {
		st.Digest.Digests[i] = kvevents.Digest{Count: 1 << 40, Sum: math.MaxUint64, Xor: math.MaxUint64}
	}
	b, err := encodeEntry(&entry{Origin: "sidecar-vllm-decode-7f9c8d6b5-abcde", Kind: kindEngine, Name: st.ID, Version: math.MaxInt64,
		Gen: math.MaxUint64, Engine: &st, Age: math.MaxInt64})
	if err != nil {
		t.Fatal(err)
	}
	lan := memberlist.DefaultLANConfig()
	if max := maxBroadcastBytes(lan, true); len(b) > max {
		t.Fatalf("engine state of %d bytes, a broadcast carries %d: %s", len(b), max, b)
	}
}
