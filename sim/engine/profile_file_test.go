package engine

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
