package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"net"
	"strings"
	"testing"
)

// A long-running command's fatal error is one JSON log line in JSON mode
// (their default) and the usual "kvmesh <cmd>: <err>" in text mode; a
// command without --log-format keeps the text.
func TestFatalErrorFollowsLogFormat(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	busy := ln.Addr().String()
	args := []string{"ingress", "--listen", busy, "--engine", "e1=m=http://127.0.0.1:1", "--log-level", "error"}

	for _, format := range []string{"", "json", "text"} {
		a := args
		if format != "" {
			a = append(append([]string{}, args...), "--log-format="+format)
		}
		var out, errOut bytes.Buffer
		if code := run(a, &out, &errOut); code != 1 {
			t.Fatalf("format %q: exit %d: %s", format, code, errOut.String())
		}
		lines := strings.Split(strings.TrimSpace(errOut.String()), "\n")
		last := lines[len(lines)-1]
		if format == "text" {
			if !strings.HasPrefix(last, "kvmesh ingress: ingress listen: ") {
				t.Fatalf("text: %q", errOut.String())
			}
			continue
		}
		for _, l := range lines {
			var m map[string]any
			if err := json.Unmarshal([]byte(l), &m); err != nil {
				t.Fatalf("format %q: not JSON: %q", format, l)
			}
		}
		var m struct{ Level, Msg, Err string }
		_ = json.Unmarshal([]byte(last), &m)
		if m.Level != "ERROR" || m.Msg != "kvmesh ingress exiting" || !strings.Contains(m.Err, "address already in use") {
			t.Fatalf("format %q: %q", format, last)
		}
	}
	var out, errOut bytes.Buffer
	if code := run([]string{"keys", "--no-such-flag"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "kvmesh keys: usage") {
		t.Fatalf("keys: exit %d: %q", code, errOut.String())
	}
	if got := argLogFormat([]string{"--log-format", "text", "-log-format=json", "--", "--log-format=text"}, "text"); got != "json" {
		t.Fatalf("argLogFormat: %q", got)
	}
}

// The sim logs text by default, so its fatal line is text too (it was
// JSON among text lines); --log-format json makes it JSON.
func TestFatalErrorSimDefaultText(t *testing.T) {
	for _, c := range []struct {
		args []string
		json bool
	}{{nil, false}, {[]string{"--log-format", "json"}, true}} {
		if got := argLogFormat(c.args, logFormatCommands["sim"]) == "json"; got != c.json {
			t.Errorf("sim %v: JSON %v, want %v", c.args, got, c.json)
		}
		var errOut bytes.Buffer
		fatal(&errOut, "sim", c.args, errors.New("boom"))
		var m map[string]any
		if isJSON := json.Unmarshal(errOut.Bytes(), &m) == nil; isJSON != c.json ||
			!c.json && errOut.String() != "kvmesh sim: boom\n" {
			t.Errorf("sim %v: fatal line %q", c.args, errOut.String())
		}
	}
}
