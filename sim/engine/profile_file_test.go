package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

const l40sFile = `name: my-l40s
params: 7.62e9
weightBytes: 15.2e9
layers: 28
hidden: 3584
kvBytesPerToken: 57344
flops: 144.8e12
memBW: 691.2e9
hostBW: 25e9
stepOverhead: 2ms
perSeqOverhead: 20us
maxNumSeqs: 256
maxNumBatchedTokens: 2048
`

// TestProfileFileMatchesBuiltin: the file form of 7b-l40s times a prefill
// and a decode step exactly like the built-in profile.
func TestProfileFileMatchesBuiltin(t *testing.T) {
	path := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(path, []byte(l40sFile), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := LoadProfileFile(path)
	if err != nil {
		t.Fatal(err)
	}
	want, _ := LookupProfile("7b-l40s")
	if got.Name != "my-l40s" || got.MaxNumSeqs != 256 || got.StepOverhead != 2*time.Millisecond {
		t.Fatalf("decoded %+v", got)
	}
	if g, w := got.PrefillTime(0, 2000), want.PrefillTime(0, 2000); g != w {
		t.Errorf("prefill 2000: file %v, built-in %v", g, w)
	}
	if g, w := got.DecodeStepTime(64, 100_000), want.DecodeStepTime(64, 100_000); g != w {
		t.Errorf("decode step: file %v, built-in %v", g, w)
	}
	pr, sb, dt := got.Rates()
	if pr < 9500 || pr > 9510 || sb < 0.0239 || sb > 0.0241 || dt < 8.2e-8 || dt > 8.4e-8 {
		t.Errorf("rates %v %v %v", pr, sb, dt)
	}
}

func TestProfileFileErrors(t *testing.T) {
	for name, doc := range map[string]string{
		"unknown key":  l40sFile + "bogus: 1\n",
		"bad duration": "name: x\nparams: 1e9\nweightBytes: 1e9\nlayers: 1\nhidden: 1\nkvBytesPerToken: 1\nflops: 1e12\nmemBW: 1e12\nstepOverhead: soon\n",
		"missing":      "name: x\nparams: 1e9\n",
		"negative":     "name: x\nparams: 1e9\nweightBytes: 1e9\nlayers: 1\nhidden: 1\nkvBytesPerToken: 1\nflops: 1e12\nmemBW: -1\n",
		"not yaml":     "{",
	} {
		if _, err := ParseProfile([]byte(doc)); !errors.Is(err, ErrProfileFile) {
			t.Errorf("%s: err %v, want ErrProfileFile", name, err)
		}
	}
	if _, err := LoadProfileFile(filepath.Join(t.TempDir(), "none.yaml")); !errors.Is(err, ErrProfileFile) {
		t.Errorf("missing file: %v", err)
	}
}

// FuzzParseProfile: any input gives a valid profile or an error, never a
// panic.
func FuzzParseProfile(f *testing.F) {
	f.Add([]byte(l40sFile))
	f.Add([]byte(`{"params": 1e9, "weightBytes": 1e9, "layers": 2, "hidden": 64, "kvBytesPerToken": 8, "flops": 1e12, "memBW": 1e11}`))
	f.Add([]byte("stepOverhead: -5s\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		p, err := ParseProfile(b)
		if err != nil {
			return
		}
		if errs := p.validate(); len(errs) > 0 {
			t.Fatalf("accepted an invalid profile: %v", errs)
		}
	})
}

// TestProfileFileOneDocument: a second YAML document is an error (it was
// ignored: the first document's profile ran), a trailing "---" alone is
// not; an empty file says so (it said "EOF").
func TestProfileFileOneDocument(t *testing.T) {
	if _, err := ParseProfile([]byte(l40sFile + "---\n" + l40sFile)); !errors.Is(err, ErrProfileFile) ||
		!strings.Contains(err.Error(), "a second YAML document is not allowed (one profile per file)") {
		t.Errorf("second document: %v", err)
	}
	if _, err := ParseProfile([]byte(l40sFile + "---\n{]\n")); !errors.Is(err, ErrProfileFile) ||
		!strings.Contains(err.Error(), "second YAML document") {
		t.Errorf("broken second document: %v", err)
	}
	if _, err := ParseProfile([]byte("---\n" + l40sFile + "---\n")); err != nil {
		t.Errorf("one document between separators: %v", err)
	}
	for _, empty := range []string{"", "\n  \n", "# nothing yet\n"} {
		if _, err := ParseProfile([]byte(empty)); !errors.Is(err, ErrProfileFile) || !strings.Contains(err.Error(), "the file is empty") {
			t.Errorf("%q: %v", empty, err)
		}
	}
}

// TestProfileFileNumbers: numbers are YAML 1.2's (362e12 needs no dot), and
// a value that is not the number its key wants is an error naming the
// line, the key, the value and what was wanted (the decoder said "cannot
// unmarshal !!str `362e12` into float64", or truncated 2.5 sequences to 2).
func TestProfileFileNumbers(t *testing.T) {
	with := func(key, value string) string { // l40sFile with key's line set to value
		var b strings.Builder
		for _, l := range strings.SplitAfter(l40sFile, "\n") {
			if strings.HasPrefix(l, key+":") {
				l = key + ": " + value + "\n"
			}
			b.WriteString(l)
		}
		return b.String()
	}
	for _, c := range []struct {
		doc  string
		want float64 // FLOPS, or MaxNumSeqs
	}{
		{with("flops", "362e12"), 362e12},
		{with("flops", "362E+12"), 362e12},
		{with("flops", "362_000_000_000_000"), 362e12},
		{with("flops", "362e12 # H200 dense BF16"), 362e12},
		{with("maxNumSeqs", "2.56e2"), 256},
	} {
		p, err := ParseProfile([]byte(c.doc))
		if err != nil {
			t.Errorf("%s: %v", c.doc, err)
			continue
		}
		if p.FLOPS != c.want && float64(p.MaxNumSeqs) != c.want {
			t.Errorf("flops %v, maxNumSeqs %d, want %v:\n%s", p.FLOPS, p.MaxNumSeqs, c.want, c.doc)
		}
	}
	for _, c := range []struct {
		doc  string
		want []string
	}{
		{with("flops", "'362e12'"), []string{"line 7: flops: ", `"362e12" is quoted`, "want a number", "unquoted"}},
		{with("flops", `"362e12"`), []string{"line 7: flops: ", `"362e12" is quoted`}},
		{`{"params": 1e9, "weightBytes": 1e9, "layers": 2, "hidden": 64, "kvBytesPerToken": 8, "flops": "362e12", "memBW": 1e11}`,
			[]string{"line 1: flops: ", `"362e12" is quoted`}},
		{with("flops", "362 TFLOPS"), []string{"line 7: flops: ", `"362 TFLOPS" is not a number`, "want a number"}},
		{with("flops", "1e400"), []string{"line 7: flops: ", "1e400: out of a float64's range"}},
		{with("flops", "[362e12]"), []string{"line 7: flops: ", "not a list"}},
		{with("flops", "true"), []string{"line 7: flops: ", "true is not a number"}},
		{with("maxNumSeqs", "2.5"), []string{"line 12: maxNumSeqs: ", "2.5: want a whole number", "not a fraction"}},
		{with("layers", "1e30"), []string{"line 4: layers: ", "1e30: out of range"}},
		{with("memBW", "'691.2e9'") + "bogus: 1\n", []string{"line 8: memBW: ", "line 14: unknown key \"bogus\"", "(the keys: name, params,"}},
		{"base: &b {flops: '1e12'}\n", []string{`line 1: unknown key "base"`}},
		{"<<: {flops: '1e12'}\nname: x\n", []string{"line 1: flops: ", `"1e12" is quoted`}},
	} {
		_, err := ParseProfile([]byte(c.doc))
		if !errors.Is(err, ErrProfileFile) {
			t.Errorf("%s: err %v, want ErrProfileFile", c.doc, err)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("error %q does not say %q:\n%s", err, w, c.doc)
			}
		}
	}
}

