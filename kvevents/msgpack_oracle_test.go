package kvevents

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"reflect"
	"strings"
	"testing"

	"github.com/vmihailenco/msgpack/v5"

	"github.com/kvmesh/kvmesh/kvevents/internal/wiretest"
)

// The oracle: github.com/vmihailenco/msgpack/v5 parses the bytes (an
// independent msgpack implementation), and oracleBatch below interprets the
// parsed tree by the rules of spec §2 as DecodeBatch documents them. A
// difference in accept/reject or in any decoded field is a bug in one of the
// two readings; the hand-written decoder's fuzz tests otherwise only compare
// it with its own encoder.

// pair and omap keep a msgpack map's key order and duplicates.
type pair struct{ k, v any }
type omap []pair

// errOracleUndecided marks inputs the oracle does not judge (unknown ext
// types, which the library cannot parse; duplicate "events" keys).
var errOracleUndecided = errors.New("oracle: undecided")

// undecided turns the library's errors about ext values into
// errOracleUndecided: it cannot parse ext types it has no decoder for, and
// it reads ext type -128 as its own interned-string extension, which the
// msgpack spec leaves reserved (vLLM never writes ext values).
func undecided(err error) error {
	if strings.Contains(err.Error(), "ext") || strings.Contains(err.Error(), "interned string") {
		return errOracleUndecided
	}
	return err
}

// libDecode parses one msgpack value with the library and rejects trailing bytes.
func libDecode(data []byte) (any, error) {
	// Skip first: the library's untyped decode allocates a slice of the
	// header's length before reading elements (a 5-byte array header asks for
	// 64 GiB), while Skip walks the elements and fails at the end of input.
	if err := msgpack.NewDecoder(bytes.NewReader(data)).Skip(); err != nil {
		return nil, undecided(err)
	}
	r := bytes.NewReader(data)
	dec := msgpack.NewDecoder(r)
	dec.SetMapDecoder(func(d *msgpack.Decoder) (any, error) {
		n, err := d.DecodeMapLen()
		if err != nil || n < 0 {
			return nil, err
		}
		m := make(omap, 0, min(n, 64))
		for i := 0; i < n; i++ {
			k, err := d.DecodeInterfaceLoose()
			if err != nil {
				return nil, err
			}
			v, err := d.DecodeInterfaceLoose()
			if err != nil {
				return nil, err
			}
			m = append(m, pair{k, v})
		}
		return m, nil
	})
	v, err := dec.DecodeInterfaceLoose()
	if err != nil {
		return nil, undecided(err)
	}
	if r.Len() != 0 {
		return nil, fmt.Errorf("%d trailing bytes", r.Len())
	}
	return v, nil
}

// oracleInt returns an integer as (two's complement bits, negative, ok).
func oracleInt(v any) (uint64, bool, bool) {
	switch x := v.(type) {
	case int64:
		return uint64(x), x < 0, true
	case uint64:
		return x, false, true
	case int8, int16, int32, int, uint8, uint16, uint32:
		return oracleInt(reflect.ValueOf(x).Convert(reflect.TypeOf(int64(0))).Interface())
	}
	return 0, false, false
}

func oracleInt64(v any) (int64, error) {
	u, neg, ok := oracleInt(v)
	if !ok || !neg && u > math.MaxInt64 {
		return 0, fmt.Errorf("not an int64: %v", v)
	}
	return int64(u), nil
}

func oracleStr(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case []byte:
		return string(x), nil
	}
	return "", fmt.Errorf("not a string: %T", v)
}

func oracleHash(v any) (uint64, error) {
	if u, _, ok := oracleInt(v); ok {
		return u, nil
	}
	s, err := oracleStr(v)
	if err != nil {
		return 0, err
	}
	b := []byte(s)
	if len(b) > 8 {
		b = b[len(b)-8:]
	}
	var h uint64
	for _, c := range b {
		h = h<<8 | uint64(c)
	}
	return h, nil
}

