package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestLoadtestREADMELiveFlags: loadtest/README.md's "Live-only flags" are
// exactly the flags only `kvmesh bench --mode live` reads
// (benchFlagReaders), and its "In every mode" flags are read by every kind
// of run. It listed --quiet as live-only, when it also silences the DES's
// progress lines, and left out --no-stream.
func TestLoadtestREADMELiveFlags(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "loadtest", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	doc := string(b)
	bullets := func(after string) []string { // the flags the bullet list after a line names first
		i := strings.Index(doc, after)
		if i < 0 {
			t.Fatalf("loadtest/README.md has no %q", after)
		}
		rest := doc[i+len(after):]
		rest = strings.TrimLeft(rest[strings.Index(rest, "\n")+1:], "\n")
		var flags []string
		first := regexp.MustCompile("^- `--([a-z-]+)")
		for _, l := range strings.Split(rest, "\n") {
			if strings.TrimSpace(l) == "" {
				break
			}
			if m := first.FindStringSubmatch(l); m != nil {
				flags = append(flags, m[1])
			}
		}
		slices.Sort(flags)
		return flags
	}
	var liveOnly []string
	for f, r := range benchFlagReaders {
		if r == runLive {
			liveOnly = append(liveOnly, f)
		}
	}
	slices.Sort(liveOnly)
	if got := bullets("Live-only flags:"); !slices.Equal(got, liveOnly) {
		t.Errorf("loadtest/README.md's live-only flags are %v; the flags only live runs read are %v", got, liveOnly)
	}
	every := bullets("In every mode (des, live, `--roles`, `--autoscale`):")
	if !slices.Contains(every, "quiet") {
		t.Errorf("loadtest/README.md's every-mode flags %v lack --quiet", every)
	}
	for _, f := range every {
		if r, ok := benchFlagReaders[f]; ok {
			t.Errorf("--%s is documented as read in every mode, but only runs %b read it", f, r)
		}
	}
}
