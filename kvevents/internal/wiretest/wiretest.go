// Package wiretest is test support shared by kvevents' internal and external
// tests: msgpack built by hand, and the recorded vLLM fixtures.
package wiretest

import (
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/kvmesh/kvmesh/kvevents/internal/wire"
)

// MP builds msgpack by hand: a byte is written as is (a type tag or a raw
// byte), strings, ints, uint64s and float64s in their msgpack encodings.
func MP(parts ...any) []byte {
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
			panic("wiretest.MP: bad part")
		}
	}
	return b
}

// Fixture reads testdata/kvevents/name (recorded vLLM KV-event payloads).
func Fixture(tb testing.TB, name string) []byte {
	tb.Helper()
	_, here, _, _ := runtime.Caller(0)
	b, err := os.ReadFile(filepath.Join(filepath.Dir(here), "..", "..", "..", "testdata", "kvevents", name))
	if err != nil {
		tb.Fatal(err)
	}
	return b
}

// Fixtures names the recorded payloads.
var Fixtures = []string{"vllm_batch_array_form.msgpack", "vllm_batch_map_form.msgpack", "vllm_batch_bytes_hash_dp1.msgpack"}