func oracleFloat(v any) (float64, error) {
	switch x := v.(type) {
	case float64:
		return x, nil
	case float32:
		return float64(x), nil
	}
	u, neg, ok := oracleInt(v)
	if !ok {
		return 0, fmt.Errorf("not a number: %T", v)
	}
	if neg {
		return float64(int64(u)), nil
	}
	return float64(u), nil
}

// oracleField applies one named field to ev; nil means absent.
func oracleField(ev *Event, f field, v any) (err error) {
	if v == nil {
		return nil
	}
	switch f {
	case fieldBlockHashes:
		l, ok := v.([]any)
		if !ok {
			return errors.New("block_hashes not an array")
		}
		ev.BlockHashes = []uint64{}
		for _, x := range l {
			h, err := oracleHash(x)
			if err != nil {
				return err
			}
			ev.BlockHashes = append(ev.BlockHashes, h)
		}
	case fieldParent:
		ev.ParentHash, err = oracleHash(v)
		ev.HasParent = err == nil
	case fieldTokenIDs:
		l, ok := v.([]any)
		if !ok {
			return errors.New("token_ids not an array")
		}
		ev.TokenIDs = []uint32{}
		for _, x := range l {
			if pair, isPair := x.([]any); isPair && len(pair) == 2 { // SGLang bigram: keep the first
				if u, neg, ok := oracleInt(pair[1]); !ok || neg || u > math.MaxUint32 {
					return fmt.Errorf("bad bigram %v", x)
				}
				x = pair[0]
			}
			u, neg, ok := oracleInt(x)
			if !ok || neg || u > math.MaxUint32 {
				return fmt.Errorf("bad token id %v", x)
			}
			ev.TokenIDs = append(ev.TokenIDs, uint32(u))
		}
	case fieldBlockSize:
		n, err := oracleInt64(v)
		if err != nil || n < 0 || n > math.MaxInt32 {
			return fmt.Errorf("bad block_size %v", v)
		}
		ev.BlockSize = int(n)
	case fieldLoraID:
		ev.LoraID, err = oracleInt64(v)
		ev.HasLoraID = err == nil
	case fieldMedium:
		ev.Medium, err = oracleStr(v)
	case fieldLoraName:
		ev.LoraName, err = oracleStr(v)
	case fieldSpecKind:
		ev.SpecKind, err = oracleStr(v)
	case fieldCacheSalt:
		ev.CacheSalt, err = oracleStr(v)
	case fieldSessionID:
		ev.SessionID, err = oracleStr(v)
	case fieldSlidingWindow:
		ev.SlidingWindow, err = oracleInt64(v)
	case fieldGroupIdx:
		ev.GroupIdx, err = oracleInt64(v)
		ev.HasGroupIdx = err == nil
	case fieldExtraKeys:
		ev.ExtraKeys = []byte("present") // compared by re-parsing, see sameExtraKeys
	}
	return err
}

// oracleEvent interprets one event; ok is false for unknown event types.
func oracleEvent(v any, extra *[]any) (ev Event, ok bool, err error) {
	switch x := v.(type) {
	case []any:
		if len(x) == 0 {
			return ev, false, errors.New("empty event")
		}
		tag, err := oracleStr(x[0])
		if err != nil {
			return ev, false, err
		}
		ev.Kind = kindOf([]byte(tag))
		names := map[EventKind][]field{BlockStored: storedFields[:], BlockRemoved: removedFields[:]}[ev.Kind]
		for i := 1; i < len(x) && i < len(names); i++ {
			if err := oracleField(&ev, names[i], x[i]); err != nil {
				return ev, false, err
			}
			if names[i] == fieldExtraKeys && x[i] != nil {
				*extra = append(*extra, x[i])
			}
		}
	case omap:
		sawType := false
		var ek any
		for _, p := range x {
			key, err := oracleStr(p.k)
			if err != nil {
				return ev, false, err
			}
			if key == "type" {
				tag, err := oracleStr(p.v)
				if err != nil {
					return ev, false, err
				}
				ev.Kind, sawType = kindOf([]byte(tag)), true
				continue
			}
			f := fieldByName([]byte(key))
			if sawType && ev.Kind == 0 {
				f = fieldUnknown
			}
			if err := oracleField(&ev, f, p.v); err != nil {
				return ev, false, err
			}
			if f == fieldExtraKeys && p.v != nil {
				ek = p.v
			}
		}
		if !sawType {
			return ev, false, errors.New("event map without type")
		}
		if ek != nil && ev.Kind == BlockStored {
			*extra = append(*extra, ek)
		}
	default:
		return ev, false, fmt.Errorf("event is %T", v)
	}
	if ev.Kind == 0 {
		return ev, false, nil
	}
	ev.normalize()
	return ev, true, nil
}

