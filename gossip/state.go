package gossip

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// EngineState is what a sidecar gossips about one engine (Contract 3).
type EngineState struct {
	ID         string `json:"id"`
	Model      string `json:"model"`
	URL        string `json:"url,omitempty"`
	EngineRole string `json:"erole,omitempty"`
	DPSize     int    `json:"dps,omitempty"`
	BlockSize  int    `json:"bs,omitempty"`

	Running       int     `json:"run"`
	Waiting       int     `json:"wait"`
	KVUsage       float64 `json:"kv"`              // 0..1
	QueuedPrefill int64   `json:"qpf,omitempty"`   // queued prefill tokens, when the engine exports them
	Ready         bool    `json:"ready,omitempty"` // the sidecar's own readiness (events flowing, metrics scraped)
	// GPUBlocks is the engine's KV capacity in blocks of BlockSize tokens
	// as the engine's metrics report it (vLLM's cache_config_info
	// num_gpu_blocks; SGLang's max_total_num_tokens over the block size);
	// 0 when not reported. Omitted when 0, so members that predate it
	// decode new states, and states of sidecars that predate it decode as 0.
	GPUBlocks int `json:"gpub,omitempty"`

	// P/D (docs/PD.md). Every field is omitted when empty, so members that
	// predate them decode new states and new members decode theirs.

	// Group is the engine's P/D group: prefill and decode engines pair only
	// within one group ("" is a group like any other).
	Group string `json:"grp,omitempty"`
	// PDProtocol is the engine's P/D wire protocol: "" (vLLM's NIXL
	// connector, kv_transfer_params, or none) or PDProtocolSGLang
	// (bootstrap_host/port/room). Unknown values are kept as they are; the
	// ingress treats them as "".
	PDProtocol string `json:"pdp,omitempty"`
	// Bootstrap is an SGLang prefill engine's bootstrap server, host:port
	// (--disaggregation-bootstrap-port on the engine's host).
	Bootstrap string `json:"boot,omitempty"`

	// LoRAs are the LoRA adapters the engine serves (vLLM lists them in
	// /v1/models with their base model as parent): sorted names joined by
	// commas (a string keeps EngineState comparable), at most MaxLoRAs names
	// of at most MaxLoRAName bytes, none empty or holding a comma. The
	// ingress routes a request naming one to the engines that list it,
	// keyed as the adapter (Adapters splits them).
	LoRAs string `json:"lora,omitempty"`
	// MaxModelLen and Root are the base model's max_model_len and root (the
	// path or repository the engine loaded) as the engine's /v1/models
	// lists them (vLLM's model card); 0 and "" when unknown. The ingress's
	// /v1/models shows them. Root is at most MaxRoot bytes.
	MaxModelLen int    `json:"mml,omitempty"`
	Root        string `json:"root,omitempty"`

	// Digest is the key-set digest per tier at its delta head; Digest.Digests[t].Count
	// is the block count of tier t.
	Digest kvevents.EngineDigest `json:"dig"`
}

// Bounds of EngineState.LoRAs and Root: a state past them is malformed.
const (
	MaxLoRAs    = 64
	MaxLoRAName = 256
	MaxRoot     = 1024
)

// JoinLoRAs is the LoRAs field for names: sorted, deduplicated, and only the
// first MaxLoRAs that fit (an empty name, one with a comma or one over
// MaxLoRAName bytes is left out).
func JoinLoRAs(names []string) string {
	var ok []string
	for _, n := range names {
		if validLoRA(n) {
			ok = append(ok, n)
		}
	}
	slices.Sort(ok)
	ok = slices.Compact(ok)
	return strings.Join(ok[:min(len(ok), MaxLoRAs)], ",")
}

// LoRAsLeftOut is how many of names JoinLoRAs leaves out: beyond the first
// MaxLoRAs distinct valid names, or invalid (empty, with a comma, over
// MaxLoRAName bytes). Duplicates are not counted.
func LoRAsLeftOut(names []string) int {
	valid, invalid := map[string]bool{}, 0
	for _, n := range names {
		if validLoRA(n) {
			valid[n] = true
		} else {
			invalid++
		}
	}
	return invalid + max(len(valid)-MaxLoRAs, 0)
}

// validLoRA is the rule for one name of EngineState.LoRAs.
func validLoRA(n string) bool { return n != "" && len(n) <= MaxLoRAName && !strings.Contains(n, ",") }

