package main

import (
	"bytes"
	"strings"
	"testing"
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
		{args: []string{"help", "ingress"}, stderr: "Usage of kvmesh ingress:", notError: "Usage: kvmesh <command>"},
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