func oracleEvents(v any, b *Batch, extra *[]any) error {
	if v == nil {
		return nil
	}
	l, ok := v.([]any)
	if !ok {
		return errors.New("events not an array")
	}
	for _, x := range l {
		ev, known, err := oracleEvent(x, extra)
		if err != nil {
			return err
		}
		if !known {
			b.Skipped++
			continue
		}
		b.Events = append(b.Events, ev)
	}
	return nil
}

func oracleRank(v any, b *Batch) error {
	if v == nil {
		b.DPRank, b.HasDPRank = 0, false
		return nil
	}
	n, err := oracleInt64(v)
	if err != nil || n < 0 || n > math.MaxInt32 {
		return fmt.Errorf("bad rank %v", v)
	}
	b.DPRank, b.HasDPRank = int(n), true
	return nil
}

// oracleBatch interprets a parsed envelope; extra collects the extra_keys
// values of the kept BlockStored events, in order.
func oracleBatch(v any) (b Batch, extra []any, err error) {
	switch x := v.(type) {
	case []any:
		if len(x) < 2 {
			return b, nil, errors.New("short envelope")
		}
		if b.TS, err = oracleFloat(x[0]); err != nil {
			return b, nil, err
		}
		if err := oracleEvents(x[1], &b, &extra); err != nil {
			return b, nil, err
		}
		if len(x) >= 3 {
			err = oracleRank(x[2], &b)
		}
		return b, extra, err
	case omap:
		sawEvents := false
		for _, p := range x {
			key, err := oracleStr(p.k)
			if err != nil {
				return b, nil, err
			}
			switch key {
			case "ts":
				if b.TS, err = oracleFloat(p.v); err != nil {
					return b, nil, err
				}
			case "events":
				if sawEvents {
					return b, nil, errOracleUndecided
				}
				sawEvents = true
				err = oracleEvents(p.v, &b, &extra)
			case "data_parallel_rank", "attn_dp_rank", "dp_rank":
				err = oracleRank(p.v, &b)
			}
			if err != nil {
				return b, nil, err
			}
		}
		if !sawEvents {
			return b, nil, errors.New("map envelope without events")
		}
		return b, extra, nil
	}
	return b, nil, fmt.Errorf("envelope is %T", v)
}

// checkAgainstOracle decodes data both ways and reports any difference.
func checkAgainstOracle(t *testing.T, data []byte) {
	t.Helper()
	var got Batch
	ourErr := DecodeBatch(data, &got)
	tree, err := libDecode(data)
	var want Batch
	var extra []any
	if err == nil {
		want, extra, err = oracleBatch(tree)
	}
	if errors.Is(err, errOracleUndecided) {
		return
	}
	if (ourErr != nil) != (err != nil) {
		t.Fatalf("DecodeBatch err=%v, oracle err=%v\ninput % x", ourErr, err, data)
	}
	if ourErr != nil {
		return
	}
	if got.TS != want.TS && !(math.IsNaN(got.TS) && math.IsNaN(want.TS)) || got.DPRank != want.DPRank ||
		got.HasDPRank != want.HasDPRank || got.Skipped != want.Skipped || len(got.Events) != len(want.Events) {
		t.Fatalf("batch header differs:\n ours %+v\n want %+v\ninput % x", got, want, data)
	}
	k := 0
	for i := range got.Events {
		g, w := got.Events[i], want.Events[i]
		if (len(g.ExtraKeys) > 0) != (len(w.ExtraKeys) > 0) {
			t.Fatalf("event %d: extra_keys presence differs\ninput % x", i, data)
		}
		if len(g.ExtraKeys) > 0 {
			sameExtraKeys(t, g.ExtraKeys, extra[k])
			k++
		}
		g.ExtraKeys, w.ExtraKeys = nil, nil
		if !sameEvent(g, w) {
			t.Fatalf("event %d differs:\n ours %+v\n want %+v\ninput % x", i, g, w, data)
		}
	}
}

