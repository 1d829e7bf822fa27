package kvevents

// Tier is where a cached block lives. The engine reports an opaque medium string;
// TierOf maps it onto the three tiers kvmesh routes on.
type Tier uint8

const (
	TierGPU   Tier = iota // "GPU", or no medium (engines before the medium field)
	TierCPU               // "CPU", SGLang's "CPU_TIER1"/"CPU_TIER2", other host-memory names
	TierOther             // "STORAGE", vendor-specific mediums
	NumTiers  = 3
)

// String returns the tier's lower-case name (gpu, cpu, other).
func (t Tier) String() string {
	switch t {
	case TierGPU:
		return "gpu"
	case TierCPU:
		return "cpu"
	default:
		return "other"
	}
}

// EventKind is the type of one KV event.
type EventKind uint8

const (
	BlockStored EventKind = iota + 1
	BlockRemoved
	AllBlocksCleared
)

// String returns the event's wire name.
func (k EventKind) String() string {
	switch k {
	case BlockStored:
		return "BlockStored"
	case BlockRemoved:
		return "BlockRemoved"
	case AllBlocksCleared:
		return "AllBlocksCleared"
	default:
		return "Unknown"
	}
}

// Event is one decoded engine KV event. Engine block hashes are opaque ids,
// folded to uint64 (spec §2): kvmesh never recomputes them.
// Optional fields carry a Has* flag so "absent" and "zero" stay distinct.
type Event struct {
	Kind        EventKind
	BlockHashes []uint64 // BlockStored, BlockRemoved: chain order

	// BlockStored only.
	ParentHash    uint64
	HasParent     bool     // false when the run starts at token 0 (parent nil)
	TokenIDs      []uint32 // tokens of every block in the event, concatenated
	BlockSize     int      // tokens per block; 0 when absent
	LoraID        int64
	HasLoraID     bool
	LoraName      string // "" when nil or absent
	SpecKind      string // kv_cache_spec_kind, "" when absent ("full_attention"-like groups are indexed)
	SlidingWindow int64  // kv_cache_spec_sliding_window, 0 when absent
	// CacheSalt is the cache_salt map key newer SGLang sends (its event
	// recorder passes the radix key's cache_salt); "" when absent. vLLM has
	// no such field: its salt is in block 0's ExtraKeys (AppendStoredKeys).
	CacheSalt string
	SessionID string // optional session_id (vLLM PR #51381, SGLang maps)
	// ExtraKeys is the raw msgpack of extra_keys (one entry per block) when
	// present and not nil, copied out of the payload so re-encoding is exact.
	ExtraKeys []byte

	// BlockStored and BlockRemoved.
	Medium      string // raw medium, "" when nil or absent (legacy = GPU)
	GroupIdx    int64
	HasGroupIdx bool
}

// Tier is the tier the event's medium maps to.
func (e *Event) Tier() Tier { return TierOf(e.Medium) }

// Batch is one decoded KVEventBatch payload (frame 2 of a live message).
type Batch struct {
	TS        float64 // wall-clock seconds
	DPRank    int
	HasDPRank bool // false for 2-element envelopes (before vLLM PR #18925) and nil ranks
	Events    []Event
	// Skipped counts events of unknown types (newer engines) that the decoder
	// stepped over; they are not in Events.
	Skipped int
}

// TierOf maps an engine's medium string to a tier. It is case-insensitive:
// "" and "GPU" (and "cuda"/"hbm"-like names) are GPU; names starting with CPU,
// "HOST" or "DRAM" are CPU; everything else (STORAGE, DISK, vendor names) is other.
func TierOf(medium string) Tier {
	if medium == "" {
		return TierGPU
	}
	switch {
	case hasPrefixFold(medium, "GPU"), hasPrefixFold(medium, "CUDA"), hasPrefixFold(medium, "HBM"):
		return TierGPU
	case hasPrefixFold(medium, "CPU"), hasPrefixFold(medium, "HOST"), hasPrefixFold(medium, "DRAM"):
		return TierCPU
	default:
		return TierOther
	}
}

func hasPrefixFold(s, prefix string) bool {
	if len(s) < len(prefix) {
		return false
	}
	for i := 0; i < len(prefix); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' {
			c -= 'a' - 'A'
		}
		if c != prefix[i] {
			return false
		}
	}
	return true
}
