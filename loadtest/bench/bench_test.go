package bench

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestPrepare(t *testing.T) {
	o := DefaultOptions()
	cfg, names, err := o.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Engines != 8 || cfg.Engine.Profile.Name != DefaultProfile || len(names) != len(DefaultPolicies()) {
		t.Fatalf("%+v %v", cfg, names)
	}
	for _, p := range names {
		if p == "weighted" {
			t.Fatal("weighted among the defaults without a config")
		}
	}
	o.Engines, o.Policies, o.Workload = 0, []string{"kvmesh", "nope"}, "trace"
	_, _, err = o.Prepare()
	if !errors.Is(err, ErrUsage) || strings.Contains(err.Error(), "\n") {
		t.Fatalf("want one usage line: %v", err)
	}
	for _, w := range []string{"--engines 0", `unknown policy "nope"`, "--workload trace needs --trace"} {
		if !strings.Contains(err.Error(), w) {
			t.Errorf("%v does not name %q", err, w)
		}
	}
}

// TestProfileFile: --profile-file replaces the named profile, and a bad
// file is a usage error naming the flag.
func TestProfileFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "gpu.yaml")
	doc := "name: my-gpu\nparams: 7e9\nweightBytes: 14e9\nlayers: 32\nhidden: 4096\nkvBytesPerToken: 131072\nflops: 100e12\nmemBW: 1e12\nstepOverhead: 3ms\n"
	if err := os.WriteFile(path, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	o := DefaultOptions()
	o.ProfileFile = path
	cfg, _, err := o.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	if p := cfg.Engine.Profile; p.Name != "my-gpu" || p.FLOPS != 100e12 || p.StepOverhead != 3*time.Millisecond {
		t.Fatalf("profile %+v", p)
	}
	o.ProfileFile = filepath.Join(t.TempDir(), "missing.yaml")
	if _, _, err := o.Prepare(); !errors.Is(err, ErrUsage) || !strings.Contains(err.Error(), "--profile-file") {
		t.Fatalf("missing file: %v", err)
	}
}

// TestDESProgress: the DES reports progress on Options.Progress (the
// command's stderr unless --quiet); live mode's comes from the load
// generator, not the DES config.
func TestDESProgress(t *testing.T) {
	var w strings.Builder
	o := DefaultOptions()
	o.Progress = &w
	cfg, _, err := o.Prepare()
	if err != nil || cfg.Progress != &w {
		t.Fatalf("des: progress %v, err %v", cfg.Progress, err)
	}
	o.Mode, o.Engines = "live", 2
	if cfg, _, err = o.Prepare(); err != nil || cfg.Progress != nil {
		t.Fatalf("live: des progress %v, err %v", cfg.Progress, err)
	}
}

// TestProfilesDocDefaultCapacity: docs/BENCHMARKS.md's "Profiles"
// paragraph gives the KV cache a run without --gpu-blocks has, as the
// bench's default options make it: it described the default profile as
// holding 480k tokens of KV while such a run simulates 4,096 blocks
// (65,536 tokens; tester h-trace).
func TestProfilesDocDefaultCapacity(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "docs", "BENCHMARKS.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	i := strings.Index(doc, "\nProfiles (docs/SIMULATOR.md")
	if i < 0 {
		t.Fatal(`docs/BENCHMARKS.md has no "Profiles" paragraph`)
	}
	para := doc[i+1:]
	para = para[:strings.Index(para, "\n\n")]
	o := DefaultOptions()
	cfg, _, err := o.Prepare()
	if err != nil {
		t.Fatal(err)
	}
	e := cfg.Engine.Defaults()
	comma := func(n int) string { // 65536 → 65,536
		s := strconv.Itoa(n)
		for j := len(s) - 3; j > 0; j -= 3 {
			s = s[:j] + "," + s[j:]
		}
		return s
	}
	for _, want := range []string{
		"`" + e.Profile.Name + "`**, `kvmesh bench`'s default",
		fmt.Sprintf("default is %s blocks of %d tokens (%s tokens, also the engine's max", comma(e.GPUBlocks), e.BlockSize, comma(e.GPUBlocks*e.BlockSize)),
	} {
		if !strings.Contains(strings.Join(strings.Fields(para), " "), want) {
			t.Errorf("the Profiles paragraph does not say %q:\n%s", want, para)
		}
	}
	if e.MaxModelLen != e.GPUBlocks*e.BlockSize {
		t.Errorf("max model length %d, not the cache's %d tokens", e.MaxModelLen, e.GPUBlocks*e.BlockSize)
	}
}