// FuzzProfileNumber sets flops to any one-line value: the file is accepted
// only with the number the YAML decoder reads there, and whenever the
// decoder cannot read a float64 there the error names the key (it said
// "cannot unmarshal !!str ... into float64").
func FuzzProfileNumber(f *testing.F) {
	for _, s := range []string{"144.8e12", "362e12", "'362e12'", "1e400", "362 TFLOPS", "[1]", "{a: 1}", "true", ".inf", "~", "*x", "&x 1", "0x10", "1_0"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if strings.ContainsAny(s, "\r\n") {
			return
		}
		doc := strings.Replace(l40sFile, "flops: 144.8e12", "flops: "+s, 1)
		p, err := ParseProfile([]byte(doc))
		var plain struct {
			FLOPS float64 `yaml:"flops"`
		}
		yerr := yaml.Unmarshal([]byte(doc), &plain)
		if err == nil && (yerr != nil || plain.FLOPS != p.FLOPS) {
			t.Fatalf("flops: %s: accepted as %v; the decoder reads %v, %v", s, p.FLOPS, plain.FLOPS, yerr)
		}
		if yerr != nil && strings.Contains(yerr.Error(), "line 7: cannot unmarshal") && (err == nil || !strings.Contains(err.Error(), "line 7: flops: ")) {
			t.Fatalf("flops: %s: error %v does not name the key (the decoder: %v)", s, err, yerr)
		}
	})
}

// TestProfileFileNegativeNamesOnlyThem: "layers -1, hidden 0" names each
// negative field by itself (it said "layers -1, hidden 0: must not be
// negative", and 0 is not negative), beside the "> 0" line that covers
// the zero.
func TestProfileFileNegativeNamesOnlyThem(t *testing.T) {
	_, err := ParseProfile([]byte("name: x\nparams: 1e9\nweightBytes: 1e9\nlayers: -1\nhidden: 0\nkvBytesPerToken: 1\nflops: 1e12\nmemBW: 1e12\n"))
	if err == nil || !strings.Contains(err.Error(), `profile "x": layers -1: must not be negative`) || strings.Contains(err.Error(), "hidden 0: must not") ||
		!strings.Contains(err.Error(), "layers, hidden, kvBytesPerToken and weightBytes must be > 0") {
		t.Errorf("err %v", err)
	}
}