// Adapters returns the LoRA adapters of s (nil when none).
func (s *EngineState) Adapters() []string {
	if s.LoRAs == "" {
		return nil
	}
	return strings.Split(s.LoRAs, ",")
}

// PDProtocolSGLang is EngineState.PDProtocol of an SGLang engine run with
// --disaggregation-mode.
const PDProtocolSGLang = "sglang"

// PrefillLoad is one ingress's P/D prefill legs on one prefill engine.
type PrefillLoad struct {
	// Legs are the prefill legs in flight (sent, not answered).
	Legs int `json:"l,omitempty"`
	// Queued are the legs waiting for an admission slot at the ingress.
	Queued int `json:"q,omitempty"`
}

// EngineView is an engine as seen by a member: its state, the node that
// gossips it, and when that state was produced there.
type EngineView struct {
	EngineState
	Node string
	// Updated is when the state was produced, on its sidecar's wall clock:
	// off by the clock skew between the hosts.
	Updated time.Time
	// Age is how old the state was when the view was taken, told without
	// comparing clocks (the sidecar's time since it set the state plus each
	// holder's since it received it, on monotonic clocks; transit not
	// counted). Negative when unknown: the sidecar, or every member that
	// forwarded the state, predates it.
	Age time.Duration
}

// Entry kinds. Every entry is owned by its origin node, versioned by the
// origin (last writer wins) and dropped when the origin leaves or dies.
const (
	kindEngine   = 1 // Name = engine id
	kindInFlight = 2 // Name = ""
	kindApp      = 3 // Name = application key
)

type entry struct {
	Origin  string `json:"o"`
	Kind    uint8  `json:"k"`
	Name    string `json:"n,omitempty"`
	Version int64  `json:"v"`
	// Gen is the origin's generation (NodeMeta.Gen) when it set the
	// entry; 0 from a member that predates generations. Versions order
	// entries within one generation only: they are the origin's wall
	// clock, which a restarted process may have behind its predecessor's.
	Gen      uint64         `json:"g,omitempty"`
	Engine   *EngineState   `json:"e,omitempty"`
	InFlight map[string]int `json:"i,omitempty"`
	// Prefill rides in the in-flight entry (kindInFlight): members that
	// predate it ignore the field.
	Prefill map[string]PrefillLoad `json:"pf,omitempty"`
	App     []byte                 `json:"a,omitempty"`
	// Age is how long before this copy was encoded its origin set the
	// entry, in ns: the origin's time since it set it plus each
	// forwarder's since it received it, all on monotonic clocks, so a
	// receiver tells the entry's age without comparing clocks (Version,
	// the origin's wall clock, is off by their skew). Transit and queueing
	// after encoding are not counted. 0: unknown (a member that predates
	// it, or a copy forwarded by one).
	Age int64 `json:"ag,omitempty"`

	// at is when this process set (own) or accepted the entry, on its
	// monotonic clock; ageAt is the entry's age then, negative when
	// unknown. Both are set before the entry is shared and never changed.
	at    time.Time
	ageAt time.Duration
	// relayed: the entry came by the state lane (MergeRelayed), which may
	// not introduce or change a routing address (routing.go).
	relayed bool
}

// stamped is a copy of e to encode at now, carrying its age then.
func (e *entry) stamped(now time.Time) *entry {
	c := *e
	c.Age = 0
	if e.ageAt >= 0 && !e.at.IsZero() {
		c.Age = max(int64(e.ageAt+now.Sub(e.at)), 1) // 0 would read as unknown
	}
	return &c
}

// age is e's age at now; negative when unknown.
func (e *entry) age(now time.Time) time.Duration {
	if e.ageAt < 0 || e.at.IsZero() {
		return -1
	}
	return e.ageAt + now.Sub(e.at)
}

// received records that e, just decoded, is accepted at now.
func (e *entry) received(now time.Time) {
	e.at, e.ageAt = now, -1
	if e.Age > 0 {
		e.ageAt = time.Duration(e.Age)
	}
}

type entryKey struct {
	origin string
	kind   uint8
	name   string
}

func (e *entry) key() entryKey { return entryKey{e.Origin, e.Kind, e.Name} }

