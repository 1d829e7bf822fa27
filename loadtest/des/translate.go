package des

import (
	"github.com/kvmesh/kvmesh/kvevents"
)

// translator turns one engine's KV events (opaque engine block hashes) into
// kvmesh key operations, as a sidecar does (DESIGN.md Contract 1): each
// stored block's key chains from its parent's key (or the root), and the
// engine hash → key map, reference-counted per tier because the same hash
// can be stored more than once, resolves removals. This is the benchmark's
// minimal in-process stand-in for the sidecar's bookkeeping.
type translator struct {
	model string
	bs    int
	known map[uint64]blockRef
	roots map[string]uint64 // lora name → root
	ops   []op              // reused output
	keys  []uint64          // backing store of ops' keys
	bad   int               // malformed events skipped
}

type blockRef struct {
	key uint64
	ref [kvevents.NumTiers]int32
}

type opKind uint8

const (
	opStore opKind = iota
	opRemove
	opClear
)

// op is one index operation; keys index into translator.keys.
type op struct {
	kind       opKind
	tier       kvevents.Tier
	start, end int
}

func newTranslator(model string, bs int) *translator {
	return &translator{model: model, bs: bs, known: make(map[uint64]blockRef), roots: make(map[string]uint64)}
}

func (t *translator) root(lora string) uint64 {
	r, ok := t.roots[lora]
	if !ok {
		r = kvevents.Root(t.model, lora, "")
		t.roots[lora] = r
	}
	return r
}

// translate appends the ops of events to t.ops (call reset between batches).
func (t *translator) translate(events []kvevents.Event) {
	for i := range events {
		ev := &events[i]
		switch ev.Kind {
		case kvevents.BlockStored:
			t.stored(ev)
		case kvevents.BlockRemoved:
			tier := ev.Tier()
			start := len(t.keys)
			for _, h := range ev.BlockHashes {
				b, ok := t.known[h]
				if !ok || b.ref[tier] == 0 {
					t.bad++
					continue
				}
				b.ref[tier]--
				switch {
				case b.ref == [kvevents.NumTiers]int32{}:
					delete(t.known, h)
				default:
					t.known[h] = b
				}
				if b.ref[tier] == 0 {
					t.keys = append(t.keys, b.key)
				}
			}
			if len(t.keys) > start {
				t.ops = append(t.ops, op{kind: opRemove, tier: tier, start: start, end: len(t.keys)})
			}
		case kvevents.AllBlocksCleared:
			clear(t.known)
			t.ops = append(t.ops, op{kind: opClear})
		}
	}
}

func (t *translator) stored(ev *kvevents.Event) {
	tier := ev.Tier()
	parent := t.root(ev.LoraName)
	if ev.HasParent {
		p, ok := t.known[ev.ParentHash]
		if !ok {
			t.bad++
			return
		}
		parent = p.key
	}
	bs := t.bs
	if ev.BlockSize > 0 {
		bs = ev.BlockSize
	}
	start := len(t.keys)
	for j, h := range ev.BlockHashes {
		b, ok := t.known[h]
		if !ok {
			if (j+1)*bs > len(ev.TokenIDs) {
				t.bad++
				break
			}
			b = blockRef{key: kvevents.ChainKey(parent, ev.TokenIDs[j*bs:(j+1)*bs])}
		}
		b.ref[tier]++
		t.known[h] = b
		if b.ref[tier] == 1 {
			t.keys = append(t.keys, b.key)
		}
		parent = b.key
	}
	if len(t.keys) > start {
		t.ops = append(t.ops, op{kind: opStore, tier: tier, start: start, end: len(t.keys)})
	}
}
