package learn

import (
	"bytes"
	"errors"
	"math"
	"testing"
)

// fed returns the own Stats of a learner fed samples of engines e0 and e1
// (n×20 samples), and its pooled Stats.
func fed(t testing.TB, n int) ([]EngineStats, Stats) {
	t.Helper()
	l, err := New(Config{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range samples(20*n, 5) {
		s.feed(l)
	}
	return l.Own(nil)
}

func TestShareRoundTrip(t *testing.T) {
	own, pooled := fed(t, 3)
	var buf bytes.Buffer
	if err := EncodeShare(&buf, 1<<63+5, &pooled, own); err != nil {
		t.Fatal(err)
	}
	sh, err := DecodeShare(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if sh.Epoch != 1<<63+5 || sh.Pooled != pooled || len(sh.Engines) != len(own) {
		t.Fatalf("pooled %+v engines %d; want %+v and %d", sh.Pooled, len(sh.Engines), pooled, len(own))
	}
	for i, e := range sh.Engines {
		if e.Engine != own[i].Engine || e.Stats != own[i].Stats {
			t.Errorf("engine %d: %+v, want %+v", i, e, own[i])
		}
	}
	// Every strict prefix is refused, so is a trailing byte, another
	// version, and a count larger than the bytes could hold.
	b := buf.Bytes()
	for n := 0; n < len(b); n++ {
		if _, err := DecodeShare(b[:n]); !errors.Is(err, ErrWire) {
			t.Fatalf("prefix of %d bytes: err %v", n, err)
		}
	}
	var none bytes.Buffer
	if err := EncodeShare(&none, 7, &pooled, nil); err != nil || none.Bytes()[none.Len()-1] != 0x90 {
		t.Fatalf("a share without engines: %v, % x", err, none.Bytes())
	}
	huge := append(none.Bytes()[:none.Len()-1:none.Len()-1], 0xdd, 0x7f, 0xff, 0xff, 0xff) // array of 2³¹−1 engines
	for name, bad := range map[string][]byte{
		"trailing":    append(append([]byte(nil), b...), 0xc0),
		"version 2":   append([]byte{0x94, 0x02}, b[2:]...),
		"not a share": []byte(`{"v":1}`),
		"huge count":  huge,
		"no epoch":    append([]byte{0x93}, b[1:]...),
	} {
		if _, err := DecodeShare(bad); !errors.Is(err, ErrWire) {
			t.Errorf("%s: err %v, want ErrWire", name, err)
		}
	}
}

// FuzzDecodeShare: any bytes decode or fail cleanly; what decodes
// encodes back to a share that decodes to the same sums.
func FuzzDecodeShare(f *testing.F) {
	own, pooled := fed(f, 3)
	var buf bytes.Buffer
	if err := EncodeShare(&buf, 42, &pooled, own); err != nil {
		f.Fatal(err)
	}
	f.Add(buf.Bytes())
	f.Add([]byte{0x93, 0x01})
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		sh, err := DecodeShare(b)
		if err != nil {
			if !errors.Is(err, ErrWire) {
				t.Fatalf("error not wrapping ErrWire: %v", err)
			}
			return
		}
		var out bytes.Buffer
		if err := EncodeShare(&out, sh.Epoch, &sh.Pooled, sh.Engines); err != nil {
			t.Fatal(err)
		}
		again, err := DecodeShare(out.Bytes())
		if err != nil {
			t.Fatalf("re-encoded share does not decode: %v", err)
		}
		same := func(a, b Stats) bool { // NaN ≠ NaN: compare bits
			for i := range a.Prefill {
				if math.Float64bits(a.Prefill[i]) != math.Float64bits(b.Prefill[i]) {
					return false
				}
			}
			for i := range a.Decode {
				if math.Float64bits(a.Decode[i]) != math.Float64bits(b.Decode[i]) {
					return false
				}
			}
			return true
		}
		if again.Epoch != sh.Epoch || !same(again.Pooled, sh.Pooled) || len(again.Engines) != len(sh.Engines) {
			t.Fatalf("round trip changed the share")
		}
		for i := range sh.Engines {
			if again.Engines[i].Engine != sh.Engines[i].Engine || !same(again.Engines[i].Stats, sh.Engines[i].Stats) {
				t.Fatalf("round trip changed engine %d", i)
			}
		}
		// Whatever decodes, a learner takes or refuses without panicking.
		l, _ := New(Config{})
		_ = l.SetPeer("p", sh.Pooled, sh.Engines)
		_ = l.Rates("x")
	})
}
