package kvevents

import (
	"encoding/binary"
	"unsafe"

	"github.com/zeebo/xxh3"
)

// keyDomain prefixes every root so kvmesh keys never collide with another
// scheme's hashes of the same strings (Contract 1).
const keyDomain = "kvmesh/v1"

// rootStackMax is the longest root input hashed from a stack buffer; longer
// model/LoRA/salt strings use the streaming hasher (still allocation-free).
const rootStackMax = 256

// Root is the seed of a request's key chain (DESIGN.md Contract 1):
// xxh3_64(seed 0, "kvmesh/v1" 0x00 model 0x00 lora 0x00 salt).
// Requests for different models, adapters or cache salts never share keys.
func Root(model, lora, salt string) uint64 {
	n := len(keyDomain) + 3 + len(model) + len(lora) + len(salt)
	if n <= rootStackMax {
		var buf [rootStackMax]byte
		b := append(buf[:0], keyDomain...)
		b = append(b, 0)
		b = append(b, model...)
		b = append(b, 0)
		b = append(b, lora...)
		b = append(b, 0)
		b = append(b, salt...)
		return xxh3.Hash(b)
	}
	var h xxh3.Hasher
	h.Reset()
	_, _ = h.WriteString(keyDomain)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(model)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(lora)
	_, _ = h.Write([]byte{0})
	_, _ = h.WriteString(salt)
	return h.Sum64()
}

// ChainKey is the key of one block: xxh3_64 seeded with the parent key (or
// the root) over the block's tokens as little-endian uint32.
func ChainKey(parent uint64, block []uint32) uint64 {
	if len(block) == 0 {
		return xxh3.HashSeed(nil, parent)
	}
	if littleEndian {
		// Zero-copy: on little-endian hosts the slice's memory already is the
		// canonical byte string.
		b := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(block))), len(block)*4)
		return xxh3.HashSeed(b, parent)
	}
	return chainKeyPortable(parent, block)
}

// chainKeyPortable serialises the tokens explicitly; used on big-endian hosts
// and by tests as the reference for the zero-copy path.
func chainKeyPortable(parent uint64, block []uint32) uint64 {
	const stackTokens = 64
	if len(block) <= stackTokens {
		var buf [stackTokens * 4]byte
		for i, t := range block {
			binary.LittleEndian.PutUint32(buf[i*4:], t)
		}
		return xxh3.HashSeed(buf[:len(block)*4], parent)
	}
	var h xxh3.Hasher
	h.ResetSeed(parent)
	var w [4]byte
	for _, t := range block {
		binary.LittleEndian.PutUint32(w[:], t)
		_, _ = h.Write(w[:])
	}
	return h.Sum64()
}

// AppendKeys appends the key of every full block of tokens to dst and returns
// it. A trailing partial block has no key. blockSize <= 0 yields no keys.
// It allocates only when dst must grow.
func AppendKeys(dst []uint64, root uint64, tokens []uint32, blockSize int) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	n := len(tokens) / blockSize
	if n == 0 {
		return dst
	}
	dst = growKeys(dst, n)
	key := root
	if littleEndian {
		base := unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(tokens))), n*blockSize*4)
		stride := blockSize * 4
		for i := 0; i < n; i++ {
			key = xxh3.HashSeed(base[i*stride:(i+1)*stride], key)
			dst = append(dst, key)
		}
		return dst
	}
	for i := 0; i < n; i++ {
		key = chainKeyPortable(key, tokens[i*blockSize:(i+1)*blockSize])
		dst = append(dst, key)
	}
	return dst
}

func growKeys(dst []uint64, n int) []uint64 {
	if cap(dst)-len(dst) >= n {
		return dst
	}
	out := make([]uint64, len(dst), len(dst)+n)
	copy(out, dst)
	return out
}

// littleEndian reports the host byte order, decided once.
var littleEndian = func() bool {
	x := uint16(1)
	return *(*byte)(unsafe.Pointer(&x)) == 1
}()
