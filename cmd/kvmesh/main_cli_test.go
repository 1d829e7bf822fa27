package main

import (
	"bytes"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/kvmesh/kvmesh/ingress"
)

// Help asked for goes to stdout, `kvmesh help CMD` is CMD's help, an
// unknown command gets a suggestion, and `kvmesh version` answers.
func TestTopLevelHelpAndVersion(t *testing.T) {
	for _, c := range []struct {
		args             []string
		code             int
		stdout, stderr   string
		notOut, notError string
	}{
		{args: []string{"-h"}, stdout: "Usage: kvmesh <command>"},
		{args: []string{"help"}, stdout: "Usage: kvmesh <command>"},
		{args: nil, code: 2, stderr: "Usage: kvmesh <command>"},
		{args: []string{"help", "ingress"}, stdout: "Usage of kvmesh ingress:", notError: "Usage"},
		{args: []string{"help", "sidecar"}, stdout: "--engine-url", notError: "Usage"},
		{args: []string{"ingres"}, code: 2, stderr: `Did you mean "ingress"?`, notError: "Commands:"},
		{args: []string{"help", "sidecr"}, code: 2, stderr: `Did you mean "sidecar"?`},
		{args: []string{"zzzzzz"}, code: 2, stderr: "unknown command", notError: "Did you mean"},
		{args: []string{"version"}, stdout: "kvmesh "},
		{args: []string{"--version"}, stdout: "kvmesh "},
	} {
		var out, errOut bytes.Buffer
		code := run(c.args, &out, &errOut)
		if code != c.code || !strings.Contains(out.String(), c.stdout) || !strings.Contains(errOut.String(), c.stderr) ||
			c.notError != "" && strings.Contains(errOut.String(), c.notError) {
			t.Errorf("kvmesh %v: exit %d, stdout %q, stderr %q", c.args, code, out.String(), errOut.String())
		}
	}
}

// A flag mistake is one line naming it and pointing at -h, not the whole
// flag list (which buried the message, and printed every default).
func TestParseErrorIsOneLine(t *testing.T) {
	for _, args := range [][]string{{"ingress", "--lisen", ":1"}, {"ingress", "--max-body", "abc"}, {"epp", "--nope"}, {"keys", "--nope"}} {
		var out, errOut bytes.Buffer
		code := run(args, &out, &errOut)
		msg := errOut.String()
		if code != 2 || strings.Count(msg, "\n") != 1 || !strings.Contains(msg, "-h lists the flags") || strings.Contains(msg, "Usage of") {
			t.Errorf("kvmesh %v: exit %d, stderr %q", args, code, msg)
		}
	}
}

// Problems with several flags' defaults from the environment are listed in
// the same order on every run (by flag name), not in a map's order.
func TestEnvironmentProblemsInFlagOrder(t *testing.T) {
	var first string
	for i := range 20 {
		var p flagProblems
		for _, name := range []string{"zeta", "alpha", "mid", "beta", "omega"} {
			p.unlessGiven(name, fmt.Errorf("bad %s", name))
		}
		p.given("omega")
		err := p.err()
		if err == nil {
			t.Fatal("no error")
		}
		if i == 0 {
			first = err.Error()
			if !strings.Contains(first, "bad alpha (from the environment); bad beta (from the environment); bad mid (from the environment); bad zeta") || strings.Contains(first, "omega") {
				t.Fatalf("error %q: want alpha, beta, mid, zeta in that order, omega dropped (given)", first)
			}
		}
		if err.Error() != first {
			t.Fatalf("run %d: %q, run 0: %q", i, err, first)
		}
	}
}

// `kvmesh version` prints what the ingress's GET /version answers: one
// implementation, where two said "(devel)" and "dev" of one binary.
func TestVersionMatchesIngress(t *testing.T) {
	var out bytes.Buffer
	if code := run([]string{"version"}, &out, io.Discard); code != 0 || out.String() != "kvmesh "+ingress.BuildVersion()+"\n" {
		t.Fatalf("kvmesh version: exit %d, %q; the ingress says %q", code, out.String(), ingress.BuildVersion())
	}
}
