package kvevents

import (
	"encoding/binary"
	"math/rand/v2"
	"testing"

	"github.com/zeebo/xxh3"
)

const (
	prime32 = 2654435761
	prime64 = 11400714785074694797
)

// sanityBuffer is xxHash's own test input (tests/sanity_test.c).
func sanityBuffer(n int) []byte {
	b := make([]byte, n)
	gen := uint64(prime32)
	for i := range b {
		b[i] = byte(gen >> 56)
		gen *= prime64
	}
	return b
}

// TestXXH3SeededVectors checks that zeebo/xxh3's seeded 64-bit hash is the
// canonical XXH3_64bits_withSeed (vectors from xxHash's sanity_test_vectors.h),
// so keys computed in other languages agree with ours.
func TestXXH3SeededVectors(t *testing.T) {
	vectors := []struct {
		n    int
		seed uint64
		want uint64
	}{
		{0, 0, 0x2D06800538D394C2}, {0, prime64, 0xA8A6B918B2F0364A},
		{1, 0, 0xC44BDFF4074EECDB}, {1, prime64, 0x032BE332DD766EF8},
		{6, 0, 0x27B56A84CD2D7325}, {6, prime64, 0x84589C116AB59AB9},
		{12, 0, 0xA713DAF0DFBB77E7}, {12, prime64, 0xE7303E1B2336DE0E},
		{24, 0, 0xA3FE70BF9D3510EB}, {24, prime64, 0x850E80FC35BDD690},
		{48, 0, 0x397DA259ECBA1F11}, {48, prime64, 0xADC2CBAA44ACC616},
		{80, 0, 0xBCDEFBBB2C47C90A}, {80, prime64, 0xC6DD0CB699532E73},
		{195, 0, 0xCD94217EE362EC3A}, {195, prime64, 0xBA68003D370CB3D9},
		{403, 0, 0xCDEB804D65C6DEA4}, {403, prime64, 0x6259F6ECFD6443FD},
	}
	buf := sanityBuffer(4096 + 64 + 1)
	for _, v := range vectors {
		if got := xxh3.HashSeed(buf[:v.n], v.seed); got != v.want {
			t.Errorf("XXH3_64bits_withSeed(len %d, seed %#x) = %#x, want %#x", v.n, v.seed, got, v.want)
		}
	}
}

func TestRootDefinition(t *testing.T) {
	got := Root("llama", "adapter", "salt")
	want := xxh3.Hash([]byte("kvmesh/v1\x00llama\x00adapter\x00salt"))
	if got != want {
		t.Fatalf("Root = %d, want %d", got, want)
	}
	// Fields are separated, so shifting a byte between them changes the root.
	if Root("ab", "", "") == Root("a", "b", "") || Root("m", "", "") == Root("m", "", "x") {
		t.Fatal("root does not separate model, lora and salt")
	}
	long := string(make([]byte, 1000))
	if Root(long, "x", "y") != xxh3.Hash([]byte("kvmesh/v1\x00"+long+"\x00x\x00y")) {
		t.Fatal("long root differs from its definition")
	}
}

func TestChainKeyDefinition(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for n := 0; n < 200; n++ {
		block := make([]uint32, n)
		for i := range block {
			block[i] = rng.Uint32()
		}
		seed := rng.Uint64()
		raw := make([]byte, 4*n)
		for i, v := range block {
			binary.LittleEndian.PutUint32(raw[4*i:], v)
		}
		want := xxh3.HashSeed(raw, seed)
		if got := ChainKey(seed, block); got != want {
			t.Fatalf("ChainKey(len %d) = %d, want %d", n, got, want)
		}
		if got := chainKeyPortable(seed, block); got != want {
			t.Fatalf("chainKeyPortable(len %d) = %d, want %d", n, got, want)
		}
	}
}

func TestAppendKeys(t *testing.T) {
	root := Root("m", "", "")
	tokens := make([]uint32, 16*5+7) // five full blocks and a partial one
	for i := range tokens {
		tokens[i] = uint32(i * 7919)
	}
	keys := AppendKeys([]uint64{42}, root, tokens, 16)
	if len(keys) != 6 || keys[0] != 42 {
		t.Fatalf("got %d keys (first %d), want the prefix 42 plus 5 keys", len(keys), keys[0])
	}
	parent := root
	for i := 0; i < 5; i++ {
		want := chainKeyPortable(parent, tokens[i*16:(i+1)*16])
		if keys[i+1] != want {
			t.Fatalf("key %d = %d, want %d", i, keys[i+1], want)
		}
		parent = want
	}
	if got := AppendKeys(nil, root, tokens[:15], 16); len(got) != 0 {
		t.Fatalf("partial block got %d keys", len(got))
	}
	if got := AppendKeys(nil, root, tokens, 0); len(got) != 0 {
		t.Fatal("block size 0 must give no keys")
	}
	// A shared prefix gives shared keys; a different root gives different keys.
	other := AppendKeys(nil, root, tokens[:32], 16)
	if other[0] != keys[1] || other[1] != keys[2] {
		t.Fatal("prefix keys differ")
	}
	if AppendKeys(nil, Root("m", "lora", ""), tokens[:16], 16)[0] == keys[1] {
		t.Fatal("lora does not change the keys")
	}
}

func TestAppendKeysNoAlloc(t *testing.T) {
	tokens := make([]uint32, 10000)
	dst := make([]uint64, 0, 1000)
	root := Root("m", "", "")
	allocs := testing.AllocsPerRun(20, func() {
		dst = AppendKeys(dst[:0], root, tokens, 16)
		_ = Root("model", "lora", "salt")
	})
	if allocs != 0 {
		t.Fatalf("AppendKeys allocated %.1f times per run", allocs)
	}
}

func BenchmarkAppendKeys10kB16(b *testing.B) {
	tokens := make([]uint32, 10000)
	for i := range tokens {
		tokens[i] = uint32(i*2654435761) % 128000
	}
	root := Root("meta-llama/Llama-3.1-8B-Instruct", "", "")
	dst := make([]uint64, 0, len(tokens)/16)
	b.ReportAllocs()
	b.SetBytes(int64(len(tokens) * 4))
	for b.Loop() {
		dst = AppendKeys(dst[:0], root, tokens, 16)
	}
}

func BenchmarkRoot(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		_ = Root("meta-llama/Llama-3.1-8B-Instruct", "my-adapter", "tenant-salt")
	}
}

// BenchmarkAppendKeysPortable is the reference without zero-copy: each
// block's tokens are serialised to bytes before hashing.
func BenchmarkAppendKeysPortable10kB16(b *testing.B) {
	tokens := make([]uint32, 10000)
	for i := range tokens {
		tokens[i] = uint32(i*2654435761) % 128000
	}
	root := Root("meta-llama/Llama-3.1-8B-Instruct", "", "")
	dst := make([]uint64, 0, len(tokens)/16)
	b.ReportAllocs()
	for b.Loop() {
		dst = dst[:0]
		key := root
		for i := 0; i+16 <= len(tokens); i += 16 {
			key = chainKeyPortable(key, tokens[i:i+16])
			dst = append(dst, key)
		}
	}
}