// sameExtraKeys: our raw extra_keys bytes re-parse to the oracle's value.
func sameExtraKeys(t *testing.T, raw []byte, want any) {
	t.Helper()
	got, err := libDecode(raw)
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Fatalf("extra_keys: ours re-parse to %#v (%v), oracle %#v", got, err, want)
	}
}

func sameEvent(a, b Event) bool {
	return a.Kind == b.Kind && slicesEqual(a.BlockHashes, b.BlockHashes) && slicesEqual(a.TokenIDs, b.TokenIDs) &&
		a.ParentHash == b.ParentHash && a.HasParent == b.HasParent && a.BlockSize == b.BlockSize &&
		a.LoraID == b.LoraID && a.HasLoraID == b.HasLoraID && a.LoraName == b.LoraName && a.SpecKind == b.SpecKind &&
		a.SlidingWindow == b.SlidingWindow && a.CacheSalt == b.CacheSalt && a.SessionID == b.SessionID &&
		a.Medium == b.Medium && a.GroupIdx == b.GroupIdx && a.HasGroupIdx == b.HasGroupIdx
}

func slicesEqual[T comparable](a, b []T) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// FuzzDecodeBatchOracle compares DecodeBatch with the msgpack library plus
// the spec's interpretation on arbitrary input.
func FuzzDecodeBatchOracle(f *testing.F) {
	for _, name := range wiretest.Fixtures {
		f.Add(wiretest.Fixture(f, name))
	}
	// Shapes the oracle found or that sit on its edges: duplicate event keys,
	// signed-encoded token ids, bin strings, fields before an unknown type.
	f.Add(wiretest.MP(byte(0x92), 1.5, byte(0x91), byte(0x83), "type", "BlockStored", "block_hashes", byte(0x92), 7, 8, "block_hashes", byte(0x91), 9))
	f.Add(wiretest.MP(byte(0x92), 1, byte(0x91), byte(0x93), "BlockStored", byte(0x91), byte(0xd0), byte(0x05), byte(0xc0)))
	f.Add(wiretest.MP(byte(0x82), "events", byte(0x91), byte(0x82), "token_ids", byte(0x91), byte(0xff), "type", "Future", "ts", 2))
	// SGLang EAGLE bigram token ids, and a bad pair.
	f.Add(wiretest.MP(byte(0x92), 1.5, byte(0x91), byte(0x97), "BlockStored", byte(0x91), 1, byte(0xc0),
		byte(0x92), byte(0x92), 1, 2, byte(0x92), 2, 3, 2, byte(0xc0), "GPU"))
	f.Add(wiretest.MP(byte(0x92), 1.5, byte(0x91), byte(0x95), "BlockStored", byte(0x91), 1, byte(0xc0),
		byte(0x92), byte(0x92), 1, -2, byte(0x93), 2, 3, 4, 2))
	f.Fuzz(func(t *testing.T, data []byte) {
		checkAgainstOracle(t, data)
	})
}

// TestOracleFixtures: the real vLLM payloads decode identically both ways.
func TestOracleFixtures(t *testing.T) {
	for _, name := range []string{"vllm_batch_array_form.msgpack", "vllm_batch_map_form.msgpack", "vllm_batch_bytes_hash_dp1.msgpack"} {
		data := wiretest.Fixture(t, name)
		tree, err := libDecode(data)
		if err != nil {
			t.Fatalf("%s: library: %v", name, err)
		}
		want, _, err := oracleBatch(tree)
		if err != nil || len(want.Events) == 0 {
			t.Fatalf("%s: oracle: %v, %d events", name, err, len(want.Events))
		}
		checkAgainstOracle(t, data)
	}
}

