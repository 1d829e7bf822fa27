package kvevents

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"

	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

// vLLM sends a request's identity beyond its tokens only in BlockStored's
// extra_keys: one entry per block hash, nil or the tuple vLLM hashed with the
// block (vllm/v1/core/kv_cache_utils.py generate_block_hash_extra_keys):
//
//	lora_name (every block of a LoRA request)
//	+ mm identifiers (blocks overlapping an image, audio ...): strings in
//	  released vLLM, (identifier, offset) pairs in newer code; in block 0 a
//	  string one cannot be told from the salt and is read as one, which gives
//	  the block a root of that image's own (no text request reaches it)
//	+ cache_salt (the request's first block only)
//	+ prompt-embeds digests (bytes, every block of an embeds prompt)
//
// The ingress keys a request from (model, LoRA name, cache salt) and its
// tokens, so a block whose entry holds only a LoRA name and (in block 0) a
// salt gets exactly the key the ingress computes for that request. Anything
// else (multimodal identifiers, prompt-embeds digests, a shape kvmesh does not
// know) cannot be reproduced by the ingress: such a block's key has a digest
// of its raw entry folded in (MixExtra), which moves it and every block
// chained after it into a key space no text request reaches. Those blocks are
// never matched (no affinity), but two requests with different images and
// equal placeholder tokens never share keys either (no false hits).

// extraDomain prefixes the input of MixExtra. Its length with the 8-byte
// digest (23) is not a multiple of 4, so it never equals the bytes of a block
// of uint32 tokens hashed by ChainKey.
const extraDomain = "kvmesh/v1/extra"

// loraIDDomain prefixes LoRAIDRoot's input; Root's input always has 0x00 at
// this position, so the two never hash the same string.
const loraIDDomain = "kvmesh/v1/lora-id"

// MixExtra folds the digest of raw (a block's extra keys that the ingress
// cannot reproduce) into the block's chained key.
func MixExtra(key uint64, raw []byte) uint64 {
	var b [len(extraDomain) + 8]byte
	copy(b[:], extraDomain)
	binary.LittleEndian.PutUint64(b[len(extraDomain):], xxh3.Hash(raw))
	return xxh3.HashSeed(b[:], key)
}

// LoRAIDRoot is the root of the blocks of an adapter known only by its
// engine-local integer id (vLLM before lora_name, which sends lora_id alone).
// No request the ingress keys has this root: such blocks never alias the base
// model's keys, and never match an adapter request either.
func LoRAIDRoot(model string, loraID int64, salt string) uint64 {
	var h xxh3.Hasher
	h.Reset()
	var b [len(loraIDDomain) + 1 + 8]byte
	copy(b[:], loraIDDomain)
	binary.LittleEndian.PutUint64(b[len(loraIDDomain)+1:], uint64(loraID))
	_, _ = h.Write(b[:])
	_, _ = h.WriteString(model)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(salt)
	return h.Sum64()
}

// AppendStoredKeys appends the kvmesh keys of the first n blocks (of bs
// tokens each) of BlockStored event ev to dst. parent is the key of the
// block before ev's first block when ev.HasParent; otherwise the chain starts
// at the root of the event's model, LoRA and cache salt:
//   - LoRA: lora_name, else the name leading block 0's extra keys, else (a
//     lora_id alone) LoRAIDRoot;
//   - salt: a cache_salt field when an engine sends one, else the salt in
//     block 0's extra keys.
//
// Blocks whose extra keys hold anything else are moved out of the text key
// space with MixExtra (see above). It allocates only when dst must grow.
func AppendStoredKeys(dst []uint64, model string, ev *Event, parent uint64, n, bs int) []uint64 {
	if n <= 0 || bs <= 0 || len(ev.TokenIDs) < n*bs {
		return dst
	}
	if len(ev.ExtraKeys) == 0 {
		if !ev.HasParent {
			parent = eventRoot(model, ev, "", "")
		}
		return AppendKeys(dst, parent, ev.TokenIDs[:n*bs], bs)
	}
	x := newExtraReader(ev, n)
	first := x.next(!ev.HasParent)
	if !ev.HasParent {
		parent = eventRoot(model, ev, bstr(first.lora), bstr(first.salt))
	}
	dst = growKeys(dst, n)
	e := first
	for i := 0; i < n; i++ {
		if i > 0 {
			e = x.next(false)
		}
		key := ChainKey(parent, ev.TokenIDs[i*bs:(i+1)*bs])
		if e.opaque != nil {
			key = MixExtra(key, e.opaque)
		}
		dst = append(dst, key)
		parent = key
	}
	return dst
}

