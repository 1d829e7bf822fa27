package main

import (
	"bytes"
	"strings"
	"testing"
)

// TestUsageExits: help asked of a command with targets exits 0 and names
// them; invalid values are usage errors (exit 2) naming what is wrong,
// before anything starts (a bad KV-event endpoint used to retry forever,
// a bad NATS stream setting exited 1).
func TestUsageExits(t *testing.T) {
	engine := []string{"sidecar", "--model", "m", "--engine-url", "http://127.0.0.1:1", "--admin", "127.0.0.1:0"}
	cases := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"inspect", "-h"}, 0, "kvmesh inspect stream"},
		{[]string{"inspect", "--help"}, 0, "kvmesh inspect events"},
		{[]string{"get", "-h"}, 0, "kvmesh get engines"},
		{[]string{"describe", "-h"}, 0, "kvmesh describe engine NAME"},
		{append(engine, "--events", "bogus"), 2, `"bogus" is not tcp://host:port`},
		{append(engine, "--events", "tcp://127.0.0.1:1", "--replay", "tcp://127.0.0.1:99999"), 2, "bad port"},
		{append(engine, "--events", "tcp://127.0.0.1:1", "--stream-max-age", "-1s"), 2, "stream max age -1s must be positive"},
		{append(engine, "--events", "tcp://127.0.0.1:1", "--stream-replicas", "0"), 2, "replicas"},
		{[]string{"sidecar", "--engine", "id=a,model=m,url=http://127.0.0.1:1,events=tcp://127.0.0.1:1", "--model", "m", "--admin", "127.0.0.1:0"}, 2, "--model is not read beside DaemonSet --engine specs"},
	}
	for _, tc := range cases {
		var out, errOut bytes.Buffer
		if code := run(tc.args, &out, &errOut); code != tc.code || !strings.Contains(errOut.String(), tc.want) {
			t.Errorf("kvmesh %s: exit %d, stderr %q; want exit %d naming %q", strings.Join(tc.args, " "), code, errOut.String(), tc.code, tc.want)
		}
	}
}