// oracleDelta interprets a parsed delta by the layout in delta.go:
// [1, 1, engine, model, epoch, seq, ts, [[kind, tier, keys bin], ...], epoch start?, ...].
func oracleDelta(v any) (Delta, error) {
	var d Delta
	a, ok := v.([]any)
	if !ok || len(a) < 8 {
		return d, errors.New("delta: not an array of 8+ fields")
	}
	uints := make([]uint64, 0, 4)
	for _, i := range []int{0, 1, 4, 5} {
		u, neg, ok := oracleInt(a[i])
		if !ok || neg {
			return d, fmt.Errorf("delta field %d: not a uint", i)
		}
		uints = append(uints, u)
	}
	if uints[0] != DeltaVersion || uints[1] != msgDelta {
		return d, errors.New("delta: version or kind")
	}
	var err error
	if d.Engine, err = oracleStr(a[2]); err != nil {
		return d, err
	}
	if d.Model, err = oracleStr(a[3]); err != nil {
		return d, err
	}
	d.Epoch, d.Seq = uints[2], uints[3]
	ts, _, ok := oracleInt(a[6])
	if !ok {
		return d, errors.New("delta: ts")
	}
	d.TS = int64(ts)
	ops, ok := a[7].([]any)
	if !ok {
		return d, errors.New("delta: ops")
	}
	for _, o := range ops {
		f, ok := o.([]any)
		if !ok || len(f) < 3 {
			return d, errors.New("delta: op")
		}
		kind, neg1, ok1 := oracleInt(f[0])
		tier, neg2, ok2 := oracleInt(f[1])
		keys, ok3 := f[2].([]byte)
		if !ok1 || !ok2 || !ok3 || neg1 || neg2 || kind < 1 || kind > 3 || tier >= NumTiers || len(keys)%8 != 0 {
			return d, errors.New("delta: op fields")
		}
		op := Op{Kind: OpKind(kind), Tier: Tier(tier)}
		for i := 0; i < len(keys); i += 8 {
			var k uint64
			for j := 7; j >= 0; j-- {
				k = k<<8 | uint64(keys[i+j])
			}
			op.Keys = append(op.Keys, k)
		}
		d.Ops = append(d.Ops, op)
	}
	if len(a) > 8 { // the optional epoch start: an int, else an unknown field
		if u, _, ok := oracleInt(a[8]); ok {
			d.EpochStart = int64(u)
		}
	}
	return d, nil
}

// FuzzDecodeDeltaOracle: what the library cannot parse DecodeDelta rejects,
// and what DecodeDelta accepts the library plus oracleDelta read the same.
// (The other direction is not judged: DecodeDelta is stricter than msgpack
// on purpose, rejecting signed encodings of uint fields and deep trailing
// values, which the library's untyped decode cannot see.)
func FuzzDecodeDeltaOracle(f *testing.F) {
	f.Add(AppendDelta(nil, sampleDelta()))
	f.Add(AppendDelta(nil, &Delta{Engine: "e", Ops: []Op{{Kind: OpClear, Tier: TierCPU}}}))
	f.Add(AppendDelta(nil, &Delta{Engine: "e", Epoch: 3, EpochStart: 1757500000250000000}))
	f.Add([]byte{0x98, 1, 1})
	f.Fuzz(func(t *testing.T, data []byte) {
		var got Delta
		ourErr := DecodeDelta(data, &got)
		tree, libErr := libDecode(data)
		if errors.Is(libErr, errOracleUndecided) {
			return
		}
		if libErr != nil {
			if ourErr == nil {
				t.Fatalf("DecodeDelta accepted what msgpack cannot parse (%v): % x", libErr, data)
			}
			return
		}
		if ourErr != nil {
			return
		}
		want, err := oracleDelta(tree)
		if err != nil {
			t.Fatalf("DecodeDelta accepted, oracle: %v\ninput % x", err, data)
		}
		if !reflect.DeepEqual(normalize(&got), normalize(&want)) {
			t.Fatalf("delta differs:\n ours %+v\n want %+v\ninput % x", got, want, data)
		}
	})
}
