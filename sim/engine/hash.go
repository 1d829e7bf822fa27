package engine

import (
	"encoding/binary"

	"github.com/zeebo/xxh3"
)

// Engine block hashes imitate vLLM's: a chain H_i = hash(H_{i-1}, tokens_i)
// starting from a per-engine random NONE_HASH (here derived from the hash seed),
// with the request's extra keys (LoRA name, cache salt) folded into the first
// block. They are opaque ids on purpose: a consumer that assumes it can
// recompute them (instead of using kvmesh keys from token ids) breaks here just
// as it would on a real vLLM whose NONE_HASH is random per process.

// noneHash is the chain root of an engine with the given hash seed.
func noneHash(seed uint64) uint64 {
	return xxh3.HashStringSeed("kvmesh-sim/none-hash", seed)
}

// rootFor is the parent hash of block 0 for a request with these extra keys.
func rootFor(none uint64, lora, salt string) uint64 {
	if lora == "" && salt == "" {
		return none
	}
	h := xxh3.HashStringSeed(lora, none)
	return xxh3.HashStringSeed(salt, h^0x9e3779b97f4a7c15)
}

// blockHash chains one block's tokens onto its parent hash. buf is scratch of
// at least 4*len(tokens) bytes, so hashing allocates nothing.
func blockHash(parent uint64, tokens []uint32, buf []byte) uint64 {
	b := buf[:4*len(tokens)]
	for i, t := range tokens {
		binary.LittleEndian.PutUint32(b[4*i:], t)
	}
	return xxh3.HashSeed(b, parent)
}

// fillerToken is the i-th generated token of a request whose prompt hashes to
// seed. Generation is a pure function of the prompt (like greedy decoding), so
// the same prompt always continues the same way and a follow-up turn that
// repeats the answer hits the cache; ids stay within [FillerBase, FillerBase+FillerVocab).
func fillerToken(seed uint64, i int) uint32 {
	x := seed + uint64(i)*0x9e3779b97f4a7c15
	x ^= x >> 33
	x *= 0xff51afd7ed558ccd
	x ^= x >> 33
	return FillerBase + uint32(x%FillerVocab)
}

// FillerBase and FillerVocab bound the ids of generated tokens. The range sits
// inside every common vocabulary (BERT's 30k is the smallest we care about).
const (
	FillerBase  = 1000
	FillerVocab = 1000
)