// eventRoot is the root of a chain starting at ev's first block; lora and
// salt are what block 0's extra keys say (they may alias ev.ExtraKeys).
func eventRoot(model string, ev *Event, lora, salt string) uint64 {
	if ev.CacheSalt != "" {
		salt = ev.CacheSalt
	}
	switch {
	case ev.LoraName != "":
		lora = ev.LoraName
	case lora == "" && ev.HasLoraID:
		return LoRAIDRoot(model, ev.LoraID, salt)
	}
	return Root(model, lora, salt)
}

// bstr views b as a string without copying; the result must not outlive b
// (Root and LoRAIDRoot do not keep it).
func bstr(b []byte) string {
	if len(b) == 0 {
		return ""
	}
	return unsafe.String(unsafe.SliceData(b), len(b))
}

// blockExtra is what one block's extra_keys entry says. lora, salt and
// opaque alias Event.ExtraKeys.
type blockExtra struct {
	lora   []byte // the LoRA name leading the entry (LoRA events only)
	salt   []byte // the cache salt (the request's first block only)
	opaque []byte // the raw entry, when it holds keys the ingress cannot reproduce
}

// extraReader walks Event.ExtraKeys one block entry at a time without
// allocating. A list that is not an array of one entry per block makes every
// block opaque (with the whole list as its digest input).
type extraReader struct {
	r       reader
	left    int
	all     []byte // non-nil: every block is opaque with this input
	isLoRA  bool
	loraStr string // the event's lora_name ("" when absent)
}

func newExtraReader(ev *Event, n int) extraReader {
	x := extraReader{r: reader{b: ev.ExtraKeys}, isLoRA: ev.LoraName != "" || ev.HasLoraID, loraStr: ev.LoraName}
	c, err := x.r.peek()
	if err != nil || !isArray(c) {
		x.all = ev.ExtraKeys
		return x
	}
	cnt, err := x.r.arrayLen()
	if err != nil || cnt != n && cnt != len(ev.BlockHashes) {
		x.all = ev.ExtraKeys
		return x
	}
	x.left = cnt
	return x
}

// next reads the next block's entry; first says the block is the request's
// first (the only one that may carry the salt). A missing entry is plain.
func (x *extraReader) next(first bool) blockExtra {
	if x.all != nil {
		return blockExtra{opaque: x.all}
	}
	if x.left == 0 {
		return blockExtra{}
	}
	x.left--
	start := x.r.off
	if x.r.nextNil() {
		return blockExtra{}
	}
	var e blockExtra
	if !x.entry(&e, first) {
		x.r.off = start
		if x.r.skip() != nil {
			x.all = x.r.b // cannot happen: the decoder checked the structure
			return blockExtra{opaque: x.all}
		}
		return blockExtra{opaque: x.r.b[start:x.r.off]}
	}
	return e
}

// entry parses one non-nil entry into e, reporting whether it holds only
// what the ingress reproduces (a leading LoRA name, block 0's salt).
func (x *extraReader) entry(e *blockExtra, first bool) bool {
	c, err := x.r.peek()
	if err != nil || !isArray(c) {
		return false
	}
	n, err := x.r.arrayLen()
	if err != nil {
		return false
	}
	for i := 0; i < n; i++ {
		c, err := x.r.peek()
		if err != nil || !isStr(c) {
			return false // multimodal pair, prompt-embeds digest, unknown
		}
		s, err := x.r.str()
		if err != nil {
			return false
		}
		switch {
		case i == 0 && x.isLoRA:
			if x.loraStr != "" && string(s) != x.loraStr {
				return false
			}
			e.lora = s
		case first && e.salt == nil:
			e.salt = s
		default:
			return false
		}
	}
	return true
}

func isStr(c byte) bool { return c&0xe0 == 0xa0 || c == 0xd9 || c == 0xda || c == 0xdb }

// AppendExtraKeys appends the extra_keys list vLLM sends for a run of blocks
// of a text request: one entry per block, nil or the tuple (lora_name?,
// cache_salt?), the salt in the request's first block only (first says the
// run starts there). Engine simulators use it to speak vLLM's format. It
// allocates only when dst must grow.
func AppendExtraKeys(dst []byte, blocks int, first bool, lora, salt string) []byte {
	dst = wire.AppendArrayHeader(dst, blocks)
	for i := 0; i < blocks; i++ {
		withSalt := first && i == 0 && salt != ""
		n := 0
		if lora != "" {
			n++
		}
		if withSalt {
			n++
		}
		if n == 0 {
			dst = append(dst, 0xc0)
			continue
		}
		dst = wire.AppendArrayHeader(dst, n)
		if lora != "" {
			dst = wire.AppendStr(dst, lora)
		}
		if withSalt {
			dst = wire.AppendStr(dst, salt)
		}
	}
	return dst
}
