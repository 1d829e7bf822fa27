package index

import (
	"strconv"
	"testing"
	"time"

	"github.com/kvmesh/kvmesh/kvevents"
)

// FuzzOps decodes a byte string as a sequence of index operations over a
// tiny key and engine universe and checks every exact lookup against the
// reference model, and the search against the exact lookup (equal where
// engines hold prefixes, never shallower).
func FuzzOps(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{0x10, 0x21, 0x32, 0x43, 0x54, 0x65, 0x76, 0x87, 0x98, 0xa9, 0xba, 0xcb})
	f.Fuzz(func(t *testing.T, ops []byte) {
		x, _ := New(Config{SpeculativeTTL: time.Second, ExactLookup: true})
		m := &model{held: map[string]map[kvevents.Tier]map[uint64]bool{}}
		chain := []uint64{0, 3, 9, 27, 81, 243, 729}
		engines := []string{"a", "b", "c", "d", "e", "f"}
		var res Result
		for i := 0; i+1 < len(ops); i += 2 {
			op, arg := ops[i], ops[i+1]
			e := engines[int(arg)%len(engines)]
			tier := kvevents.Tier(op % 3)
			lo := int(arg>>4) % len(chain)
			hi := lo + 1 + int(op>>5)%(len(chain)-lo)
			switch (op >> 2) % 4 {
			case 0, 1:
				x.Store(e, tier, chain[lo:hi])
				m.store(e, tier, chain[lo:hi])
			case 2:
				x.Remove(e, tier, chain[lo:hi])
				m.remove(e, tier, chain[lo:hi])
			case 3:
				x.ClearEngine(e)
				delete(m.held, e)
			}
			lookupAgainst(t, x, m, engines, chain, &res, "op "+strconv.Itoa(i/2))
		}
	})
}