// Wire: one version byte, then JSON. Gossip is low-rate state, so a readable
// encoding that decodes safely wins over a compact one.
const (
	wireEntry = 1 // a single entry (UDP broadcast)
	wireState = 2 // a push/pull full state: a JSON array of entries
	// MetaLimit bounds a member's encoded metadata (memberlist's limit is
	// 512).
	MetaLimit  = 500
	maxAppBlob = 4 << 10
)

var errMalformed = errors.New("malformed gossip message")

func encodeEntry(e *entry) ([]byte, error) {
	b, err := json.Marshal(e)
	if err != nil {
		return nil, fmt.Errorf("encode gossip entry: %w", err)
	}
	return append([]byte{wireEntry}, b...), nil
}

func decodeEntry(b []byte) (*entry, error) {
	if len(b) < 2 || b[0] != wireEntry {
		return nil, fmt.Errorf("%w: want entry", errMalformed)
	}
	var e entry
	if err := json.Unmarshal(b[1:], &e); err != nil {
		return nil, fmt.Errorf("%w: %v", errMalformed, err)
	}
	if err := e.check(); err != nil {
		return nil, err
	}
	return &e, nil
}

func encodeState(es []*entry) ([]byte, error) {
	b, err := json.Marshal(es)
	if err != nil {
		return nil, fmt.Errorf("encode gossip state: %w", err)
	}
	return append([]byte{wireState}, b...), nil
}

// decodeState returns the well-formed entries and how many were malformed.
func decodeState(b []byte) ([]*entry, int, error) {
	if len(b) < 2 || b[0] != wireState {
		return nil, 0, fmt.Errorf("%w: want state", errMalformed)
	}
	var raw []json.RawMessage
	if err := json.Unmarshal(b[1:], &raw); err != nil {
		return nil, 0, fmt.Errorf("%w: %v", errMalformed, err)
	}
	out := make([]*entry, 0, len(raw))
	bad := 0
	for _, r := range raw {
		var e entry
		if json.Unmarshal(r, &e) != nil || e.check() != nil {
			bad++
			continue
		}
		out = append(out, &e)
	}
	return out, bad, nil
}

func (e *entry) check() error {
	if e.Origin == "" {
		return fmt.Errorf("%w: no origin", errMalformed)
	}
	switch e.Kind {
	case kindEngine:
		if e.Engine == nil || e.Engine.ID == "" || e.Engine.ID != e.Name {
			return fmt.Errorf("%w: engine entry without engine", errMalformed)
		}
		if e.Engine.KVUsage < 0 || e.Engine.KVUsage > 1.0001 || e.Engine.Running < 0 || e.Engine.Waiting < 0 {
			return fmt.Errorf("%w: engine load out of range", errMalformed)
		}
		if e.Engine.GPUBlocks < 0 {
			return fmt.Errorf("%w: gpu blocks %d", errMalformed, e.Engine.GPUBlocks)
		}
		if e.Engine.MaxModelLen < 0 || len(e.Engine.Root) > MaxRoot {
			return fmt.Errorf("%w: max_model_len %d, root of %d bytes", errMalformed, e.Engine.MaxModelLen, len(e.Engine.Root))
		}
		if l := e.Engine.LoRAs; l != "" { // checked in place: every received state passes here
			if n := strings.Count(l, ",") + 1; n > MaxLoRAs {
				return fmt.Errorf("%w: %d LoRA adapters", errMalformed, n)
			}
			for a := range strings.SplitSeq(l, ",") {
				if !validLoRA(a) {
					return fmt.Errorf("%w: LoRA adapter name of %d bytes", errMalformed, len(a))
				}
			}
		}
	case kindInFlight:
		for _, n := range e.InFlight {
			if n < 0 {
				return fmt.Errorf("%w: negative in-flight", errMalformed)
			}
		}
		for _, l := range e.Prefill {
			if l.Legs < 0 || l.Queued < 0 {
				return fmt.Errorf("%w: negative prefill load", errMalformed)
			}
		}
	case kindApp:
		if e.Name == "" || len(e.App) > maxAppBlob {
			return fmt.Errorf("%w: bad app entry", errMalformed)
		}
	default:
		return fmt.Errorf("%w: kind %d", errMalformed, e.Kind)
	}
	return nil
}

func encodeMeta(m NodeMeta) ([]byte, error) { return json.Marshal(m) }

func decodeMeta(b []byte) (NodeMeta, error) {
	var m NodeMeta
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("%w: meta: %v", errMalformed, err)
	}
	return m, nil
}
