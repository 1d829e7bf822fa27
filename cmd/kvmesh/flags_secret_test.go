package main

import (
	"flag"
	"strings"
	"testing"
)

// secretEnvFlag reads the environment and never shows it.
func TestSecretEnvFlag(t *testing.T) {
	t.Setenv("KVMESH_TEST_SECRET", "s3cret")
	fs := flag.NewFlagSet("t", flag.ContinueOnError)
	var help strings.Builder
	fs.SetOutput(&help)
	var dst string
	secretEnvFlag(fs, &dst, "key", "KVMESH_TEST_SECRET", "a key")
	fs.PrintDefaults()
	if dst != "s3cret" || strings.Contains(help.String(), "s3cret") || !strings.Contains(help.String(), "(env KVMESH_TEST_SECRET; set)") {
		t.Fatalf("dst %q, help %q", dst, help.String())
	}
}
