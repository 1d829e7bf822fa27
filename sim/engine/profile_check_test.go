package engine

import (
	"errors"
	"math"
	"strings"
	"testing"
	"time"
)

// withLine is l40sFile with key's line replaced by "key: value".
func withLine(t *testing.T, key, value string) string {
	t.Helper()
	var out []string
	found := false
	for _, l := range strings.Split(strings.TrimSuffix(l40sFile, "\n"), "\n") {
		if strings.HasPrefix(l, key+":") {
			l, found = key+": "+value, true
		}
		out = append(out, l)
	}
	if !found {
		t.Fatalf("no %s line", key)
	}
	return strings.Join(out, "\n") + "\n"
}

// TestProfileFileNonFinite: a NaN or infinite number in any float field
// of a profile file is an error naming the field (NaN passed every "<= 0"
// test, so every policy then reported TTFT 0.000; .inf made prefill free).
func TestProfileFileNonFinite(t *testing.T) {
	for _, key := range []string{"params", "weightBytes", "kvBytesPerToken", "flops", "memBW", "hostBW"} {
		for _, v := range []string{".nan", ".inf", "-.inf"} {
			_, err := ParseProfile([]byte(withLine(t, key, v)))
			if !errors.Is(err, ErrProfileFile) || !strings.Contains(err.Error(), key+" ") || !strings.Contains(err.Error(), "finite") {
				t.Errorf("%s: %s: %v, want an error naming %s", key, v, err, key)
			}
		}
	}
	// Every problem is listed, not just the first.
	doc := strings.Replace(withLine(t, "flops", ".nan"), "memBW: 691.2e9", "memBW: .inf", 1)
	_, err := ParseProfile([]byte(doc))
	if !errors.Is(err, ErrProfileFile) || !strings.Contains(err.Error(), "flops NaN") || !strings.Contains(err.Error(), "memBW +Inf") {
		t.Errorf("flops .nan and memBW .inf: %v, want both named", err)
	}
	// A Config's profile is held to the same rule.
	p, _ := LookupProfile("tiny")
	p.MemBW = math.NaN()
	if err := (Config{Profile: p}).Defaults().Validate(); !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "memBW NaN") {
		t.Errorf("config with memBW NaN: %v", err)
	}
}

// TestProfileFileImplausible: numbers in the wrong units (TFLOP/s, GB/s)
// or absurdly small are refused, naming the field and the likely mistake,
// instead of a DES that hangs on 10^7-second steps or overflows them into
// free ones.
func TestProfileFileImplausible(t *testing.T) {
	for _, c := range []struct {
		name, doc string
		want      []string
	}{
		{"TFLOP/s", withLine(t, "flops", "144.8"), []string{"flops 144.8", "not TFLOP/s", "144.8e12"}},
		{"GB/s", withLine(t, "memBW", "691.2"), []string{"memBW 691.2", "not GB/s", "691.2e9"}},
		{"both", strings.Replace(withLine(t, "flops", "145"), "memBW: 691.2e9", "memBW: 691", 1), []string{"flops 145 ", "memBW 691 ", "decode step", "prefill"}},
		{"tiny flops", withLine(t, "flops", "1e-10"), []string{"flops 1e-10", "FLOP/s"}},
		{"overhead", withLine(t, "stepOverhead", "20s"), []string{"stepOverhead 20s", "decode step"}},
	} {
		_, err := ParseProfile([]byte(c.doc))
		if !errors.Is(err, ErrProfileFile) {
			t.Errorf("%s: %v, want ErrProfileFile", c.name, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: %v\nwant it to say %q", c.name, err, w)
			}
		}
	}
	// Slow but real: 1 TFLOP/s and 10 GB/s still pass.
	doc := strings.Replace(withLine(t, "flops", "1e12"), "memBW: 691.2e9", "memBW: 10e9", 1)
	if _, err := ParseProfile([]byte(doc)); err != nil {
		t.Errorf("a slow GPU: %v", err)
	}
}

// TestBuiltinProfilesPlausible: every built-in profile passes the checks a
// profile file must pass.
func TestBuiltinProfilesPlausible(t *testing.T) {
	for _, name := range ProfileNames() {
		p, _ := LookupProfile(name)
		if errs := append(p.validate(), p.plausible()...); len(errs) > 0 {
			t.Errorf("%s: %v", name, errors.Join(errs...))
		}
	}
}

// TestStepTimeSaturates: a step far too long for a time.Duration (a
// profile built in code, which plausible does not check) saturates at
// maxStepTime instead of overflowing into a negative duration clamped to
// 1 µs, and step times never decrease with more work.
func TestStepTimeSaturates(t *testing.T) {
	p, _ := LookupProfile("7b-l40s")
	p.FLOPS, p.MemBW = 145, 691 // TFLOP/s and GB/s: ~1e11 s per 1,024-token prefill
	if d := p.PrefillTime(0, 1024); d != maxStepTime {
		t.Errorf("prefill at 145 FLOP/s: %v, want saturated at %v", d, maxStepTime)
	}
	if d := p.DecodeStepTime(1, 1024); d != maxStepTime {
		t.Errorf("decode step at 145 FLOP/s, 691 bytes/s: %v, want saturated at %v", d, maxStepTime)
	}
	p.FLOPS, p.MemBW = 145e12, 691e3 // long but representable: (15.2e9 + 57344·1024) / 691e3 ≈ 22,082 s
	if d := p.DecodeStepTime(1, 1024); d < 22000*time.Second || d > 22200*time.Second {
		t.Errorf("decode step at 691 kB/s: %v, want ≈ 22,082 s", d)
	}
	p.PerSeqOverhead = time.Duration(math.MaxInt64 / 2)
	if d := p.DecodeStepTime(3, 1024); d != maxStepTime {
		t.Errorf("huge per-sequence overhead × 3: %v, want %v", d, maxStepTime)
	}
	q, _ := LookupProfile("7b-l40s")
	prev := time.Duration(0)
	for n := 1; n <= 1<<30; n *= 4 {
		d := q.PrefillTime(0, n)
		if d < prev || d <= 0 || d > maxStepTime {
			t.Fatalf("prefill of %d tokens: %v after %v", n, d, prev)
		}
		prev = d
	}
}
