package kvevents

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

// The decoder's internal tests (the msgpack oracle) need these helpers; the
// external tests (package kvevents_test, which use kvtest's encoder and so
// cannot be internal) have their own copies of the same names.

func readFixture(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "testdata", "kvevents", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// mp concatenates msgpack parts: bytes as they are, strings, ints, uints and
// floats in their smallest encoding.
func mp(parts ...any) []byte {
	var b []byte
	for _, p := range parts {
		switch v := p.(type) {
		case byte:
			b = append(b, v)
		case []byte:
			b = append(b, v...)
		case string:
			b = wire.AppendStr(b, v)
		case int:
			b = wire.AppendInt(b, int64(v))
		case uint64:
			b = wire.AppendUint(b, v)
		case float64:
			b = wire.AppendFloat64(b, v)
		default:
			panic("mp: bad part")
		}
	}
	return b
}

// fuzzSeeds adds the fixtures and a few hand-made batches (the external
// tests' copy also adds encoder output).
func fuzzSeeds(f *testing.F) {
	for _, name := range []string{"vllm_batch_array_form.msgpack", "vllm_batch_map_form.msgpack", "vllm_batch_bytes_hash_dp1.msgpack"} {
		f.Add(readFixture(f, name))
	}
	f.Add(mp(byte(0x84), "ts", 2.0, "future", byte(0x91), 7, "events", byte(0x90), "attn_dp_rank", 3))
	f.Add([]byte{0x92, 0xcb, 0, 0, 0, 0, 0, 0, 0, 0, 0xdd, 0xff, 0xff, 0xff, 0xff})
}
