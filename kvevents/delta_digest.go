package kvevents

// Digest is an order-independent summary of one tier's key set: the count,
// and the sum and xor of a 64-bit mix of every key. Sidecar and materializer
// keep one per tier incrementally (O(1) per key) and compare them at the same
// delta head; two sets that differ in any key differ in Sum or Xor with
// overwhelming probability, because the mix spreads every key over all bits.
type Digest struct {
	Count uint64
	Sum   uint64
	Xor   uint64
}

// Add records key as a member. Callers add a key only when it enters the set.
func (d *Digest) Add(key uint64) {
	m := MixKey(key)
	d.Count++
	d.Sum += m
	d.Xor ^= m
}

// Remove records that key left the set. Callers remove only members.
func (d *Digest) Remove(key uint64) {
	m := MixKey(key)
	d.Count--
	d.Sum -= m
	d.Xor ^= m
}

// MixKey is the splitmix64 finalizer: a bijection of uint64 with full avalanche.
func MixKey(k uint64) uint64 {
	k ^= k >> 30
	k *= 0xbf58476d1ce4e5b9
	k ^= k >> 27
	k *= 0x94d049bb133111eb
	k ^= k >> 31
	return k
}

// Head is a delta stream position: the sidecar epoch and the last sequence in it.
type Head struct {
	Epoch uint64
	Seq   uint64
}

// EngineDigest is an engine's key-set digest per tier at a head; sidecars gossip
// it and materializers compare theirs at the same head.
type EngineDigest struct {
	Head    Head
	Digests [NumTiers]Digest
}
