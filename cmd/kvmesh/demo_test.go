package main

import (
	"bytes"
	"regexp"
	"strings"
	"testing"
)

// TestDemoHelpShowsFlagTypes: `kvmesh demo -h` shows each flag with its
// type, or with nothing for a boolean. The flag package takes a
// back-quoted word in a usage string as the value's name, which made
// --autoscale and --json read as flags that take a value.
func TestDemoHelpShowsFlagTypes(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"demo", "-h"}, &out, &errOut); code != 0 {
		t.Fatalf("exit %d: %s", code, errOut.String())
	}
	help := errOut.String() + out.String()
	line := regexp.MustCompile(`(?m)^  -([a-z0-9-]+)(?: ([^\t\n]+))?$`)
	types := map[string]bool{"string": true, "int": true, "int64": true, "uint": true, "uint64": true, "float": true, "duration": true, "value": true}
	seen := 0
	for _, m := range line.FindAllStringSubmatch(help, -1) {
		seen++
		if m[2] != "" && !types[m[2]] {
			t.Errorf("-%s shows the value name %q (a back-quoted word in its usage?)", m[1], m[2])
		}
	}
	if seen == 0 || !strings.Contains(help, "-autoscale\n") || !strings.Contains(help, "-json\n") {
		t.Fatalf("no flag lines, or -autoscale and -json not shown as booleans:\n%s", help)
	}
}
